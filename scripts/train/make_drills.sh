#!/usr/bin/env bash
# Writes the retrieval drills of the house models' curriculum (docs/training.md)
# under WORK/drills, from the corpus in WORK/data/train.txt; files already there
# are kept (every one is deterministic):
#   train.txt, valid.txt  100k / 1k drills (copy, recall, next; seeds 1 and 2)
#   test.jsonl            600 held-out drills as a kvl eval suite (seed 3)
#   copy_{16,all}_{rep,fresh}.txt  the copying probe of experiments/retrieval_drills_stage/drill_probe.sh
#   scripts/train/make_drills.sh WORK
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$1
d="$work/drills"
mkdir -p "$d"
drills() {  # drills OUT N SEED [KINDS]
  [ -f "$d/$1" ] || /usr/bin/python3 scripts/train/retrieval_drills.py "$work/data/train.txt" "$d/$1" "${@:2}"
}
drills train.txt 100000 1
drills valid.txt 1000 2
drills test.jsonl 600 3
[ -f "$d/copy_all_fresh.txt" ] || /usr/bin/python3 - "$work/data/train.txt" "$d" <<'PY'
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
PY
