#!/usr/bin/env bash
# Does a first curriculum stage of retrieval drills (scripts/train/retrieval_drills.py)
# teach kvl-small's shape to copy from its context? Trains NAME for STEPS steps
# on 100k drill conversations (extra arguments go to kvl train-lm, e.g.
# --lr 1e-2 or --batch 32 --seq-len 128), then prints
#   - log-perplexity of "Repeat after me: X" conversations whose answer is X
#     (rep) or another run of words of the same length (fresh), X drawn from a
#     16-word pool and from every corpus word: a model that copies pays far
#     less for a repeated answer;
#   - greedy accuracy on 100 held-out drills (kvl eval).
#   experiments/retrieval_drills_stage/drill_probe.sh WORK NAME STEPS [train-lm args...]   # WORK holds data/train.txt
# KVL_DRILL_CONFIG picks the model shape (default models/configs/kvl-small.json).
# Output: WORK/drills/NAME/probe.txt (experiments/retrieval_drills_stage/drill_probe.txt collects runs).
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
THREADS=${KVL_TRAIN_THREADS:-2}
work=$1 name=$2 steps=$3; shift 3
d="$work/drills"
mkdir -p "$d/$name"
scripts/train/make_drills.sh "$work"
# A finished model (e.g. a curriculum stage linked in as $d/NAME/model) is
# only probed.
grep -qs '"finished": true' "$d/$name/model/summary.json" ||
"$KVL" train-lm --config "${KVL_DRILL_CONFIG:-models/configs/kvl-small.json}" --tokenizer models/tokenizer \
  --train "$d/train.txt" --valid "$d/valid.txt" --out "$d/$name/model" --seed 1 --steps "$steps" \
  --warmup 50 --bf16 --threads "$THREADS" --eval-every 200 --no-plot --quiet "$@" \
  > "$d/$name/train.log" 2>&1
nll() {
  "$KVL" eval --model "$d/$name/model" --text "$1" --threads "$THREADS" --quiet | tail -1 |
    /usr/bin/python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["perplexity"]["nats_per_token"])'
}
{
  echo "# experiments/retrieval_drills_stage/drill_probe.sh $work $name $steps $*"
  printf '%-6s %9s %9s %7s\n' pool rep fresh gain
  for pool in 16 all; do
    r=$(nll "$d/copy_${pool}_rep.txt"); f=$(nll "$d/copy_${pool}_fresh.txt")
    printf '%-6s %9s %9s %7.4f\n' "$pool" "$r" "$f" "$(echo "$f - $r" | bc -l)"
  done
  "$KVL" eval --model "$d/$name/model" --suite "$d/test.jsonl" --limit 100 --threads "$THREADS" \
    --quiet | head -5
} | tee "$d/$name/probe.txt"
