#!/usr/bin/env bash
# Where do the house models' test log-perplexities differ? Splits the test
# split's rendered conversations (test.txt) by the kind of conversation
# (test.jsonl's "task", same order) and runs `kvl eval --text` on each part
# (up to 32768 predicted tokens each, 512-token windows), for every model.
#   experiments/perplexity_by_kind/house_breakdown.sh WORK_DIR MODEL_DIR [MODEL_DIR ...]
# WORK_DIR holds data/test.{txt,jsonl} (kvl make-data, as scripts/train/train_house_models.sh
# writes it). Prints a Markdown table: nats/token per kind and model, each kind's
# share of test.txt's characters, and the last model minus the first.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=$1; shift
parts="$work/breakdown"
mkdir -p "$parts"
/usr/bin/python3 - "$work/data" "$parts" <<'PY'
import collections, json, sys
data, out = sys.argv[1], sys.argv[2]
kinds = [json.loads(line)["task"] for line in open(f"{data}/test.jsonl", encoding="utf-8")]
# Every conversation ends with "<|im_end|>\n" and one empty line (docs/data.md).
text = open(f"{data}/test.txt", encoding="utf-8").read()
conversations = [c + "<|im_end|>\n\n" for c in text.split("<|im_end|>\n\n") if c.strip()]
assert len(conversations) == len(kinds), (len(conversations), len(kinds))
by_kind = collections.defaultdict(list)
for kind, conversation in zip(kinds, conversations):
    by_kind[kind].append(conversation)
total = sum(map(len, conversations))
with open(f"{out}/shares.tsv", "w") as shares:
    for kind in sorted(by_kind):
        open(f"{out}/{kind}.txt", "w", encoding="utf-8").write("".join(by_kind[kind]))
        shares.write(f"{kind}\t{sum(map(len, by_kind[kind])) / total:.3f}\n")
PY
names=(); for model in "$@"; do names+=("$(basename "$model")"); done
header="| kind | share of test.txt |"; rule="|---|---|"
for n in "${names[@]}"; do header+=" $n |"; rule+="---|"; done
echo "$header ${names[-1]} - ${names[0]} |"; echo "$rule---|"
while IFS=$'\t' read -r kind share; do
  row="| $kind | $share |"; first=""; last=""
  for model in "$@"; do
    v=$("$KVL" eval --model "$model" --text "$parts/$kind.txt" --max-tokens 32768 --threads 2 --quiet |
      tail -1 | /usr/bin/python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["perplexity"]["nats_per_token"])')
    row+=" $v |"; [ -n "$first" ] || first=$v; last=$v
  done
  echo "$row $(printf '%+.4f' "$(echo "$last - $first" | bc -l)") |"
done < "$parts/shares.tsv"
