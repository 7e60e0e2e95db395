#!/usr/bin/env bash
# Retrains the house models from scratch: corpus, tokenizer, kvl-small,
# kvl-small-b (kvl-small's shape, another seed) and kvl-large, then evaluates
# each on the test split. Writes models/<name>/ (weights, card, eval) and
# docs/results/house_models.{md,json}. Intermediate data goes to $KVL_HOUSE_WORK
# (default build/house). Each step's wall time is logged and put in the cards.
#   scripts/train_house_models.sh            # everything
#   KVL_HOUSE_ONLY="kvl-large" scripts/train_house_models.sh   # one model (+ eval)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${KVL_SKIP_SETUP:-0}" = 1 ] || scripts/setup.sh
KVL=${KVL_BIN:-build/tools/kvl}
WORK=${KVL_HOUSE_WORK:-build/house}
THREADS=${KVL_TRAIN_THREADS:-1}
mkdir -p "$WORK" models docs/results
TIMES="$WORK/times.tsv"
touch "$TIMES"

source scripts/timed.sh

if [ ! -f "$WORK/data/manifest.json" ]; then
  timed make-data "$KVL" make-data --out "$WORK/data" --seed 1 --train-conversations 40000 \
    --facts-distractors 3 --facts-filler 4 --kv-max-bytes 2000 --arith-steps 5 --list-len 8 \
    --string-len 10
fi
# Deterministic: the same corpus gives a byte-identical tokenizer.json.
timed train-tokenizer "$KVL" train-tokenizer --input "$WORK/data/train.txt" \
  --out models/tokenizer --vocab-size 4096 --eval "$WORK/data/valid.txt"

train() {  # train NAME CONFIG SEED STEPS LR BATCH SEQ_LEN
  local name=$1 config=$2 seed=$3 steps=$4 lr=$5 batch=$6 seq_len=$7
  timed "train-lm $name" "$KVL" train-lm --config "$config" --tokenizer models/tokenizer \
    --train "$WORK/data/train.txt" --valid "$WORK/data/valid.txt" --out "models/$name" \
    --seed "$seed" --steps "$steps" --batch "$batch" --seq-len "$seq_len" --lr "$lr" --warmup 50 \
    --bf16 --threads "$THREADS" --checkpoint-every 200 --save-dtype bfloat16 \
    $( [ -d "models/$name/train_state" ] && echo --resume )
  timed "eval $name" "$KVL" eval --model "models/$name" \
    $(for t in facts kv arith lists strings; do echo --suite "$WORK/data/suites/test_$t.jsonl"; done) \
    --text "$WORK/data/test.txt" --threads "$THREADS" --json "models/$name/eval_test.json"
}

ONLY=${KVL_HOUSE_ONLY:-kvl-small kvl-small-b kvl-large}
for name in $ONLY; do
  case $name in
    kvl-small)   train kvl-small   models/configs/kvl-small.json 1 1600 3e-3 8 512 ;;
    kvl-small-b) train kvl-small-b models/configs/kvl-small.json 2 1600 3e-3 8 512 ;;
    kvl-large)   train kvl-large   models/configs/kvl-large.json 3 1000 2e-3 8 512 ;;
    *) echo "unknown model $name" >&2; exit 2 ;;
  esac
done
echo "step times (seconds) in $TIMES:"; cat "$TIMES"

# Cards, the results table and the in-context copying probe, once all three exist.
if [ -f models/kvl-small/eval_test.json ] && [ -f models/kvl-small-b/eval_test.json ] &&
   [ -f models/kvl-large/eval_test.json ]; then
  /usr/bin/python3 scripts/house_report.py "$WORK"
  scripts/induction_probe.sh "$WORK" models/kvl-small models/kvl-small-b models/kvl-large |
    tee docs/results/induction_probe.txt
fi
