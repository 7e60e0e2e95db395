#!/usr/bin/env bash
# How much slower do the training tests run in the ASan+UBSan build (build-fuzz/,
# scripts/ci/asan_suite.sh) than in Release (build/), and is ASan's allocator the cause?
#   experiments/asan_training_slowdown/run.sh            # ResumedRun, three ways
#   experiments/asan_training_slowdown/run.sh --copy     # also the copy test in both builds (~25 min)
# Needs build/ and build-fuzz/ built. Prints one line per run: build, ASAN_OPTIONS, seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
run() {  # run BUILD FILTER ASAN_OPTIONS
  local start end
  start=$(date +%s.%N)
  env ASAN_OPTIONS="$3" KVL_SOURCE_DIR="$PWD" KVL_BINARY_DIR="$PWD/$1" OMP_WAIT_POLICY=PASSIVE \
    "$1/tests/training_train_lm_test" --gtest_filter="$2" >/dev/null
  end=$(date +%s.%N)
  printf '%-11s %-22s ASAN_OPTIONS=%-70s %6.1f s\n' "$1" "$2" "'$3'" "$(echo "$end - $start" | bc)"
}
resumed='*ResumedRunIsBitIdentical*'
run build "$resumed" ""
run build-fuzz "$resumed" ""
run build-fuzz "$resumed" "quarantine_size_mb=0:detect_leaks=0:malloc_fill_byte=0:max_malloc_fill_size=0"
if [[ ${1:-} == --copy ]]; then
  run build '*CopyFromContext*' ""
  run build-fuzz '*CopyFromContext*' ""
fi
