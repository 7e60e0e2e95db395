#!/bin/bash
# Builds the batch scheduler's test with ThreadSanitizer and runs it with the
# suppressions in tsan.supp here (no halt_on_error: every report is counted);
# writes the warning count and the distinct top frames to summary.txt here.
# The pass/fail check for CI is scripts/ci/tsan_check.sh.
#   TSAN_BUILD_DIR=/tmp/build-tsan KVL_TSAN_JOBS=1 experiments/tsan_scheduler/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${TSAN_BUILD_DIR:-/tmp/build-tsan}
SUPP=$PWD/experiments/tsan_scheduler/tsan.supp
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVL_SANITIZE=thread >/dev/null
ninja -C "$BUILD" ${KVL_TSAN_JOBS:+-j"$KVL_TSAN_JOBS"} tests/model_scheduler_test >/dev/null
log=$(mktemp)
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 TSAN_OPTIONS="suppressions=$SUPP print_suppressions=1" \
  "$BUILD/tests/model_scheduler_test" >"$log" 2>&1 || true
{
  echo "command: experiments/tsan_scheduler/run.sh  ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  grep -E "^\[  (PASSED|FAILED)" "$log" || true
  echo "ThreadSanitizer warnings: $(grep -c 'WARNING: ThreadSanitizer' "$log" || true)"
  echo "suppressions matched (tsan.supp):"
  sed -n '/^ThreadSanitizer: Matched/,/^$/p' "$log" | grep -v '^$' || echo "  none"
  echo "most frequent SUMMARY locations:"
  grep '^SUMMARY' "$log" | sed 's/.* in //' | cut -c1-100 | sort | uniq -c | sort -rn | head -12 || true
} > experiments/tsan_scheduler/summary.txt
rm -f "$log"
cat experiments/tsan_scheduler/summary.txt
