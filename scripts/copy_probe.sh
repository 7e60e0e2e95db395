#!/usr/bin/env bash
# Can kvl train-lm teach a house-sized model to copy at all? Trains kvl-small's
# shape for 400 steps on nothing but lines "X | X" (X: 5-30 random corpus
# words, fixed seed), where the second half is free for any model that copies,
# then runs scripts/induction_probe.sh on it. A copying model shows a large
# gain; see docs/training.md for what was measured.
#   scripts/copy_probe.sh WORK_DIR      # WORK_DIR holds data/valid.txt
set -euo pipefail
cd "$(dirname "$0")/.."
KVL=${KVL_BIN:-build/tools/kvl}
work=$1
out="$work/copy_probe"
mkdir -p "$out"
/usr/bin/python3 - "$work/data/valid.txt" "$out" <<'EOF'
import random, sys
words = sorted(set(open(sys.argv[1]).read().split()))
rng = random.Random(3)
lines = []
for _ in range(60000):
    x = " ".join(rng.choice(words) for _ in range(rng.randint(5, 30)))
    lines.append(x + " | " + x)
open(sys.argv[2] + "/copy.txt", "w").write("\n".join(lines) + "\n")
open(sys.argv[2] + "/copy_valid.txt", "w").write("\n".join(lines[:500]) + "\n")
EOF
"$KVL" train-lm --config models/configs/kvl-small.json --tokenizer models/tokenizer \
  --train "$out/copy.txt" --valid "$out/copy_valid.txt" --out "$out/model" --seed 1 \
  --steps "${KVL_COPY_STEPS:-400}" --batch 8 --seq-len 512 --lr 3e-3 --warmup 50 --bf16 \
  --threads "${KVL_TRAIN_THREADS:-2}" --windows anywhere --no-plot --quiet
scripts/induction_probe.sh "$work" "$out/model"
