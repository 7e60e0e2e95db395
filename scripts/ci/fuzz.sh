#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (tests/fuzz/README.md): configures
# (once) a clang ASan+UBSan build with coverage in build-fuzz/ (git-ignored),
# builds the targets, and fuzzes each for a while from its seed corpus, up to
# KVL_FUZZ_JOBS (default: nproc) targets at once. Prints one line per target
# (executions, coverage, corpus), in the targets' order, and exits non-zero when
# any target crashed, leaked, timed out or ran out of memory; the input that
# did is saved under BUILD/crashes/<target>/ (add it to tests/fuzz/crashes/ with
# the fix, and the suite replays it from then on).
#   scripts/ci/fuzz.sh                        # every target, 60 s each
#   scripts/ci/fuzz.sh --seconds 30 tokenizer safetensors
#   scripts/ci/fuzz.sh --runs 10000000 --seconds 3600 --out docs/results/fuzz_campaign.txt
#                                          # whichever comes first
#   scripts/ci/fuzz.sh --report tokenizer     # only the lines, from the last run's logs
#   KVL_FUZZ_BUILD_DIR=/tmp/f KVL_FUZZ_JOBS=1 scripts/ci/fuzz.sh
# The corpus each run grows is kept in BUILD/corpus/<target>/ and reused by
# the next run; the committed seeds stay as they are.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Symbolized reports (file:line) need llvm-symbolizer; Debian's is versioned.
if [[ -z ${ASAN_SYMBOLIZER_PATH:-} ]] && command -v llvm-symbolizer-14 >/dev/null; then
  export ASAN_SYMBOLIZER_PATH=$(command -v llvm-symbolizer-14)
fi

BUILD=${KVL_FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${KVL_FUZZ_JOBS:-$(nproc)}
ALL=(tokenizer safetensors model_config translator server_config chat_template chat_request
     openai_request token_alignment)
seconds=
runs=-1
out=
report_only=0
targets=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --report) report_only=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ ${#targets[@]} -gt 0 ]] || targets=("${ALL[@]}")
# 60 s by default; with --runs alone, no time limit.
[[ -n $seconds ]] || { [[ $runs -ge 0 ]] && seconds=0 || seconds=60; }
for t in "${targets[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (targets: ${ALL[*]})" >&2; exit 2; }
done

[[ $report_only -eq 1 ]] || scripts/ci/sanitizer_build.sh "$BUILD" fuzz fuzz "$JOBS" "${targets[@]/#/fuzz_}"

# fuzz_one TARGET: one target's libFuzzer run, its output in its log and its
# exit status in BUILD/fuzz_TARGET.rc (read by report_one).
fuzz_one() {
  local t=$1 rc=0
  local corpus=$BUILD/corpus/$t crashes=$BUILD/crashes/$t log=$BUILD/fuzz_$t.log
  # Inputs up to 64 KiB (the translator seeds are a few KiB); 10 s per input
  # and 4 GiB of memory before an input counts as a hang or a leak of memory.
  ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:${ASAN_OPTIONS:-}" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}" \
    "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -runs="$runs" -max_len=65536 \
      -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$crashes/" \
      "$corpus" tests/fuzz/corpus/$t tests/fuzz/crashes/$t >"$log" 2>&1 || rc=$?
  echo "$rc" >"$BUILD/fuzz_$t.rc"
}

# report_one TARGET: prints the target's line from its log (and, when it
# failed, the log's first errors on stderr); returns 1 when it failed.
report_one() {
  local t=$1 rc=0
  local corpus=$BUILD/corpus/$t crashes=$BUILD/crashes/$t log=$BUILD/fuzz_$t.log
  if [[ $report_only -eq 1 ]]; then
    [[ -f $log ]] || { echo "fuzz.sh: no log $log to report on" >&2; exit 2; }
    # A finished run says "Done"; a crash, leak or violated property says why.
    grep -q '^Done [0-9]* runs' "$log" && ! grep -qE '^==[0-9]+== ?ERROR|fuzz property violated' "$log" || rc=1
  else
    rc=$(cat "$BUILD/fuzz_$t.rc" 2>/dev/null || echo 127)  # no status: the run itself failed
  fi
  local execs secs last cov ft units rss line
  execs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  secs=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | grep -oE 'in [0-9]+' | grep -oE '[0-9]+' || echo "$seconds")
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo 0)
  ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo 0)
  units=$(find "$corpus" -type f | wc -l)
  rss=$(grep -oE 'stat::peak_rss_mb: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  if [[ $rc -eq 0 ]]; then
    line="fuzz $t: OK, $execs executions in ${secs}s, coverage $cov edges ($ft features), corpus $units inputs, peak RSS ${rss} MiB"
  else
    line="fuzz $t: FAIL (exit $rc after $execs executions; inputs in $crashes/, log $log)"
    grep -E 'ERROR: |SUMMARY: |fuzz property violated|runtime error' "$log" | head -5 >&2 || tail -20 "$log" >&2
  fi
  echo "$line"
  report+=("$line")
  [[ $rc -eq 0 ]]
}

for t in "${targets[@]}"; do
  mkdir -p "$BUILD/corpus/$t" "$BUILD/crashes/$t"
done
# Up to JOBS targets fuzz at once, each for the whole of its time (libFuzzer
# runs one process on one core); the lines come in the targets' order, each
# as soon as its target and those before it are done.
pids=()
if [[ $report_only -eq 0 ]]; then
  for i in "${!targets[@]}"; do
    while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n || true; done
    rm -f "$BUILD/fuzz_${targets[i]}.rc"
    fuzz_one "${targets[i]}" &
    pids[i]=$!
  done
fi
status=0
report=()
for i in "${!targets[@]}"; do
  [[ $report_only -eq 1 ]] || wait "${pids[i]}" || true
  report_one "${targets[i]}" || status=1
done
if [[ -n $out ]]; then
  { if [[ $report_only -eq 1 ]]; then
      echo "# scripts/ci/fuzz.sh --report ${targets[*]}: the last run of each target, from its log"
    else
      echo "# scripts/ci/fuzz.sh --seconds $seconds --runs $runs ${targets[*]} (0 s, -1 runs: no limit)"
    fi
    echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(clang++-14 --version | head -1)"
    printf '%s\n' "${report[@]}"; } >"$out"
fi
exit $status
