#!/usr/bin/env bash
# The test-window gap (kvl eval-translator: 64 windows of the house test split,
# prefix 255, continuation 128) of kvl-small -> kvl-large translators side by
# side: the one committed before issue 32 (git show
# b4c37a8:models/translators/kvl-small__kvl-large.safetensors > FILE) and
# token-anchored ones from run.sh / distill.sh.
#   experiments/token_anchors/gap.sh WORK TRANSLATOR...
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=${1:?usage: experiments/token_anchors/gap.sh WORK TRANSLATOR...}
shift
list=$(IFS=,; echo "$*")
"$KVL" eval-translator --source models/kvl-small --target models/kvl-large --translator "$list" \
  --data "$work/data/test.jsonl" --threads 2 --quiet 2>/dev/null \
  > experiments/token_anchors/results/gap.txt
cat experiments/token_anchors/results/gap.txt
