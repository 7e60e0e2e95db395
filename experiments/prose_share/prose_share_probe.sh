#!/usr/bin/env bash
# Issue 4's perplexity lead with more prose: does a corpus where real prose is
# most of the text (where kvl-large's lead is largest, experiments/perplexity_by_kind/house_breakdown.md)
# give kvl-large a 0.1 nats/token lead over kvl-small?
#
# 1. A prose-heavy test split: `kvl make-data` with the recipe's options but 240
#    generated test conversations instead of 1500. The prose paragraphs of each
#    split are chosen by a hash of their text, so they are the same 615; the
#    generated ones are the first 240 of the committed test split's (train and
#    valid are unchanged). Prose is then about 59% of test.txt's characters
#    (16% in the recipe's).
# 2. The committed models on it, as trained.
# 3. Both models after 1000 more steps on a prose-heavy training corpus (6400
#    generated train conversations plus the same 13,863 train paragraphs: every
#    conversation is one the models trained on), as the recipe's last stage
#    (assistant weight 10, bf16, batch 8 x 512; lr 1e-3 / 7e-4 for kvl-small /
#    kvl-large), then on the same test text and the test suites.
# One thread per run; the two fine-tunes run side by side (about 21 min).
#   experiments/prose_share/prose_share_probe.sh [WORK_DIR]   # default build/prose_probe
# Output: experiments/prose_share/prose_share_probe.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=${1:-build/prose_probe}
suites=build/house/data/suites
mkdir -p "$work"
knobs=(--seed 1 --facts-distractors 3 --facts-filler 4 --kv-max-bytes 2000 --arith-steps 5
       --list-len 8 --string-len 10)
[ -f "$work/data/manifest.json" ] ||
  "$KVL" make-data --out "$work/data" "${knobs[@]}" --train-conversations 40000 \
    --test-conversations 240 > /dev/null
[ -f "$work/data6400/manifest.json" ] ||
  "$KVL" make-data --out "$work/data6400" "${knobs[@]}" --train-conversations 6400 \
    --valid-conversations 240 --test-conversations 240 > /dev/null
[ -d "$suites" ] || { echo "needs $suites (scripts/train/train_house_models.sh's corpus)" >&2; exit 1; }
suite_flags=$(for t in facts kv arith lists strings; do echo --suite "$suites/test_$t.jsonl"; done)

for m in kvl-small kvl-large kvl-small-b; do
  [ -f "$work/base_$m.json" ] ||
    "$KVL" eval --model "models/$m" --text "$work/data/test.txt" --max-tokens 0 --threads 1 \
      --quiet --json "$work/base_$m.json" > /dev/null &
done
wait
finetune() {  # MODEL LR
  grep -qs '"finished": true' "$work/ft_$1/summary.json" && return
  "$KVL" train-lm --config "models/$1/config.json" --tokenizer models/tokenizer \
    --train "$work/data6400/train.txt" --valid "$work/data6400/valid.txt" --out "$work/ft_$1" \
    --seed 31 --steps 1000 --batch 8 --seq-len 512 --lr "$2" --warmup 50 --bf16 --threads 1 \
    --eval-every 250 --checkpoint-every 250 --assistant-weight 10 --init-from "models/$1" \
    --no-plot --quiet > /dev/null
}
finetune kvl-small 1e-3 &
finetune kvl-large 7e-4 &
wait
for m in kvl-small kvl-large; do
  # shellcheck disable=SC2086
  [ -f "$work/ft_eval_$m.json" ] ||
    "$KVL" eval --model "$work/ft_$m" $suite_flags --text "$work/data/test.txt" --max-tokens 0 \
      --threads 1 --quiet --json "$work/ft_eval_$m.json" > /dev/null &
done
wait

/usr/bin/python3 - "$work" <<'PY' | tee experiments/prose_share/prose_share_probe.txt
import json, sys
work = sys.argv[1]
share = {}
for line in open(f"{work}/data/test.jsonl"):
    d = json.loads(line)
    share[d["task"]] = share.get(d["task"], 0) + sum(len(m["content"]) for m in d["messages"])
prose = share["prose"] / sum(share.values())
ppl = lambda path: json.load(open(path))["perplexity"]["nats_per_token"]
print("# experiments/prose_share/prose_share_probe.sh: kvl-large's lead on a prose-heavy test split")
print(f"# test.txt: WORK_DIR/data (the recipe's options, 240 generated test conversations);")
print(f"# prose is {100 * prose:.1f}% of its message characters. nats/token, 512-token windows, all tokens.")
print()
print("| models | kvl-small | kvl-large | lead (small - large) |")
print("|---|---|---|---|")
rows = [("committed", f"{work}/base_kvl-small.json", f"{work}/base_kvl-large.json"),
        ("after 1000 prose-heavy steps", f"{work}/ft_eval_kvl-small.json",
         f"{work}/ft_eval_kvl-large.json")]
for label, small, large in rows:
    s, l = ppl(small), ppl(large)
    print(f"| {label} | {s:.4f} | {l:.4f} | {s - l:.4f} |")
print(f"| (kvl-small-b, committed) | {ppl(f'{work}/base_kvl-small-b.json'):.4f} | | |")
print()
print("Test suites (250 items per task), accuracy:")
print()
tasks = ["facts", "kv", "arith", "lists", "strings"]
print("| models | " + " | ".join(tasks) + " | kvl-large ahead on |")
print("|---|" + "---|" * (len(tasks) + 1))
acc = lambda path: {t: v["accuracy"] for t, v in json.load(open(path))["tasks"].items()}
for label, small, large in [("committed", "docs/results/training/kvl-small/eval_test.json",
                             "docs/results/training/kvl-large/eval_test.json"),
                            ("after 1000 prose-heavy steps", f"{work}/ft_eval_kvl-small.json",
                             f"{work}/ft_eval_kvl-large.json")]:
    s, l = acc(small), acc(large)
    ahead = sum(l[t] > s[t] for t in tasks)
    print(f"| {label} | " + " | ".join(f"{s[t]:.3f} / {l[t]:.3f}" for t in tasks) +
          f" | {ahead} of {len(tasks)} |")
print()
print("(cells: kvl-small / kvl-large)")
PY
