#!/usr/bin/env bash
# Which target layers limit each committed (distilled) house translator:
# `kvl ablate-translator` on the test split, prefixes ending where the target
# starts a reply (the hand-over of a switch before the answer), for all four
# directions. Needs the corpus of scripts/train/train_house_models.sh.
#   experiments/translator_ablation/translator_ablation.sh [WORK_DIR]   # default build/house; needs WORK_DIR/data
# Output: experiments/translator_ablation/translator_ablation.txt (the printed tables) and one
# JSON file per direction in experiments/translator_ablation/results/<S>__<T>.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=${1:-build/house}
out=experiments/translator_ablation/translator_ablation.txt
mkdir -p experiments/translator_ablation/results
{
  echo "# experiments/translator_ablation/translator_ablation.sh $work"
  for pair in kvl-small:kvl-large kvl-large:kvl-small kvl-small:kvl-small-b kvl-small-b:kvl-small; do
    s=${pair%%:*}; t=${pair##*:}
    echo
    echo "## $s -> $t (models/translators/${s}__${t}.safetensors)"
    "$KVL" ablate-translator --source "models/$s" --target "models/$t" \
      --translator "models/translators/${s}__${t}.safetensors" --data "$work/data/test.jsonl" \
      --hand-over reply --threads "${KVL_TRAIN_THREADS:-2}" \
      --json "experiments/translator_ablation/results/${s}__${t}.json"
  done
} | tee "$out"
