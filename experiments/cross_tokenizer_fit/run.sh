#!/usr/bin/env bash
# Issue 54, two questions about translators across tokenizers, on kvl-small
# (house tokenizer) <-> kvl-small-t2 (models/tokenizer-t2). Writes
# results.txt next to this script.
#   experiments/cross_tokenizer_fit/run.sh [BUILD_DIR]
# 1. Stage 1 with or without token anchors: `kvl fit` as
#    scripts/train/train_translators.sh runs it, --anchor-window 0 (the
#    paper's rule: each source token regressed onto its group's mean target
#    taps) and 8 (the target's tokens regressed, the source's taps resampled
#    onto them, plus the target's embeddings of tokens t..t-7), both
#    directions, then `kvl eval-translator` (perplexity part).
# 2. The groups that are not one token to one token: translated (the paper's
#    rule, what the server does) or prefilled by the target in place
#    (--prefill-uneven-groups), on the committed translators, both directions.
# No native tail anywhere: the translation alone is measured.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
KVL=$BUILD/tools/kvl
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The house data (scripts/train/train_house_models.sh's make-data).
"$KVL" make-data --out "$work/data" --seed 1 --train-conversations 40000 \
  --facts-distractors 3 --facts-filler 4 --kv-max-bytes 2000 --arith-steps 5 --list-len 8 \
  --string-len 10 > /dev/null
out=experiments/cross_tokenizer_fit/results.txt
pairs="kvl-small:kvl-small-t2 kvl-small-t2:kvl-small"
{
  echo "# command: experiments/cross_tokenizer_fit/run.sh ($(date -u '+%Y-%m-%d'), $(nproc) CPUs)"
  echo
  echo "# 1. closed form (stage 1) without and with token anchors"
  for pair in $pairs; do
    s=${pair%%:*}; t=${pair##*:}
    for w in 0 8; do
      "$KVL" fit --source "models/$s" --target "models/$t" --data "$work/data/train.jsonl" \
        --out "$work/${s}__${t}.w$w.safetensors" --seq-len 512 --max-sequences 256 \
        --assignment relative_depth --band all --inputs joint --anchor-window "$w" \
        --threads 2 --quiet > /dev/null
    done
    echo
    echo "## $s -> $t: anchor window 0, then 8"
    "$KVL" eval-translator --source "models/$s" --target "models/$t" \
      --translator "$work/${s}__${t}.w0.safetensors,$work/${s}__${t}.w8.safetensors" \
      --data "$work/data/test.jsonl" --threads 2 --quiet
  done
  echo
  echo "# 2. uneven groups translated or prefilled (committed translators)"
  for pair in $pairs; do
    s=${pair%%:*}; t=${pair##*:}
    for mode in translate prefill; do
      echo
      echo "## $s -> $t, uneven groups: $mode"
      flag=(); [ "$mode" = prefill ] && flag=(--prefill-uneven-groups)
      "$KVL" eval-translator --source "models/$s" --target "models/$t" \
        --translator "models/translators/${s}__${t}.safetensors" \
        --data "$work/data/test.jsonl" --threads 2 --quiet "${flag[@]}"
    done
  done
} > "$out"
echo "wrote $out" >&2
