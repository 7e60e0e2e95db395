#!/usr/bin/env bash
# Issue 51, step 1: do token anchors survive a rank-r basis shared by every
# layer and offset? Projects the committed kvl-small -> kvl-large translator's
# anchor weights onto rank r (project.py: the optimal basis from the anchors,
# or the table's own principal directions, "pca"), then measures the
# test-window gap of each with kvl eval-translator (64 windows of the house
# test split; rank 256 = the table's width is the committed file itself).
#   experiments/lowrank_anchors/run.sh WORK     # WORK: scratch (data, files)
# Needs /usr/bin/python3 with numpy (apt-get install python3-numpy) and
# build/tools/kvl.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=${1:?usage: experiments/lowrank_anchors/run.sh WORK}
here=experiments/lowrank_anchors
src=models/translators/kvl-small__kvl-large.safetensors
mkdir -p "$work" "$here/results"
# The house corpus's test split (as scripts/train/train_house_models.sh makes it).
[ -f "$work/data/test.jsonl" ] || "$KVL" make-data --out "$work/data" --seed 1 \
  --train-conversations 40000 --facts-distractors 3 --facts-filler 4 --kv-max-bytes 2000 \
  --arith-steps 5 --list-len 8 --string-len 10
gap() {  # gap OUT FILE...
  local out=$1; shift
  "$KVL" eval-translator --source models/kvl-small --target models/kvl-large \
    --translator "$(IFS=,; echo "$*")" --data "$work/data/test.jsonl" --threads 2 --quiet \
    2>/dev/null > "$out"
  cat "$out"
}
: > "$here/results/kept.txt"
optimal=() pca=()
for r in 256 128 64 32 16; do
  /usr/bin/python3 $here/project.py "$src" "$work/r$r.safetensors" "$r" optimal | tee -a "$here/results/kept.txt"
  optimal+=("$work/r$r.safetensors")
done
for r in 128 64; do
  /usr/bin/python3 $here/project.py "$src" "$work/p$r.safetensors" "$r" pca | tee -a "$here/results/kept.txt"
  pca+=("$work/p$r.safetensors")
done
gap "$here/results/gap_optimal.txt" "${optimal[@]}"
gap "$here/results/gap_pca.txt" "${pca[@]}"
