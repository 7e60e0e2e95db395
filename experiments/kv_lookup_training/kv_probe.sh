#!/usr/bin/env bash
# How the house models learned the kv task (docs/data.md), which every model
# answered at chance after the task stage: fine-tunes the task stage's weights
# (WORK/curriculum/MODEL/tasks, scripts/train/train_house_models.sh) for 1500 steps
# per run on one of the corpora of scripts/train/make_kv_corpora.sh (WORK/kvextra/):
#   kv        24,133 extra kv conversations, levels 1-3
#   kv1       the 8,067 of them at level 1 (conversations of at most ~360 tokens)
#   tasks     the task corpus (WORK/data/train.txt), as the house recipe's task stage
#   tasks+kv  the task corpus with all the extra kv conversations appended
#   tasks+kv12, tasks+kv1: ... with those at levels 1-2 (16,082), at level 1
# Each run is a stage of the recipe (scripts/train/house_stage.sh) at the task
# stage's lr, with ASSISTANT_WEIGHT W (the loss weight of assistant-written
# tokens; 1 is the task stage's). Then `kvl eval` on the test split's five
# suites and test.txt, and the kv items answered by kind and level
# (experiments/kv_lookup_training/kv_breakdown.py). l1aw10 then l1_then_kv12 are the recipe's kvdocs
# and mix stages (same corpora, seeds and settings; the recipe exports mix in
# bf16).
#   experiments/kv_lookup_training/kv_probe.sh WORK [RUN ...]     (default: every run below, in order)
# KVL_KV_MODEL: kvl-small (default), kvl-small-b or kvl-large; KVL_TRAIN_THREADS:
# threads (default 2). Finished runs are not retrained (a finished run trained
# with another lr, weight, seed or start is an error: remove its folder), an
# interrupted one resumes. Output: WORK/kvprobe/MODEL/NAME/ per run,
# WORK/kvprobe/MODEL/probe.txt (the table); experiments/kv_lookup_training/kv_probe.txt collects
# runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
THREADS=${KVL_TRAIN_THREADS:-2}
MODEL=${KVL_KV_MODEL:-kvl-small}
case $MODEL in
  kvl-small|kvl-small-b) CONFIG=models/configs/kvl-small.json LR=3e-3 ;;
  kvl-large) CONFIG=models/configs/kvl-large.json LR=2e-3 ;;
  *) echo "unknown model $MODEL" >&2; exit 2 ;;
esac
[ $# -ge 1 ] || { sed -n '2,/^set /p' "$0" | grep '^#'; exit 2; }
work=$1; shift
FROM="$work/curriculum/$MODEL/tasks"
grep -qs '"finished": true' "$FROM/summary.json" ||
  { echo "$FROM: no finished task stage (scripts/train/train_house_models.sh)" >&2; exit 1; }
d="$work/kvprobe"
r="$d/$MODEL"  # the runs
mkdir -p "$r"
TIMES="$r/times.tsv"
source scripts/train/timed.sh
source scripts/train/house_stage.sh

# The runs: NAME INIT (a run's name or "from") CORPUS WEIGHT SEED.
RUNS="kvonly from kv 1 21
mix from tasks+kv 1 21
l1aw10 from kv1 10 22
base_aw10 from tasks 10 23
mix_aw10 from tasks+kv 10 23
l1_then_mix l1aw10 tasks+kv 10 24
l1_then_base l1aw10 tasks 10 24
l1_then_kv12 l1aw10 tasks+kv12 10 24
l1_then_kv1 l1aw10 tasks+kv1 10 24"

for name in "$@"; do
  cut -d" " -f1 <<< "$RUNS" | grep -qx "$name" || { echo "unknown run $name" >&2; exit 2; }
done

scripts/train/make_kv_corpora.sh "$work"

corpus() { [ "$1" = tasks ] && echo "$work/data/train.txt" || echo "$work/kvextra/$1.txt"; }
run() {  # run NAME INIT CORPUS WEIGHT SEED
  local out="$r/$1" init=$FROM
  [ "$2" = from ] || init="$r/$2"
  grep -qs '"finished": true' "$init/summary.json" || [ "$2" = from ] ||
    { echo "run $1 needs run $2 first" >&2; exit 1; }
  if grep -qs '"finished": true' "$out/summary.json"; then
    /usr/bin/python3 - "$out/summary.json" "$init/model.safetensors" "$LR" "$4" "$5" <<'PY' || exit 1
import hashlib, json, sys
run = json.load(open(sys.argv[1]))["run"]
sha = hashlib.sha256(open(sys.argv[2], "rb").read()).hexdigest()
want = {"lr": float(sys.argv[3]), "assistant_weight": float(sys.argv[4]), "seed": int(sys.argv[5]),
        "init_from_sha256": sha}
bad = [f"{k} {run.get(k)} (now {v})" for k, v in want.items() if run.get(k) != v]
if bad:
    sys.exit(f"{sys.argv[1]}: trained with other settings: " + ", ".join(bad))
PY
  else
    ASSISTANT_WEIGHT=$4 stage "$MODEL" "$1" "$CONFIG" "$5" 1500 "$LR" "$(corpus "$3")" \
      "$work/data/valid.txt" "$out" "$init" > "$out.log" 2>&1
  fi
  evaluate "$out" "$out/eval_all.json"
}
evaluate() {  # evaluate MODEL JSON: the five test suites and test.txt, once
  [ -f "$2" ] && return
  "$KVL" eval --model "$1" $(for t in facts kv arith lists strings; do
    echo --suite "$work/data/suites/test_$t.jsonl"; done) --text "$work/data/test.txt" \
    --threads "$THREADS" --json "$2.tmp" --quiet > /dev/null
  mv "$2.tmp" "$2"
}
selected=("$@")
while read -r name init corpus weight seed; do
  if [ ${#selected[@]} -eq 0 ] || printf '%s\n' "${selected[@]}" | grep -qx "$name"; then
    run "$name" "$init" "$corpus" "$weight" "$seed"
  fi
done <<< "$RUNS"

# The table: FROM itself, then every run evaluated so far.
evaluate "$FROM" "$r/from.eval_all.json"
{
  echo "# KVL_TRAIN_THREADS=$THREADS KVL_KV_MODEL=$MODEL experiments/kv_lookup_training/kv_probe.sh $work${*:+ $*} (lr $LR, from $FROM)"
  echo "| run | init | corpus | assistant weight | nats/token | facts | kv | arith | lists | strings |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  rows=$(echo "from - - -"; echo "$RUNS")
  while read -r name init corpus weight seed; do
    [ "$name" = from ] && json="$r/from.eval_all.json" || json="$r/$name/eval_all.json"
    [ -f "$json" ] || continue
    /usr/bin/python3 - "$json" "$name" "$init" "$corpus" "$weight" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
accuracy = [f"{e['tasks'][t]['accuracy']:.3f}" for t in ("facts", "kv", "arith", "lists", "strings")]
print("| " + " | ".join(sys.argv[2:6] + [f"{e['perplexity']['nats_per_token']:.4f}"] + accuracy) + " |")
PY
  done <<< "$rows"
  while read -r name _; do
    [ "$name" = from ] && json="$r/from.eval_all.json" || json="$r/$name/eval_all.json"
    [ -f "$json" ] || continue
    /usr/bin/python3 experiments/kv_lookup_training/kv_breakdown.py "$work/data/suites/test_kv.jsonl" "$json" "$name"
  done <<< "$rows"
} | tee "$r/probe.txt"
