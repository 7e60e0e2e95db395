#!/usr/bin/env bash
# The recall side of the native-depth frontier (issue 55): kvl eval-switch
# through the router, as served (32-token native tail), the translate
# condition with k native layers for each K, on the translator with residual
# maps that fit.sh wrote. The house test seed (32), the house corpus knobs.
#   experiments/native_depth/sweep.sh WORK SOURCE:TARGET ITEMS "K K ..."
# Writes results/recall_<s>__<t>_k<K>.{txt,json}.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:?usage: sweep.sh WORK SOURCE:TARGET ITEMS "K K ..."}
d=${2:?}; items=${3:?}; ks=${4:?}
s=${d%%:*}; t=${d##*:}
KVL=${KVL_BIN:-build/tools/kvl}
R=experiments/native_depth/results
mkdir -p "$R"
for k in $ks; do
  start=$(date +%s)
  "$KVL" eval-switch --source "models/$s" --target "models/$t" \
    --translator "$WORK/${s}__${t}.residual.safetensors" --native-layers "$k" \
    --items "$items" --tails 32 --threads 2 --quiet \
    --json "$R/recall_${s}__${t}_k${k}.json" > "$R/recall_${s}__${t}_k${k}.txt"
  echo "k=$k: $(( $(date +%s) - start )) s" >&2
done
