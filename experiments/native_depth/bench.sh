#!/usr/bin/env bash
# The cost side of the native-depth frontier (issue 55): time to first token
# of a switch with k native layers against a re-prefill, in-process
# (bench/translator_bench --native-layers: translate the span, predict the
# residual stream at layer L-k's input with a random residual map, compute
# the top k layers, decode one token; timing depends on shapes only).
#   experiments/native_depth/bench.sh [WORK]     # WORK: the pair configs (default /var/tmp/nd-bench)
# 1. the house shapes, kvl-small <-> kvl-large, at 1k and 4k tokens, k = 0..6
#    -> results/ttft_house.txt;
# 2. kvl-small -> kvl-small-b (two kvl-small shapes) -> results/ttft_house_small.txt;
# 3. a real shape: Qwen3-0.6B -> Qwen3-1.7B (28 layers), at 1k tokens, k = 0, 1,
#    2, 4, 7, 14, 28, maps of band 2 with rank-64 anchors as a real vocabulary
#    needs (scripts/report/real_shapes.sh) -> results/ttft_real.txt.
# Run it on a quiet machine: the figures are best-of-runs timings (the house
# shapes with --repeat 2: each cell the best of 4-6 runs).
# KVL_ND_PARTS (default "house small real") picks the parts.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:-/var/tmp/nd-bench}
BENCH=${KVL_BENCH_DIR:-build/bench}
R=experiments/native_depth/results
PARTS=${KVL_ND_PARTS:-house small real}
mkdir -p "$WORK/small" "$WORK/real" "$R"
if [[ " $PARTS " == *" house "* ]]; then
  "$BENCH/translator_bench" --configs models/configs --contexts 1024,4096 --repeat 2 \
    --native-layers 0,1,2,3,4,5,6 --switch-only --threads 2 --out "$R/ttft_house.txt"
fi
if [[ " $PARTS " == *" small "* ]]; then
  cp models/configs/kvl-small.json "$WORK/small/kvl-small.json"
  cp models/configs/kvl-small.json "$WORK/small/kvl-large.json"
  "$BENCH/translator_bench" --configs "$WORK/small" --contexts 1024,4096 --repeat 2 \
    --direction small-large --native-layers 0,1,2,3,4 --switch-only --threads 2 \
    --out "$R/ttft_house_small.txt"
fi
if [[ " $PARTS " == *" real "* ]]; then
  cp bench/shapes/qwen3-0.6b.json "$WORK/real/kvl-small.json"
  cp bench/shapes/qwen3-1.7b.json "$WORK/real/kvl-large.json"
  "$BENCH/translator_bench" --configs "$WORK/real" --contexts 1024 --direction small-large \
    --native-layers 0,1,2,4,7,14,28 --switch-only --band 2 --anchor-window 8 --anchor-rank 64 \
    --threads 2 --out "$R/ttft_real.txt"
fi
