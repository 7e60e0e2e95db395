#!/usr/bin/env bash
# Issue 32, item 2, first step: do token-anchored maps keep recall across a
# switch? Closed-form kvl-small -> kvl-large translators (the recipe's stage 1:
# 256 chats of <= 512 tokens, relative depth, every source layer, split
# inputs) with anchor windows W, each measured by kvl eval-switch beside the
# committed (distilled, unanchored) translator.
#   experiments/token_anchors/run.sh WORK [ITEMS] [WINDOWS]
#     WORK/data from the house corpus (kvl make-data as scripts/train/train_house_models.sh);
#     defaults: 100 items per task, windows "0 1 2 4". KVL_SKIP_COMMITTED=1 skips
#     the committed translator's evaluation, KVL_ANCHOR_VARIANTS=0 the W=2 variants.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=${1:?usage: experiments/token_anchors/run.sh WORK [ITEMS] [WINDOWS]}
items=${2:-100}
windows=${3:-0 1 2 4}
here=experiments/token_anchors
out="$work/token_anchors"
mkdir -p "$out" "$here/results"
eval_switch() {  # name translator
  "$KVL" eval-switch --source models/kvl-small --target models/kvl-large --translator "$2" \
    --items "$items" --seed 32 --tails 0,32 --threads 2 --quiet \
    --json "$here/results/$1.json" 2>/dev/null > "$here/results/$1.md"
}
[ "${KVL_SKIP_COMMITTED:-0}" = 1 ] ||
  eval_switch committed models/translators/kvl-small__kvl-large.safetensors
for w in $windows; do
  t="$out/anchors_w$w.safetensors"
  /usr/bin/time -f "fit W=$w: %e s" "$KVL" fit --source models/kvl-small --target models/kvl-large \
    --data "$work/data/train.jsonl" --out "$t" --seq-len 512 --max-sequences 256 \
    --assignment relative_depth --band all --inputs split --anchor-window "$w" \
    --threads 2 --quiet > "$here/results/fit_w$w.txt"
  eval_switch "closed_form_w$w" "$t"
done
# Two variants of W=2: attention-weighted moments (KV-Lingo appendix O), and
# four times the fitting data (1024 chats).
if [ "${KVL_ANCHOR_VARIANTS:-1}" = 1 ]; then
  t="$out/anchors_w2_attention.safetensors"
  /usr/bin/time -f "fit W=2 attention: %e s" "$KVL" fit --source models/kvl-small \
    --target models/kvl-large --data "$work/data/train.jsonl" --out "$t" --seq-len 512 \
    --max-sequences 256 --assignment relative_depth --band all --inputs split \
    --anchor-window 2 --weighting attention --threads 2 --quiet > "$here/results/fit_w2_attention.txt"
  eval_switch closed_form_w2_attention "$t"
  t="$out/anchors_w2_1024.safetensors"
  /usr/bin/time -f "fit W=2 1024 chats: %e s" "$KVL" fit --source models/kvl-small \
    --target models/kvl-large --data "$work/data/train.jsonl" --out "$t" --seq-len 512 \
    --max-sequences 1024 --assignment relative_depth --band all --inputs split \
    --anchor-window 2 --threads 2 --quiet > "$here/results/fit_w2_1024.txt"
  eval_switch closed_form_w2_1024 "$t"
fi
