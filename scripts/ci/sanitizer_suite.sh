#!/usr/bin/env bash
# The whole test suite under a sanitizer, for scripts/ci/asan_suite.sh and
# scripts/ci/tsan_suite.sh (their headers say what each covers):
#   scripts/ci/sanitizer_suite.sh address|thread [ctest arguments...]
# Builds everything in the sanitizer's build dir (scripts/ci/sanitizer_build.sh)
# and runs its ctest suite there. Every instrumented process (test binaries,
# and the kvl-server and kvl they start) writes any report to
# BUILD/sanitizer_reports/ (log_path), so a report from a child process counts
# even when its test does not look at the child's exit code. Exits non-zero on
# a failed test or any report. Left out: the Docker and soak tests
# (docs/testing.md says why).
set -euo pipefail
cd "$(dirname "$0")/../.."
KIND=${1:?usage: scripts/ci/sanitizer_suite.sh address|thread [ctest arguments...]}
shift
case $KIND in
  address)
    name=asan_suite
    BUILD=${KVL_FUZZ_BUILD_DIR:-build-fuzz}
    JOBS=${KVL_ASAN_JOBS:-$(nproc)}
    build_kind=fuzz
    if [[ -z ${ASAN_SYMBOLIZER_PATH:-} ]] && command -v llvm-symbolizer-14 >/dev/null; then
      export ASAN_SYMBOLIZER_PATH=$(command -v llvm-symbolizer-14)
    fi
    clean="no AddressSanitizer, LeakSanitizer or UBSan report"
    report_lines='ERROR: |SUMMARY: |runtime error:|^    #[0-9] '
    ;;
  thread)
    name=tsan_suite
    BUILD=${KVL_TSAN_BUILD_DIR:-build-tsan}
    JOBS=${KVL_TSAN_JOBS:-$(nproc)}
    build_kind=thread
    clean="no ThreadSanitizer report"
    report_lines='WARNING: |SUMMARY: |^    #[0-9] '
    ;;
  *) echo "sanitizer_suite.sh: KIND must be address or thread, got '$KIND'" >&2; exit 2 ;;
esac

scripts/ci/sanitizer_build.sh "$BUILD" "$build_kind" "$name" "$JOBS"

reports=$(cd "$BUILD" && pwd)/sanitizer_reports  # absolute: every test's cwd differs
log=$BUILD/$name.log
rm -rf "$reports"
mkdir -p "$reports"
# Leaks count; any UBSan report stops its process (-fno-sanitize-recover).
# TSan's suppressions (tests/tsan.supp) name third-party libraries only.
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:log_path=$reports/asan:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp log_path=$reports/tsan second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
start=$(date +%s)
rc=0
OMP_WAIT_POLICY=PASSIVE \
  ctest --test-dir "$BUILD" -j "$JOBS" --timeout 3600 -E '^(Soak|DeployDocker)\.' \
    --output-on-failure "$@" >"$log" 2>&1 || rc=$?
seconds=$(($(date +%s) - start))
summary=$(grep -E 'tests passed, [0-9]+ tests failed' "$log" || echo "no ctest summary")
mapfile -t found < <(find "$reports" -type f | sort)
if [[ $rc -eq 0 && ${#found[@]} -eq 0 ]]; then
  echo "$name: PASS ($summary; $clean; ${seconds}s)"
  exit 0
fi
grep -A12 'The following tests FAILED' "$log" >&2 || true
for f in "${found[@]}"; do
  echo "== $f" >&2
  grep -E "$report_lines" "$f" | head -14 >&2 || head -20 "$f" >&2
done
echo "$name: FAIL ($summary; ${#found[@]} sanitizer report file(s) in $reports; log $log)" >&2
exit 1
