#!/usr/bin/env bash
# The batch scheduler's concurrency test under ThreadSanitizer: configures (once)
# and builds a TSan build dir holding only tests/model_scheduler_test, runs it,
# prints one line, and exits non-zero on a test failure or any TSan warning.
#   scripts/ci/tsan_check.sh                       # build dir build-tsan/ (git-ignored)
#   KVL_TSAN_BUILD_DIR=/tmp/t scripts/ci/tsan_check.sh --gtest_filter='*ManyThreads*'
#   KVL_TSAN_JOBS=1 scripts/ci/tsan_check.sh       # build jobs (default: nproc)
# Arguments go to the test binary. The full log is BUILD_DIR/tsan_check.log.
# Why and what it found: experiments/tsan_scheduler/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${KVL_TSAN_BUILD_DIR:-build-tsan}
JOBS=${KVL_TSAN_JOBS:-$(nproc)}
TARGET=tests/model_scheduler_test
SUPP=$PWD/tests/tsan.supp

scripts/ci/sanitizer_build.sh "$BUILD" thread tsan_check "$JOBS" "$TARGET"

log=$BUILD/tsan_check.log
start=$(date +%s)
rc=0
# One OpenMP/OpenBLAS thread: their pools synchronise in uninstrumented code.
# halt_on_error stops at the first report; exitcode 66 marks it.
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
  TSAN_OPTIONS="suppressions=$SUPP halt_on_error=1 exitcode=66 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" \
  "$BUILD/$TARGET" "$@" >"$log" 2>&1 || rc=$?
seconds=$(($(date +%s) - start))
warnings=$(grep -c 'WARNING: ThreadSanitizer' "$log" || true)
tests=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)

if [[ $rc -eq 0 && $warnings -eq 0 ]]; then
  echo "tsan_check: PASS ($TARGET: $tests tests, 0 ThreadSanitizer warnings, ${seconds}s)"
  exit 0
fi
# The first report (or the test's failures) before the verdict.
if [[ $warnings -gt 0 ]]; then
  sed -n '/WARNING: ThreadSanitizer/,/^SUMMARY: ThreadSanitizer/p' "$log" | head -80 >&2
else
  grep -E '^\[  FAILED|Failure|^.*: error:' "$log" | head -40 >&2 || tail -40 "$log" >&2
fi
echo "tsan_check: FAIL ($TARGET exit $rc, $warnings ThreadSanitizer warning(s); log $log)" >&2
exit $((rc != 0 ? rc : 66))
