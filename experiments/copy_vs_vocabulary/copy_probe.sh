#!/usr/bin/env bash
# How fast does kvl train-lm teach a house-sized model to copy from context,
# and how does that depend on the vocabulary? For each N_WORDS given, trains
# kvl-small's shape for 400 steps (KVL_COPY_STEPS) on 60k lines "X | X", X a
# run of 5-30 words drawn (fixed seed) from N_WORDS words of the corpus
# vocabulary ("all": every word), then scores held-out lines of the same form
# whose second half repeats the first (rep) or is fresh (norep). A model that
# copies pays almost nothing for a repeated half: its gain (norep - rep, nats
# per token) approaches half the per-token cost of the first half.
#   experiments/copy_vs_vocabulary/copy_probe.sh WORK_DIR [N_WORDS ...]   # WORK_DIR holds data/valid.txt
# Output: one line per vocabulary size (experiments/copy_vs_vocabulary/copy_probe.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=$1; shift
sizes=("$@"); [ ${#sizes[@]} -gt 0 ] || sizes=(all)
printf '%-8s %8s %10s %10s %8s\n' words steps rep_nats norep_nats gain
for n in "${sizes[@]}"; do
  out="$work/copy_probe/words-$n"
  mkdir -p "$out"
  /usr/bin/python3 - "$work/data/valid.txt" "$out" "$n" <<'EOF'
import random, re, sys
words = sorted(set(re.findall(r"[A-Za-z]+", open(sys.argv[1]).read())))
if sys.argv[3] != "all":
    words = random.Random(2).sample(words, int(sys.argv[3]))
rng = random.Random(3)
def line(repeat):
    n = rng.randint(5, 30)
    x = " ".join(rng.choice(words) for _ in range(n))
    y = x if repeat else " ".join(rng.choice(words) for _ in range(n))
    return x + " | " + y
open(sys.argv[2] + "/copy.txt", "w").write("\n".join(line(True) for _ in range(60000)) + "\n")
state = rng.getstate()
for name, repeat in (("rep", True), ("norep", False)):
    rng.setstate(state)  # the same first halves in both files
    open(f"{sys.argv[2]}/{name}.txt", "w").write("\n".join(line(repeat) for _ in range(400)) + "\n")
EOF
  steps=${KVL_COPY_STEPS:-400}
  "$KVL" train-lm --config models/configs/kvl-small.json --tokenizer models/tokenizer \
    --train "$out/copy.txt" --out "$out/model" --seed 1 --steps "$steps" --batch 8 \
    --seq-len 512 --lr 3e-3 --warmup 50 --bf16 --threads "${KVL_TRAIN_THREADS:-2}" \
    --windows anywhere --no-plot --quiet > "$out/train.log"
  nll() {
    "$KVL" eval --model "$out/model" --text "$out/$1.txt" --threads "${KVL_TRAIN_THREADS:-2}" \
      --quiet | tail -1 |
      /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["perplexity"]["nats_per_token"])'
  }
  r=$(nll rep); f=$(nll norep)
  printf '%-8s %8s %10.4f %10.4f %8.4f\n' "$n" "$steps" "$r" "$f" "$(echo "$f - $r" | bc -l)"
done
