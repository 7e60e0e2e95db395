#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer:
# builds everything in the clang build dir of scripts/fuzz.sh (build-fuzz/,
# git-ignored; scripts/sanitizer_build.sh) and runs its ctest suite there.
# Every instrumented process (test binaries, and the kvl-server and kvl they
# start) writes any report to BUILD/sanitizer_reports/ (log_path), so a report
# from a child process counts even when its test does not look at the child's
# exit code. Exits non-zero on a failed test or any report.
#   scripts/asan_suite.sh                  # build, then the whole suite
#   scripts/asan_suite.sh -R RouterE2e     # extra arguments go to ctest
# Left out, each for its reason (docs/testing.md):
#   the Docker test: it builds an image from the build dir's binaries, and
#     the image's health checks and commands do not carry the sanitizer's
#     options or its report directory (the same binaries run here);
#   the soak test: its RSS bound is start-up RSS + cache budget + 192 MiB,
#     and ASan's shadow memory and quarantine are not in that budget.
# Not a CI step: the build and the run take about an hour on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${ASAN_SYMBOLIZER_PATH:-} ]] && command -v llvm-symbolizer-14 >/dev/null; then
  export ASAN_SYMBOLIZER_PATH=$(command -v llvm-symbolizer-14)
fi
BUILD=${KVL_FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${KVL_ASAN_JOBS:-$(nproc)}

scripts/sanitizer_build.sh "$BUILD" fuzz asan_suite "$JOBS"

reports=$PWD/$BUILD/sanitizer_reports
rm -rf "$reports"
mkdir -p "$reports"
start=$(date +%s)
rc=0
# Leaks count; any UBSan report stops its process (-fno-sanitize-recover).
ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:log_path=$reports/asan:${ASAN_OPTIONS:-}" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan:${UBSAN_OPTIONS:-}" \
OMP_WAIT_POLICY=PASSIVE \
  ctest --test-dir "$BUILD" -j "$JOBS" --timeout 3600 -E '^(Soak|DeployDocker)\.' \
    --output-on-failure "$@" >"$BUILD/asan_suite.log" 2>&1 || rc=$?
seconds=$(($(date +%s) - start))
summary=$(grep -E 'tests passed, [0-9]+ tests failed' "$BUILD/asan_suite.log" || echo "no ctest summary")
mapfile -t found < <(find "$reports" -type f | sort)
if [[ $rc -eq 0 && ${#found[@]} -eq 0 ]]; then
  echo "asan_suite: PASS ($summary; no AddressSanitizer, LeakSanitizer or UBSan report; ${seconds}s)"
  exit 0
fi
grep -A12 'The following tests FAILED' "$BUILD/asan_suite.log" >&2 || true
for f in "${found[@]}"; do
  echo "== $f" >&2
  grep -E 'ERROR: |SUMMARY: |runtime error:|^    #[0-9] ' "$f" | head -12 >&2 || head -20 "$f" >&2
done
echo "asan_suite: FAIL ($summary; ${#found[@]} sanitizer report(s) in $reports; log $BUILD/asan_suite.log)" >&2
exit 1
