#!/usr/bin/env bash
# A/B between a base revision and this checkout, in one sitting: builds the
# base revision's bench/translator_bench (or, with --server, its kvl-server) in
# a git worktree (build/ab/<rev>, configured like build/), then runs base and
# current alternately, each round with the same arguments, so that both see
# the same (shared, noisy) machine. Writes every run's report, labelled, to
# --out. With --server the runs are this checkout's bench/server_bench.py
# against each server binary.
#
#   bench/bench_ab.sh BASE_REV [--server] [--rounds N] [--out FILE] [-- bench args]
#
# Needs build/ configured from this checkout (scripts/setup.sh); the current
# side is rebuilt first. --out is relative to the repository root. Examples
# (docs/model-runtime.md, docs/server-bench.md):
#   bench/bench_ab.sh a929e77 --rounds 2 --out docs/results/key_transform_ab.txt \
#     -- --threads 1 --contexts 1024,4096 --repeat 3
#   bench/bench_ab.sh a929e77 --server --rounds 2 --out docs/results/server_switch_ab.txt \
#     -- --history 1000,3800 --reps 5 --concurrency 1 --turns 1
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 ]]; then
  echo "usage: bench/bench_ab.sh BASE_REV [--server] [--rounds N] [--out FILE] [-- bench args]" >&2
  exit 2
fi
base_rev=$1
shift
rounds=2
out=""
target=bench/translator_bench
while [[ $# -gt 0 ]]; do
  case $1 in
    --server) target=server/kvl-server; shift ;;
    --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --) shift; break ;;
    *) echo "bench_ab: unknown option $1" >&2; exit 2 ;;
  esac
done
bench_args=("$@")

current=build/$target
if [[ ! -f build/build.ninja ]]; then
  echo "bench_ab: build/ is not configured; run scripts/setup.sh first" >&2
  exit 1
fi
# Both sides' benchmark programs: the server bench also runs the C++ client.
targets=("$target")
[[ $target == server/kvl-server ]] && targets+=(bench/ttft_client)
ninja -C build "${targets[@]}" >/dev/null
sha=$(git rev-parse --verify "$base_rev^{commit}")
short=${sha:0:12}
tree=build/ab/$short
if [[ ! -e $tree/.git ]]; then
  rm -rf "$tree"
  git worktree prune
  git worktree add --detach "$tree" "$sha" >/dev/null
fi
cmake -S "$tree" -B "$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$tree/build" "${targets[@]}" >/dev/null
base=$tree/build/$target

report=$(mktemp)
trap 'rm -f "$report"' EXIT
{
  echo "# bench/bench_ab.sh $base_rev$([[ $target == server/kvl-server ]] && echo ' --server') --rounds $rounds -- ${bench_args[*]}"
  echo "# base = $short ($(git log -1 --format=%s "$sha" | cut -c1-80))"
  echo "# current = $(git rev-parse --short=12 HEAD)$( [[ -z $(git status --porcelain -- . ':!docs') ]] || echo ' + uncommitted changes')"
  echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S') UTC, load at start: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
} | tee "${out:-/dev/null}"
for ((r = 1; r <= rounds; r++)); do
  for side in base current; do
    bin=$base
    [[ $side == current ]] && bin=$current
    if [[ $target == server/kvl-server ]]; then
      /usr/bin/python3 bench/server_bench.py --server "$bin" "${bench_args[@]}" --out "$report" >/dev/null
    else
      "$bin" "${bench_args[@]}" --out "$report" >/dev/null
    fi
    {
      echo
      echo "== round $r: $side"
      cat "$report"
    } | tee -a "${out:-/dev/null}"
  done
done
