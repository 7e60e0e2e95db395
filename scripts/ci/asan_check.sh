#!/usr/bin/env bash
# The parser tests under AddressSanitizer + UndefinedBehaviorSanitizer: builds
# them in the clang build dir scripts/ci/fuzz.sh uses (build-fuzz/, git-ignored;
# scripts/ci/sanitizer_build.sh), runs each, prints one line and exits non-zero
# on a test failure or any sanitizer report.
#   scripts/ci/asan_check.sh
#   KVL_FUZZ_BUILD_DIR=/tmp/f KVL_ASAN_JOBS=1 scripts/ci/asan_check.sh
# The tests: those that run neither kvl-server nor kvl (KVL_TESTS_WITHOUT_BINARIES
# in tests/CMakeLists.txt): safetensors, checkpoint config, chat template,
# server config, chat request validation, and the batch scheduler. Logs are
# BUILD/asan_<test>.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Symbolized reports (file:line) need llvm-symbolizer; Debian's is versioned.
if [[ -z ${ASAN_SYMBOLIZER_PATH:-} ]] && command -v llvm-symbolizer-14 >/dev/null; then
  export ASAN_SYMBOLIZER_PATH=$(command -v llvm-symbolizer-14)
fi

BUILD=${KVL_FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${KVL_ASAN_JOBS:-$(nproc)}
TESTS=(model_safetensors_test model_config_test model_chat_template_test model_utf8_test server_config_test
       server_chat_request_test model_scheduler_test)

scripts/ci/sanitizer_build.sh "$BUILD" fuzz asan_check "$JOBS" "${TESTS[@]/#/tests/}"

start=$(date +%s)
failed=()
passed=0
for t in "${TESTS[@]}"; do
  log=$BUILD/asan_$t.log
  rc=0
  # Leaks count (detect_leaks); any UBSan report stops the test
  # (-fno-sanitize-recover in the build); tests run from the source root.
  ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:${ASAN_OPTIONS:-}" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}" \
  KVL_SOURCE_DIR=$PWD KVL_BINARY_DIR=$BUILD OMP_WAIT_POLICY=PASSIVE \
    "$BUILD/tests/$t" >"$log" 2>&1 || rc=$?
  n=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  if [[ $rc -ne 0 ]] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log"; then
    failed+=("$t")
    grep -E 'ERROR: |SUMMARY: |runtime error:|^\[  FAILED' "$log" | head -10 >&2 || tail -20 "$log" >&2
  fi
  passed=$((passed + n))
done
seconds=$(($(date +%s) - start))
if [[ ${#failed[@]} -eq 0 ]]; then
  echo "asan_check: PASS (${#TESTS[@]} test binaries, $passed tests, no AddressSanitizer/UBSan report, ${seconds}s)"
  exit 0
fi
echo "asan_check: FAIL (${failed[*]}; logs $BUILD/asan_<test>.log)" >&2
exit 1
