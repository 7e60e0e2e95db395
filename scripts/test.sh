#!/usr/bin/env bash
# The README's test command and the whole CI gate (.ci/run runs it): installs
# everything (scripts/setup.sh), builds the test build (benchmarks off), and
# runs every test, one tier after another (docs/testing.md, "Tiers"):
#   packages   scripts/setup.sh, packages only
#   build      scripts/setup.sh's configure and build, KVL_BUILD_BENCH=OFF
#   tiers      every test carries exactly one tier label (ctest -N)
#   fast       ctest -L fast: a failure here stops the run
#   slow, deploy, soak
#   sanitizer  TSan, ASan+UBSan and fuzzing, each in a build dir of its own
# Prints each stage's seconds and result in a table at the end, then ctest's
# closing line summed over the tiers that ran. Exits non-zero on any failure.
#   scripts/test.sh                            # everything
#   KVL_TEST_TIERS="fast slow" scripts/test.sh # these tiers only (after the build)
#   scripts/test.sh -R Router                  # extra arguments go to every ctest
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KVL_BUILD_DIR:-build}
TIERS=${KVL_TEST_TIERS:-fast slow deploy soak sanitizer}
ALL_TIERS="fast slow deploy soak sanitizer"
LOGS=$BUILD_DIR/test_logs

stage_names=() stage_seconds=() stage_results=()
status=0 tests_run=0 tests_failed=0 test_seconds=0

# stage NAME CMD...: runs CMD and records its wall time and result.
stage() {
  local name=$1; shift
  echo "=== stage $name: $*"
  local start=$SECONDS rc=0
  "$@" || rc=$?
  stage_names+=("$name")
  stage_seconds+=($((SECONDS - start)))
  if [[ $rc -eq 0 ]]; then stage_results+=(pass); else stage_results+=("FAIL (exit $rc)"); status=1; fi
  return $rc
}

# The table and the closing line; the exit status.
finish() {
  local i total=0
  echo
  printf '%-10s %8s  %s\n' stage seconds result
  for i in "${!stage_names[@]}"; do
    printf '%-10s %8d  %s\n' "${stage_names[$i]}" "${stage_seconds[$i]}" "${stage_results[$i]}"
    total=$((total + stage_seconds[i]))
  done
  for t in $TIERS; do
    [[ " ${stage_names[*]} " == *" $t "* ]] || printf '%-10s %8s  %s\n' "$t" - "not run"
  done
  printf '%-10s %8d\n' total "$total"
  if [[ $tests_run -gt 0 ]]; then
    # ctest's own closing line, over every tier that ran.
    local passed=$((tests_run - tests_failed))
    local percent=$(((passed * 100 + tests_run / 2) / tests_run))
    [[ $tests_failed -gt 0 && $percent -gt 99 ]] && percent=99
    echo
    echo "$percent% tests passed, $tests_failed tests failed out of $tests_run"
    echo
    echo "Total Test time (real) = $test_seconds sec"
  fi
  exit $status
}

# ctest_tier TIER [ctest arguments...]: one tier's tests, its output kept in
# LOGS/TIER.log; adds its counts to the totals.
ctest_tier() {
  local tier=$1; shift
  local log=$LOGS/$tier.log rc=0 start=$SECONDS
  local no_tests=error
  [[ $# -gt 0 ]] && no_tests=ignore  # a -R may leave a tier empty
  ctest --test-dir "$BUILD_DIR" -L "^$tier\$" --no-tests=$no_tests --output-on-failure \
    --timeout 900 "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  test_seconds=$((test_seconds + SECONDS - start))
  local line n failed
  line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1)
  if [[ -n $line ]]; then
    n=${line##* }
    failed=$(sed -E 's/.* ([0-9]+) tests failed.*/\1/' <<<"$line")
    tests_run=$((tests_run + n))
    tests_failed=$((tests_failed + failed))
  fi
  return $rc
}

# tiers: every test has exactly one tier label, so that the tiers together
# run the whole suite (a test without one would run in none).
check_tiers() {
  count() { ctest --test-dir "$BUILD_DIR" -N "$@" | sed -nE 's/^Total Tests: ([0-9]+)$/\1/p'; }
  local all sum=0 n t
  all=$(count)
  [[ -n $all && $all -gt 0 ]] || { echo "tiers: ctest -N lists no tests" >&2; return 1; }
  for t in $ALL_TIERS; do
    n=$(count -L "^$t\$")
    echo "tier $t: $n tests"
    sum=$((sum + n))
  done
  local labelled
  labelled=$(count -L "^(${ALL_TIERS// /|})\$")
  if [[ $sum -ne $all || $labelled -ne $all ]]; then
    echo "tiers: $all tests, $labelled with a tier label, $sum tier labels in all;" \
         "every test needs exactly one of: $ALL_TIERS (tests/CMakeLists.txt)" >&2
    ctest --test-dir "$BUILD_DIR" -N -LE "^(${ALL_TIERS// /|})\$" >&2
    return 1
  fi
  echo "tiers: each of the $all tests has exactly one tier label"
}

stage packages env KVL_SKIP_BUILD=1 scripts/setup.sh || finish
stage build env KVL_BUILD_BENCH=OFF scripts/setup.sh || finish
mkdir -p "$LOGS"
stage tiers check_tiers || finish
for tier in $TIERS; do
  case $tier in
    fast) stage fast ctest_tier fast -j "$(nproc)" "$@" || finish ;;  # fail fast
    sanitizer) stage sanitizer ctest_tier sanitizer -V "$@" ;;       # their one-line verdicts
    slow|deploy|soak) stage "$tier" ctest_tier "$tier" -j "$(nproc)" "$@" ;;
    *) echo "test.sh: unknown tier '$tier' (tiers: $ALL_TIERS)" >&2; status=2; finish ;;
  esac
done
finish
