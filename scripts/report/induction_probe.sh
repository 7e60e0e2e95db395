#!/usr/bin/env bash
# Does a model copy from its context? Two texts of 200 lines, each line 60
# words drawn at random (fixed seed) from the corpus vocabulary followed by 60
# more: in rep.txt the second half repeats the first, in norep.txt it is new.
# A model with induction heads predicts the repeated half far better, so its
# log-perplexity on rep.txt is well below norep.txt; equal values mean it does
# not retrieve from context at all.
#   scripts/report/induction_probe.sh WORK_DIR MODEL_DIR [MODEL_DIR ...]
# WORK_DIR holds data/valid.txt (kvl make-data); output: one line per model.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=$1; shift
probe="$work/induction_probe"
mkdir -p "$probe"
/usr/bin/python3 - "$work/data/valid.txt" "$probe" <<'EOF'
import random, sys
words = open(sys.argv[1]).read().split()
rng = random.Random(5)
rep, norep = [], []
for _ in range(200):
    a = " ".join(rng.choice(words) for _ in range(60))
    b = " ".join(rng.choice(words) for _ in range(60))
    rep.append(a + " " + a)
    norep.append(a + " " + b)
open(sys.argv[2] + "/rep.txt", "w").write("\n".join(rep) + "\n")
open(sys.argv[2] + "/norep.txt", "w").write("\n".join(norep) + "\n")
EOF
printf '%-24s %14s %14s %10s\n' model rep_nats norep_nats gain
for model in "$@"; do
  nll() {
    "$KVL" eval --model "$model" --text "$probe/$1.txt" --max-tokens 20000 --threads 1 --quiet |
      tail -1 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["perplexity"]["nats_per_token"])'
  }
  r=$(nll rep); n=$(nll norep)
  printf '%-24s %14.4f %14.4f %10.4f\n' "$(basename "$model")" "$r" "$n" "$(echo "$n - $r" | bc -l)"
done
