#!/usr/bin/env bash
# Can a drill round of record lookups teach a trained house model the kv task
# (multi-token keys such as key-7g7g, docs/data.md), which every committed model
# answers at chance? From the weights of FROM (a model directory):
#   1. DRILL_STEPS steps on 40k drills, half of them record documents
#      (scripts/train/retrieval_drills.py kinds records,records,copy,recall), lr 3e-3;
#   2. TASK_STEPS steps of the task corpus from those weights (the house
#      recipe's task stage: lr 3e-3, warm-up 50, windows at conversation starts);
#      with KVL_RECORDS_IN_TASKS=1 the task corpus has the first 20k drills of
#      step 1's file appended (the model then goes to WORK/drills/NAME-mix);
# then prints greedy accuracy on 300 held-out record drills, by number of
# records in the document, for FROM and after step 1, and after step 2 the
# test split's five suites, the record drills and log-perplexity (kvl eval),
# the same evaluation as docs/results/house_models.md; for each model, the kv
# suite's items answered by kind (forward lookups of words or numbers,
# reverse lookups) and level. DRILL_STEPS 0 is the control: no drill round,
# the task stage starts from FROM.
#   experiments/record_drills/records_probe.sh WORK FROM NAME DRILL_STEPS TASK_STEPS
# WORK holds data/ (kvl make-data) as for scripts/train/train_house_models.sh.
# KVL_DRILL_CONFIG: the model shape (default models/configs/kvl-small.json);
# KVL_TRAIN_THREADS: threads (default 2). Finished stages are not retrained.
# Output: WORK/drills/NAME-tasks/probe.txt (NAME-mix/ with KVL_RECORDS_IN_TASKS=1;
# experiments/record_drills/records_probe.txt collects runs).
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
THREADS=${KVL_TRAIN_THREADS:-2}
[ $# -eq 5 ] || { sed -n '2,/^set /p' "$0" | grep '^#'; exit 2; }
work=$1 from=$2 name=$3 drill_steps=$4 task_steps=$5
d="$work/drills"
mkdir -p "$d"
drills() {  # drills OUT N SEED KINDS
  [ -f "$d/$1" ] || /usr/bin/python3 scripts/train/retrieval_drills.py "$work/data/train.txt" "$d/$1" "${@:2}"
}
drills records_mix.txt 40000 6 records,records,copy,recall
drills records_valid.txt 500 7 records,records,copy,recall
drills records_test.jsonl 300 8 records
train() {  # train OUT INIT TRAIN VALID STEPS EVAL_EVERY SEED
  grep -qs '"finished": true' "$1/summary.json" && return 0
  local resume=()
  if [ -f "$1/train_state/state.json" ]; then resume=(--resume); fi
  "$KVL" train-lm --config "${KVL_DRILL_CONFIG:-models/configs/kvl-small.json}" \
    --tokenizer models/tokenizer --train "$3" --valid "$4" --init-from "$2" --out "$1" \
    --seed "$7" --steps "$5" --batch 8 --seq-len 512 --lr 3e-3 --warmup 50 --bf16 --threads "$THREADS" \
    --eval-every "$6" --checkpoint-every 250 --no-plot --quiet ${resume[@]+"${resume[@]}"} > "$1.log" 2>&1
}
tasks="$d/$name-tasks" corpus="$work/data/train.txt"
if [ "${KVL_RECORDS_IN_TASKS:-0}" = 1 ]; then
  tasks="$d/$name-mix" corpus="$d/tasks_plus_records.txt"
  [ -f "$corpus" ] || /usr/bin/python3 - "$work/data/train.txt" "$d/records_mix.txt" "$corpus" <<'PY'
import sys
# Each drill ends with "<|im_end|>\n\n" (a record drill's text may hold a
# blank line of its own).
end = "<|im_end|>\n\n"
drills = open(sys.argv[2], encoding="utf-8").read().split(end)[:20000]
body = open(sys.argv[1], encoding="utf-8").read().rstrip("\n")
open(sys.argv[3], "w", encoding="utf-8").write(body + "\n\n" + "".join(d + end for d in drills))
PY
fi
mkdir -p "$d/$name" "$tasks"
drilled=$from
if [ "$drill_steps" -gt 0 ]; then
  train "$d/$name" "$from" "$d/records_mix.txt" "$d/records_valid.txt" "$drill_steps" 500 11
  drilled="$d/$name"
fi
train "$tasks" "$drilled" "$corpus" "$work/data/valid.txt" "$task_steps" 400 1
breakdown() {  # breakdown JSON LABEL: kvl eval's items, record drills by size, kv by kind
  /usr/bin/python3 - "$d/records_test.jsonl" "$1" "$2" <<'PY'
import json, re, sys
items = json.load(open(sys.argv[2]))["items"]
def scored(path):  # (suite item, eval item) pairs of one suite, in order
    suite = [json.loads(line) for line in open(path)]
    got = [it for it in items if it["task"] == suite[0]["task"]]
    assert [s["id"] for s in suite] == [it["id"] for it in got]
    return zip(suite, got)
def line(what, counts):
    return f"{sys.argv[3]}: {what}: " + ", ".join(f"{k} {c}/{n}" for k, (c, n) in counts.items())
record = re.compile(r"^[a-z]+-[a-z0-9]{4}: ", re.M)
bins = {"2-12": [0, 0], "13-30": [0, 0], "31-48": [0, 0], "all": [0, 0]}
for s, it in scored(sys.argv[1]):
    n = len(record.findall(s["messages"][0]["content"]))
    for k in ("2-12" if n <= 12 else "13-30" if n <= 30 else "31-48", "all"):
        bins[k][0] += it["correct"]
        bins[k][1] += 1
print(line("held-out record drills correct by records per document", bins))
PY
  /usr/bin/python3 experiments/kv_lookup_training/kv_breakdown.py "$work/data/suites/test_kv.jsonl" "$1" "$2"
}
s="$work/data/suites"
probe() {  # probe MODEL: the record drills and the kv suite
  local json="$d/$name/probe.$(basename "$1").json"
  "$KVL" eval --model "$1" --suite "$d/records_test.jsonl" --suite "$s/test_kv.jsonl" \
    --threads "$THREADS" --json "$json" --quiet > /dev/null
  breakdown "$json" "$1"
}
{
  mix=""; [ "${KVL_RECORDS_IN_TASKS:-0}" = 1 ] && mix="KVL_RECORDS_IN_TASKS=1 "
  echo "# ${mix}KVL_TRAIN_THREADS=$THREADS experiments/record_drills/records_probe.sh $work $from $name $drill_steps $task_steps"
  probe "$from"
  [ "$drilled" = "$from" ] || probe "$drilled"
  echo "after the task stage ($tasks, test split):"
  suites=()
  for t in facts kv arith lists strings; do suites+=(--suite "$s/test_$t.jsonl"); done
  "$KVL" eval --model "$tasks" "${suites[@]}" --suite "$d/records_test.jsonl" \
    --text "$work/data/test.txt" --threads "$THREADS" --json "$tasks/probe.json" --quiet |
    awk '/^\{/ { json = 1 } !json'
  breakdown "$tasks/probe.json" "$tasks"
} | tee "$tasks/probe.txt"
