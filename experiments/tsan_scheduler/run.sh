#!/bin/bash
# Builds the batch scheduler's test with ThreadSanitizer and runs it; writes
# the warning count and the distinct top frames to summary.txt here.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${TSAN_BUILD_DIR:-/tmp/build-tsan}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVL_SANITIZE=thread >/dev/null
ninja -C "$BUILD" tests/model_scheduler_test >/dev/null
log=$(mktemp)
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$BUILD/tests/model_scheduler_test" >"$log" 2>&1 || true
{
  echo "command: experiments/tsan_scheduler/run.sh  ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  grep -E "^\[  (PASSED|FAILED)" "$log" || true
  echo "ThreadSanitizer warnings: $(grep -c 'WARNING: ThreadSanitizer' "$log" || true)"
  echo "most frequent SUMMARY locations:"
  grep '^SUMMARY' "$log" | sed 's/.* in //' | cut -c1-100 | sort | uniq -c | sort -rn | head -12
} > experiments/tsan_scheduler/summary.txt
cat experiments/tsan_scheduler/summary.txt
