#!/usr/bin/env bash
# Compares layer assignments for both house pairs in both directions:
# closed-form fits (kvl fit, the committed translators' corpus and sizes).
# Cross-layer pair: relative_depth at band 1, relative_depth, top_r2 and
# greedy at band 2, and every source layer (--band all); shape-preserving
# pair: same_index (one source layer), relative_depth band 2 and every source
# layer. Prints the mean
# per-target-layer R² of keys and values (in-sample over ~40k tokens; at most
# 769 inputs per map, so overfitting is small).
#   experiments/layer_assignment/assignment_compare.sh [WORK_DIR]   # default build/house; needs WORK_DIR/data
# Output: experiments/layer_assignment/assignments.txt (one line per fit).
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=${1:-build/house}
out="$work/assignments"
mkdir -p "$out"
printf '%-24s %-15s %5s %12s %12s %8s\n' direction assignment band mean_r2_keys mean_r2_vals fit_s
for pair in kvl-small:kvl-large kvl-large:kvl-small kvl-small:kvl-small-b kvl-small-b:kvl-small; do
  s=${pair%%:*}; t=${pair##*:}
  specs="relative_depth:1 relative_depth:2 top_r2:2 greedy:2 relative_depth:all"
  case "$pair" in *kvl-small-b*) specs="same_index:1 relative_depth:2 relative_depth:all" ;; esac
  for spec in $specs; do
    kind=${spec%%:*}; band=${spec##*:}
    f="$out/${s}__${t}.$kind.$band.safetensors"
    t0=$(date +%s.%N)
    "$KVL" fit --source "models/$s" --target "models/$t" --data "$work/data/train.jsonl" \
      --out "$f" --seq-len 512 --max-sequences 256 --assignment "$kind" --band "$band" \
      --threads "${KVL_TRAIN_THREADS:-2}" --quiet > /dev/null
    t1=$(date +%s.%N)
    /usr/bin/python3 - "${f%.safetensors}.r2.json" "$s->$t" "$kind" "$band" "$(echo "$t1 - $t0" | bc -l)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:<24} {sys.argv[3]:<15} {sys.argv[4]:>5} {d['mean_r2_keys']:12.4f} "
      f"{d['mean_r2_values']:12.4f} {float(sys.argv[5]):8.1f}")
PY
  done
done
