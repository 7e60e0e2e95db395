#!/usr/bin/env bash
# Can a trained house model learn the kv task (docs/data.md), which every
# committed model answers at chance? Fine-tunes FROM (default models/kvl-small)
# for 1500 steps per run on one of these corpora:
#   kv        24,133 extra kv conversations, levels 1-3
#   kv1       the 8,067 of them at level 1 (conversations of at most ~360 tokens)
#   tasks     the task corpus (WORK/data/train.txt), as the house recipe's task stage
#   tasks+kv  the task corpus with all the extra kv conversations appended
#   tasks+kv12, tasks+kv1: ... with those at levels 1-2 (16,082), at level 1
# The extra kv conversations are kvl make-data's (same knobs as the house
# recipe, seed 2) train split, kv items only, less any whose document is one of
# the seed-1 valid or test documents or suite prompts (data2/ and the corpora,
# ~0.6 GB, sit in WORK/kvprobe/, shared by every model). Each run: lr
# KVL_KV_LR, warm-up 50, cosine, batch 8 x 512, bf16, --assistant-weight W (the loss
# weight of assistant-written tokens; 1 is the house recipe). Then `kvl eval`
# on the test split's five suites and test.txt, and the kv items answered by
# kind and level (scripts/kv_breakdown.py).
#   scripts/kv_probe.sh WORK [RUN ...]     (default: every run below, in order)
# WORK holds data/ (kvl make-data) as for scripts/train_house_models.sh.
# KVL_KV_FROM / KVL_KV_CONFIG: the model and its shape (default kvl-small);
# KVL_KV_LR: peak lr (default 3e-3, the small shapes' task stage; kvl-large's
# is 2e-3); KVL_TRAIN_THREADS: threads (default 2). Finished runs are not
# retrained (a finished run trained with another lr, weight, seed or start is
# an error: remove its folder), an interrupted one resumes. Output: WORK/kvprobe/MODEL/NAME/ per run (MODEL: FROM's folder
# name), WORK/kvprobe/MODEL/probe.txt (the table); docs/results/kv_probe.txt
# collects runs.
set -euo pipefail
cd "$(dirname "$0")/.."
KVL=${KVL_BIN:-build/tools/kvl}
THREADS=${KVL_TRAIN_THREADS:-2}
FROM=${KVL_KV_FROM:-models/kvl-small}
CONFIG=${KVL_KV_CONFIG:-models/configs/kvl-small.json}
LR=${KVL_KV_LR:-3e-3}
[ $# -ge 1 ] || { sed -n '2,/^set /p' "$0" | grep '^#'; exit 2; }
work=$1; shift
d="$work/kvprobe"
r="$d/$(basename "$FROM")"  # the runs
mkdir -p "$r"

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

if [ ! -f "$d/corpora.done" ]; then
  if [ ! -f "$d/data2.done" ]; then
    "$KVL" make-data --out "$d/data2" --seed 2 \
      --train-conversations 300000 --valid-conversations 10 --test-conversations 10 \
      --facts-distractors 3 --facts-filler 4 --kv-max-bytes 2000 --arith-steps 5 --list-len 8 \
      --string-len 10 > "$d/data2.log"
    touch "$d/data2.done"
  fi
  /usr/bin/python3 - "$work/data" "$d" <<'PY'
import json, sys
data, out = sys.argv[1:3]
def render(messages):  # as the corpus renders a conversation (docs/data.md)
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "\n"
def document(item):  # a kv item's first user turn holds its records
    return next(m["content"] for m in item["messages"] if m["role"] == "user")
held_out = set()
for path in (f"{data}/valid.jsonl", f"{data}/test.jsonl", f"{data}/suites/test_kv.jsonl"):
    for line in open(path, encoding="utf-8"):
        item = json.loads(line)
        if item["task"] == "kv":
            held_out.add(document(item))
extra = []  # (level, rendered)
for line in open(f"{out}/data2/train.jsonl", encoding="utf-8"):
    item = json.loads(line)
    if item["task"] == "kv" and document(item) not in held_out:
        extra.append((item["difficulty"], render(item["messages"])))
tasks = open(f"{data}/train.txt", encoding="utf-8").read().rstrip("\n") + "\n\n"
def write(name, levels, with_tasks):
    body = "".join(text for level, text in extra if level in levels)
    open(f"{out}/{name}.txt", "w", encoding="utf-8").write((tasks if with_tasks else "") + body)
write("kv", {1, 2, 3}, False)
write("kv1", {1}, False)
write("tasks+kv", {1, 2, 3}, True)
write("tasks+kv12", {1, 2}, True)
write("tasks+kv1", {1}, True)
print(f"{len(extra)} extra kv conversations")
PY
  touch "$d/corpora.done"
fi

corpus() { [ "$1" = tasks ] && echo "$work/data/train.txt" || echo "$d/$1.txt"; }
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
    local resume=()
    if [ -f "$out/train_state/state.json" ]; then resume=(--resume); fi
    "$KVL" train-lm --config "$CONFIG" --tokenizer models/tokenizer --train "$(corpus "$3")" \
      --valid "$work/data/valid.txt" --init-from "$init" --out "$out" --seed "$5" --steps 1500 \
      --batch 8 --seq-len 512 --lr "$LR" --warmup 50 --bf16 --threads "$THREADS" --eval-every 500 \
      --checkpoint-every 250 --no-plot --quiet --assistant-weight "$4" ${resume[@]+"${resume[@]}"} \
      > "$out.log" 2>&1
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
  echo "# KVL_TRAIN_THREADS=$THREADS KVL_KV_FROM=$FROM KVL_KV_CONFIG=$CONFIG KVL_KV_LR=$LR scripts/kv_probe.sh $work"
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
    /usr/bin/python3 scripts/kv_breakdown.py "$work/data/suites/test_kv.jsonl" "$json" "$name"
  done <<< "$rows"
} | tee "$r/probe.txt"
