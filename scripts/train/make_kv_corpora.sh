#!/usr/bin/env bash
# Writes the kv corpora of the house models' last two stages (docs/training.md)
# under WORK/kvextra: kvl make-data's train split with the recipe's knobs and
# seed 2, kv items only, less any whose document is one of the seed-1 valid or
# test documents or kv suite prompts (WORK/data, kvl make-data --seed 1). Files:
#   kv.txt          the 24,133 extra kv conversations, levels 1-3
#   kv1.txt         the 8,067 of them at level 1 (conversations of at most ~360 tokens)
#   tasks+kv.txt    WORK/data/train.txt with all of them appended
#   tasks+kv12.txt, tasks+kv1.txt: ... with those at levels 1-2 (16,082), at level 1
# (~0.6 GB in all, with data2/, make-data's output). Deterministic; files
# already there are kept.
#   scripts/train/make_kv_corpora.sh WORK
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=$1
d="$work/kvextra"
mkdir -p "$d"
[ -f "$d/corpora.done" ] && [ -f "$d/kv12.jsonl" ] && exit 0
if [ ! -f "$d/data2.done" ]; then
  "$KVL" make-data --out "$d/data2" --seed 2 \
    --train-conversations 300000 --valid-conversations 10 --test-conversations 10 \
    --facts-distractors 3 --facts-filler 4 --kv-max-bytes 2000 --arith-steps 5 --list-len 8 \
    --string-len 10 > "$d/data2.log"
  touch "$d/data2.done"
fi
/usr/bin/python3 - "$work/data" "$d" <<'PY'
import json, os, sys
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
with open(f"{out}/kv12.jsonl.tmp", "w", encoding="utf-8") as kv12:
    for line in open(f"{out}/data2/train.jsonl", encoding="utf-8"):
        item = json.loads(line)
        if item["task"] == "kv" and document(item) not in held_out:
            extra.append((item["difficulty"], render(item["messages"])))
            if item["difficulty"] <= 2:
                kv12.write(line)
tasks = open(f"{data}/train.txt", encoding="utf-8").read().rstrip("\n") + "\n\n"
CORPORA = (("kv", {1, 2, 3}, False), ("kv1", {1}, False), ("tasks+kv", {1, 2, 3}, True),
           ("tasks+kv12", {1, 2}, True), ("tasks+kv1", {1}, True))
for name, levels, with_tasks in CORPORA:  # each whole or not at all
    with open(f"{out}/{name}.txt.tmp", "w", encoding="utf-8") as f:
        f.write((tasks if with_tasks else "") + "".join(t for level, t in extra if level in levels))
for name, _, _ in CORPORA:
    os.replace(f"{out}/{name}.txt.tmp", f"{out}/{name}.txt")
os.replace(f"{out}/kv12.jsonl.tmp", f"{out}/kv12.jsonl")
print(f"{len(extra)} extra kv conversations in {out}")
PY
touch "$d/corpora.done"
