#!/usr/bin/env bash
# Issue 54: what does crossing tokenizers add to a switch's time to first
# token? bench/cross_tokenizer_bench on random models of kvl-small's shapes
# over the house tokenizer (source) and models/tokenizer-t2 (target), the
# house test conversations as text. Writes results.txt next to this script.
#   experiments/cross_tokenizer_switch/run.sh [BUILD_DIR]
# Needs the house corpus (build/house/data/test.txt: scripts/train/train_house_models.sh,
# or kvl make-data --seed 1) and an idle machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
"$BUILD/bench/cross_tokenizer_bench" --threads 2 --contexts 1024,4096 --repeat 5 \
  --text "${KVL_HOUSE_WORK:-build/house}/data/test.txt" \
  --out experiments/cross_tokenizer_switch/results.txt
