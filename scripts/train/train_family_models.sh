#!/usr/bin/env bash
# Trains the house models of other architectures (issue 52, item 6) on the
# house corpus and tokenizer: kvl-gemma (Gemma-3's architecture: sliding and
# global layers, head_dim apart from the width, (1 + w) norms, GELU-tanh) and
# kvl-moe (Qwen3-MoE: 8 experts, 2 per token, trained with a load-balancing
# loss of weight 0.01). Their configurations are in
# models/configs/. A shorter curriculum than the Qwen3 house models'
# (scripts/train/train_house_models.sh): one round of drills, the task mix,
# then the task mix with the level-1-2 kv conversations (assistant tokens
# weighted 10x), in float32 (bf16 autocast is ~14x slower per step on a CPU
# without AVX-512's bf16 matrix products). Writes models/<name>/ and
# docs/results/training/<name>/ as train_house_models.sh does; the corpus and
# drills come from $KVL_HOUSE_WORK (made by that script's first steps, which
# this one runs when they are missing).
#   scripts/train/train_family_models.sh                       # both
#   KVL_HOUSE_ONLY=kvl-moe scripts/train/train_family_models.sh  # one
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "${KVL_SKIP_SETUP:-0}" = 1 ] || scripts/setup.sh
KVL=${KVL_BIN:-build/tools/kvl}
WORK=${KVL_HOUSE_WORK:-build/house}
THREADS=${KVL_TRAIN_THREADS:-1}
mkdir -p "$WORK" models docs/results/training
TIMES="$WORK/times.tsv"
touch "$TIMES"
source scripts/train/timed.sh
source scripts/train/house_stage.sh

if [ ! -f "$WORK/data/manifest.json" ]; then
  timed make-data "$KVL" make-data --out "$WORK/data" --seed 1 --train-conversations 40000 \
    --facts-distractors 3 --facts-filler 4 --kv-max-bytes 2000 --arith-steps 5 --list-len 8 \
    --string-len 10
fi
scripts/train/make_drills.sh "$WORK"
scripts/train/make_kv_corpora.sh "$WORK"

train() {  # train NAME SEED DRILL_STEPS TASK_STEPS MIX_STEPS [ROUTER_AUX_LOSS]
  local name=$1 seed=$2 drill_steps=$3 task_steps=$4 mix_steps=$5
  export ROUTER_AUX_LOSS=${6:-}
  local config="models/configs/$name.json" c="$WORK/curriculum/$name"
  export BF16=0
  stage "$name" drills1 "$config" "$seed" "$drill_steps" 3e-3 "$WORK/drills/train.txt" \
    "$WORK/drills/valid.txt" "$c/drills1"
  stage "$name" tasks "$config" "$seed" "$task_steps" 3e-3 "$WORK/data/train.txt" \
    "$WORK/data/valid.txt" "$c/tasks" "$c/drills1"
  ASSISTANT_WEIGHT=10 SAVE_DTYPE=bfloat16 stage "$name" mix "$config" 24 "$mix_steps" 3e-3 \
    "$WORK/kvextra/tasks+kv12.txt" "$WORK/data/valid.txt" "$c/mix" "$c/tasks"
  publish_model "$name" "$c/mix" "$c/drills1" "$c/tasks"
}

for name in ${KVL_HOUSE_ONLY:-kvl-gemma kvl-moe}; do
  case $name in
    kvl-gemma) train kvl-gemma 4 1200 600 600 ;;
    kvl-moe)   train kvl-moe   5 1200 600 600 0.01 ;;
    *) echo "unknown model $name" >&2; exit 2 ;;
  esac
done
echo "step times (seconds) in $TIMES:"; cat "$TIMES"
