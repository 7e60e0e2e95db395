#!/usr/bin/env bash
# Recall after a switch with the translators committed before issue 32 (no
# anchors; git show b4c37a8:models/translators/...), every direction, as
# scripts/report/switch_recall.sh measures the committed ones: the "before" column of
# docs/results/switch_recall.md's comparison.
#   experiments/token_anchors/before.sh WORK [ITEMS]
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=${1:?usage: experiments/token_anchors/before.sh WORK [ITEMS]}
items=${2:-100}
mkdir -p "$work/before" experiments/token_anchors/results/before
for pair in kvl-small:kvl-large kvl-large:kvl-small kvl-small:kvl-small-b kvl-small-b:kvl-small; do
  s=${pair%%:*}; t=${pair##*:}
  f="$work/before/${s}__${t}.safetensors"
  git show "b4c37a8:models/translators/${s}__${t}.safetensors" > "$f"
  "$KVL" eval-switch --source "models/$s" --target "models/$t" --translator "$f" \
    --items "$items" --seed 32 --tails 0,32 --threads 2 --quiet \
    --json "experiments/token_anchors/results/before/${s}__${t}.json" 2>/dev/null \
    > "experiments/token_anchors/results/before/${s}__${t}.md"
done
