#!/usr/bin/env bash
# Does a first curriculum stage of retrieval drills (scripts/retrieval_drills.py)
# teach kvl-small's shape to copy from its context? Trains NAME for STEPS steps
# on 100k drill conversations (extra arguments go to kvl train-lm, e.g.
# --lr 1e-2 or --batch 32 --seq-len 128), then prints
#   - log-perplexity of "Repeat after me: X" conversations whose answer is X
#     (rep) or another run of words of the same length (fresh), X drawn from a
#     16-word pool and from every corpus word: a model that copies pays far
#     less for a repeated answer;
#   - greedy accuracy on 100 held-out drills (kvl eval).
#   scripts/drill_probe.sh WORK NAME STEPS [train-lm args...]   # WORK holds data/train.txt
# Output: WORK/drills/NAME/probe.txt (docs/results/drill_probe.txt collects runs).
set -euo pipefail
cd "$(dirname "$0")/.."
KVL=${KVL_BIN:-build/tools/kvl}
THREADS=${KVL_TRAIN_THREADS:-2}
work=$1 name=$2 steps=$3; shift 3
d="$work/drills"
mkdir -p "$d/$name"
if [ ! -f "$d/train.txt" ]; then
  /usr/bin/python3 scripts/retrieval_drills.py "$work/data/train.txt" "$d/train.txt" 100000 1
  /usr/bin/python3 scripts/retrieval_drills.py "$work/data/train.txt" "$d/valid.txt" 1000 2
  /usr/bin/python3 scripts/retrieval_drills.py "$work/data/train.txt" "$d/test.jsonl" 600 3
  /usr/bin/python3 - "$work/data/train.txt" "$d" <<'EOF'
import collections, random, re, sys
counts = collections.Counter(re.findall(r"[A-Za-z]{2,}", open(sys.argv[1], encoding="utf-8").read()))
words = sorted(w for w, c in counts.items() if c >= 5)
for pool_size in ("16", "all"):
    for kind in ("rep", "fresh"):
        rng = random.Random(5)  # the same prompts in both files
        out = []
        for _ in range(300):
            pool = words if pool_size == "all" else rng.sample(words, int(pool_size))
            x = [rng.choice(pool) for _ in range(rng.randint(3, 24))]
            y = x if kind == "rep" else [rng.choice(pool) for _ in x]
            out.append(f"<|im_start|>user\nRepeat after me: {' '.join(x)}<|im_end|>\n"
                       f"<|im_start|>assistant\n{' '.join(y)}<|im_end|>\n")
        open(f"{sys.argv[2]}/copy_{pool_size}_{kind}.txt", "w").write("\n".join(out))
EOF
fi
"$KVL" train-lm --config models/configs/kvl-small.json --tokenizer models/tokenizer \
  --train "$d/train.txt" --valid "$d/valid.txt" --out "$d/$name/model" --seed 1 --steps "$steps" \
  --warmup 50 --bf16 --threads "$THREADS" --eval-every 200 --no-plot --quiet "$@" \
  > "$d/$name/train.log" 2>&1
nll() {
  "$KVL" eval --model "$d/$name/model" --text "$1" --threads "$THREADS" --quiet | tail -1 |
    /usr/bin/python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["perplexity"]["nats_per_token"])'
}
{
  echo "# scripts/drill_probe.sh $work $name $steps $*"
  printf '%-6s %9s %9s %7s\n' pool rep fresh gain
  for pool in 16 all; do
    r=$(nll "$d/copy_${pool}_rep.txt"); f=$(nll "$d/copy_${pool}_fresh.txt")
    printf '%-6s %9s %9s %7.4f\n' "$pool" "$r" "$f" "$(echo "$f - $r" | bc -l)"
  done
  "$KVL" eval --model "$d/$name/model" --suite "$d/test.jsonl" --limit 100 --threads "$THREADS" \
    --quiet | head -5
} | tee "$d/$name/probe.txt"
