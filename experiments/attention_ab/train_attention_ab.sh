#!/usr/bin/env bash
# Whole kvl train-lm steps with the grouped attention against the eager one,
# alternating in one sitting: does bench/train_step_bench's gain (forward,
# loss and backward alone) show in a full step (batching, loss weighting,
# clipping and the AdamW update included)? Each run trains MODEL's config from
# a random initialisation for STEPS steps as scripts/train/house_stage.sh does
# (batch 8 x 512, bf16 autocast, --threads THREADS, no validation) on
# WORK/data/train.txt; the first 5 steps are dropped as warm-up.
#   experiments/attention_ab/train_attention_ab.sh WORK [MODEL] [STEPS] [ROUNDS] [WEIGHT]
#     defaults: kvl-large, 40 steps, 2 rounds, assistant weight 1 (10: the kv stages');
#     KVL_TRAIN_THREADS (default 2) sets --threads. Each round runs grouped, then eager.
# Output: per run the median and mean step time; the table goes to stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
PY=${KVL_PYTHON:-/usr/bin/python3}
work=${1:?usage: experiments/attention_ab/train_attention_ab.sh WORK [MODEL] [STEPS] [ROUNDS] [WEIGHT]}
model=${2:-kvl-large}
steps=${3:-40}
rounds=${4:-2}
weight=${5:-1}
threads=${KVL_TRAIN_THREADS:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "# experiments/attention_ab/train_attention_ab.sh $work $model $steps $rounds $weight ($(date -u '+%Y-%m-%d %H:%M UTC'), --threads $threads)"
echo
echo "| round | attention | median step s | mean step s | tokens/s (median) |"
echo "|---|---|---|---|---|"
for round in $(seq 1 "$rounds"); do
  for attention in grouped eager; do
    run="$out/$attention.$round"
    "$KVL" train-lm --config "models/configs/$model.json" --tokenizer models/tokenizer \
      --train "$work/data/train.txt" --out "$run" --seed 0 --steps "$steps" --batch 8 \
      --seq-len 512 --warmup 50 --bf16 --threads "$threads" --eval-every 0 \
      --assistant-weight "$weight" --attention "$attention" --no-plot --quiet > /dev/null
    "$PY" - "$run/train_log.jsonl" "$round" "$attention" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][5:]
step_s = [8 * 512 / r["tokens_per_s"] for r in rows]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {statistics.median(step_s):.3f} | "
      f"{statistics.mean(step_s):.3f} | {statistics.median(r['tokens_per_s'] for r in rows):.0f} |")
PY
  done
done
echo
echo "machine: $(nproc) CPUs; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
