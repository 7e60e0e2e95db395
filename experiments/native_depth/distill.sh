#!/usr/bin/env bash
# One distillation of a residual map (issue 55's time-box: the closed form,
# then one distillation): kvl distill-residual on the map of target layer J
# that fit.sh wrote, windows of 255 + 64 tokens anywhere in the training
# chats, batch 4, peak lr LR (default 1e-3), validation on 32 windows of the
# valid split.
#   experiments/native_depth/distill.sh WORK SOURCE:TARGET J [STEPS] [LR]
# Writes WORK/<s>__<t>.residual-distilled-j<J>-lr<LR>.safetensors and
# results/distill_<s>__<t>_j<J>_lr<LR>.{txt,json}.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:?usage: distill.sh WORK SOURCE:TARGET J [STEPS]}
d=${2:?}; j=${3:?}; steps=${4:-300}; lr=${5:-1e-3}
s=${d%%:*}; t=${d##*:}
KVL=${KVL_BIN:-build/tools/kvl}
R=experiments/native_depth/results
mkdir -p "$R"
start=$(date +%s)
"$KVL" distill-residual --translator "$WORK/${s}__${t}.residual.safetensors" \
  --source "models/$s" --target "models/$t" --train "$WORK/data/train.jsonl" \
  --valid "$WORK/data/valid.jsonl" --layer "$j" --steps "$steps" --lr "$lr" --batch 4 \
  --eval-every 50 --valid-windows 32 --threads 2 --quiet \
  --out "$WORK/${s}__${t}.residual-distilled-j${j}-lr${lr}.safetensors" \
  --json "$R/distill_${s}__${t}_j${j}_lr${lr}.json" | tee "$R/distill_${s}__${t}_j${j}_lr${lr}.txt"
echo "wall seconds: $(( $(date +%s) - start ))" | tee -a "$R/distill_${s}__${t}_j${j}_lr${lr}.txt"
