#!/usr/bin/env bash
# The whole-continuation gap of each k (issue 55): KL(target on its native
# cache || target on the hybrid cache) per continuation position, 64 windows
# of 255 + 64 tokens of the valid split, for the closed-form residual map of
# every layer J = L-k (kvl distill-residual --steps 0: the plain translation's
# KL and the map's, no training).
#   experiments/native_depth/gap.sh WORK SOURCE:TARGET "J J ..."
# Writes results/gap_<s>__<t>.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:?usage: gap.sh WORK SOURCE:TARGET "J J ..."}
d=${2:?}; js=${3:?}
s=${d%%:*}; t=${d##*:}
KVL=${KVL_BIN:-build/tools/kvl}
R=experiments/native_depth/results
out="$R/gap_${s}__${t}.txt"
: > "$out"
for j in $js; do
  "$KVL" distill-residual --translator "$WORK/${s}__${t}.residual.safetensors" \
    --source "models/$s" --target "models/$t" --train "$WORK/data/train.jsonl" \
    --valid "$WORK/data/valid.jsonl" --layer "$j" --steps 0 --valid-windows 64 --threads 2 \
    --quiet --out "$WORK/gap.tmp.safetensors" | head -1 >> "$out"
done
rm -f "$WORK/gap.tmp.safetensors"
cat "$out"
