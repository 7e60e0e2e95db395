#!/usr/bin/env bash
# Residual maps for the native-depth dial (issue 55): the house corpus's
# knobs, then kvl fit-residual on every house direction's committed
# translator (256 training chats of up to 512 tokens, every source layer,
# the translator's token anchors), a map for every target layer 1..L-1.
#   experiments/native_depth/fit.sh WORK [DIRECTIONS]
# DIRECTIONS: "s:t s:t ..." (default: all four house directions).
# Writes WORK/<s>__<t>.residual.safetensors and results/fit_<s>__<t>.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:?usage: fit.sh WORK [DIRECTIONS]}
DIRECTIONS=${2:-"kvl-small:kvl-large kvl-large:kvl-small kvl-small:kvl-small-b kvl-small-b:kvl-small"}
KVL=${KVL_BIN:-build/tools/kvl}
R=experiments/native_depth/results
mkdir -p "$WORK" "$R"
if [ ! -f "$WORK/data/manifest.json" ]; then
  # scripts/train/train_house_models.sh's knobs; the first chats of its split.
  "$KVL" make-data --out "$WORK/data" --seed 1 --train-conversations 2000 \
    --facts-distractors 3 --facts-filler 4 --kv-max-bytes 2000 --arith-steps 5 --list-len 8 \
    --string-len 10 > /dev/null
fi
for d in $DIRECTIONS; do
  s=${d%%:*}; t=${d##*:}
  start=$(date +%s)
  "$KVL" fit-residual --translator "models/translators/${s}__${t}.safetensors" \
    --source "models/$s" --target "models/$t" --data "$WORK/data/train.jsonl" \
    --out "$WORK/${s}__${t}.residual.safetensors" --seq-len 512 --max-sequences 256 \
    --threads 2 --quiet | tee "$R/fit_${s}__${t}.txt"
  echo "wall seconds: $(( $(date +%s) - start ))" | tee -a "$R/fit_${s}__${t}.txt"
done
