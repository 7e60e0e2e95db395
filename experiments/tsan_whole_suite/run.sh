#!/usr/bin/env bash
# Counts ThreadSanitizer reports per process for a few concurrency tests of
# the TSan build (scripts/ci/tsan_suite.sh builds it), with and without the
# suppressions of tests/tsan.supp (third-party libraries only) and with and
# without the happens-before edges of base/tsan/hidden_sync.cc
# (KVL_TSAN_HIDDEN_SYNC=0 turns them off). Writes summary.txt here.
# Usage: experiments/tsan_whole_suite/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${KVL_TSAN_BUILD_DIR:-build-tsan}
TESTS='TurnPoolTest|DrainGateTest|AuthServerTest|RouterTest.TurnsWaitFor'
out=experiments/tsan_whole_suite/summary.txt
{
  echo "# experiments/tsan_whole_suite/run.sh on $(git rev-parse --short HEAD), $(date -u +%F)"
  echo "# ctest -R '$TESTS' in $BUILD; one line per process that reported"
} >"$out"
for config in "none 0" "none 1" "tests/tsan.supp 0" "tests/tsan.supp 1"; do
  read -r supp edges <<<"$config"
  dir=$(mktemp -d)
  opts="log_path=$dir/tsan"
  [[ $supp != none ]] && opts="suppressions=$PWD/$supp $opts"
  result=$(KVL_TSAN_HIDDEN_SYNC=$edges TSAN_OPTIONS="$opts" OMP_WAIT_POLICY=PASSIVE \
             ctest --test-dir "$BUILD" -j2 -R "$TESTS" 2>&1 | grep -E 'tests passed' || true)
  total=$(cat "$dir"/tsan.* 2>/dev/null | grep -c 'WARNING: ThreadSanitizer' || true)
  echo "suppressions: $supp; hidden_sync edges: $edges; $result; $total reports" >>"$out"
  for f in "$dir"/tsan.*; do
    [[ -e $f ]] || continue
    binary=$(grep -m1 -oE '\(([a-z_-]+)\+0x' "$f" | sed -E 's/^\(//; s/\+0x$//')
    top=$(grep -A3 'WARNING: ThreadSanitizer' "$f" | grep -E '^ +#0 ' |
            sed -E 's/^ +#0 //; s/ \(.*//; s/[<(].*//' | cut -c1-60 | sort | uniq -c |
            sort -rn | head -3 | awk '{c=$1; $1=""; printf "%s x%s;", $0, c}')
    echo "  $binary: $(grep -c 'WARNING: ThreadSanitizer' "$f") reports; top frames:$top" >>"$out"
  done
  rm -rf "$dir"
done
cat "$out"
