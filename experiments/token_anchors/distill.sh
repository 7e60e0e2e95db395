#!/usr/bin/env bash
# Does distillation add to token anchors? The W-anchored closed form of run.sh
# distilled for STEPS steps as the recipe's stage 2 starts (windows anywhere,
# lr 1e-3, bf16), then measured by kvl eval-switch.
#   experiments/token_anchors/distill.sh WORK [W] [STEPS] [ITEMS]   # defaults: 8, 600, 100
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=${1:?usage: experiments/token_anchors/distill.sh WORK [W] [STEPS] [ITEMS]}
w=${2:-8}
steps=${3:-600}
items=${4:-100}
here=experiments/token_anchors
init="$work/token_anchors/anchors_w$w.safetensors"
out="$work/token_anchors/anchors_w${w}_distilled_$steps.safetensors"
/usr/bin/time -f "distill W=$w $steps steps: %e s" "$KVL" distill --source models/kvl-small \
  --target models/kvl-large --init "$init" --data "$work/data/train.jsonl" \
  --valid "$work/data/valid.jsonl" --out "$out" --steps "$steps" --lr 1e-3 --eval-every 100 \
  --bf16 --threads 2 --quiet --no-plot > "$here/results/distill_w${w}_$steps.txt"
"$KVL" eval-switch --source models/kvl-small --target models/kvl-large --translator "$out" \
  --items "$items" --seed 32 --tails 0,32 --threads 2 --quiet \
  --json "$here/results/distilled_w${w}_$steps.json" 2>/dev/null \
  > "$here/results/distilled_w${w}_$steps.md"
