#!/usr/bin/env bash
# Fits (closed form), distills and evaluates the committed KV-cache translators
# between the house models, in both directions of each pair:
#   kvl-small <-> kvl-large     (cross-layer, shape-changing)
#   kvl-small <-> kvl-small-b   (shape-preserving, independent seeds)
# Needs the house models (scripts/train_house_models.sh) and its corpus in
# $KVL_HOUSE_WORK/data. Writes models/translators/<source>__<target>.safetensors
# (distilled, what the server loads) and <source>__<target>.closed-form.safetensors,
# the training logs and curves next to them, and per direction the evaluation
# JSON under docs/results/translators/; scripts/translator_report.py turns those
# into docs/results/translators.md. Each step's wall time goes to
# $KVL_HOUSE_WORK/translator_times.tsv.
#   scripts/train_translators.sh
#   KVL_TRANSLATOR_PAIRS="kvl-small:kvl-large" scripts/train_translators.sh  # one direction
# Environment: KVL_SKIP_SETUP=1 skips scripts/setup.sh; KVL_TRAIN_THREADS
# (default 1); KVL_DISTILL_STEPS (default: 2400 for kvl-small -> kvl-large,
# 900 for the other directions), KVL_DISTILL_LR (default 3e-3);
# KVL_SKIP_EVAL=1 (fit and distill only); KVL_ONLY_EVAL=1 (evaluate the
# translators already there).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${KVL_SKIP_SETUP:-0}" = 1 ] || scripts/setup.sh

KVL=${KVL_BIN:-build/tools/kvl}
WORK=${KVL_HOUSE_WORK:-build/house}
THREADS=${KVL_TRAIN_THREADS:-1}
LR=${KVL_DISTILL_LR:-3e-3}
OUT=models/translators
RESULTS=docs/results/translators
mkdir -p "$OUT" "$RESULTS"
TIMES="$WORK/translator_times.tsv"
touch "$TIMES"

source scripts/timed.sh

PAIRS=${KVL_TRANSLATOR_PAIRS:-kvl-small:kvl-large kvl-large:kvl-small kvl-small:kvl-small-b kvl-small-b:kvl-small}
for pair in $PAIRS; do
  [ "${KVL_ONLY_EVAL:-0}" = 1 ] && break
  s=${pair%%:*}; t=${pair##*:}
  base="$OUT/${s}__${t}"
  # Stage 1: closed-form ridge fit on 256 training chats of up to 512 tokens.
  # Cross-layer pairs read two source layers per target layer, picked by
  # greedy match (docs/results/assignments.txt: band 2 raises the mean R² by
  # 0.05-0.10); the shape-preserving pair maps layer to layer.
  assign=()
  case "$s:$t" in
    kvl-small:kvl-large|kvl-large:kvl-small) assign=(--assignment greedy --band 2) ;;
  esac
  timed "fit $s->$t" "$KVL" fit --source "models/$s" --target "models/$t" \
    --data "$WORK/data/train.jsonl" --out "$base.closed-form.safetensors" \
    --seq-len 512 --max-sequences 256 "${assign[@]}" --threads "$THREADS" --quiet
  # Stage 2: self-distillation from the closed-form maps. Every direction's
  # validation KL was still falling after 900 steps; small->large, the one
  # that missed the 85% recovery target there, trains 2400 (about 47 min with
  # 2 threads). The others stay at 900 until they are rerun longer
  # (docs/translators.md).
  case "$s:$t" in
    kvl-small:kvl-large) steps=${KVL_DISTILL_STEPS:-2400} ;;
    *) steps=${KVL_DISTILL_STEPS:-900} ;;
  esac
  timed "distill $s->$t" "$KVL" distill --source "models/$s" --target "models/$t" \
    --init "$base.closed-form.safetensors" --data "$WORK/data/train.jsonl" \
    --valid "$WORK/data/valid.jsonl" --out "$base.safetensors" --steps "$steps" \
    --lr "$LR" --eval-every 100 --threads "$THREADS" --quiet
done

[ "${KVL_SKIP_EVAL:-0}" = 1 ] && exit 0
SUITES=$(for k in facts kv arith lists strings; do printf '%s,' "$WORK/data/suites/test_$k.jsonl"; done)
for pair in $PAIRS; do
  s=${pair%%:*}; t=${pair##*:}
  base="$OUT/${s}__${t}"
  multi=()
  [ -f "$OUT/${t}__${s}.safetensors" ] && multi=(--multi-turn "$base.safetensors,$OUT/${t}__${s}.safetensors")
  timed "eval $s->$t" "$KVL" eval-translator --source "models/$s" --target "models/$t" \
    --translator "$base.closed-form.safetensors,$base.safetensors" \
    --data "$WORK/data/test.jsonl" --suites "${SUITES%,}" "${multi[@]}" \
    --threads "$THREADS" --quiet --json "$RESULTS/${s}__${t}.json"
done
echo "step times (seconds) in $TIMES:"; cat "$TIMES"
