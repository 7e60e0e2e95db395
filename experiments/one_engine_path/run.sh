#!/usr/bin/env bash
# Load benchmark A/B for the one-engine-path change (issue 50): the same
# bench/load_bench.py run against two kvl-server binaries, one after the
# other in one sitting, batching on and off.
#   experiments/one_engine_path/run.sh OLD_SERVER NEW_SERVER [OUT_DIR]
# OLD_SERVER: a kvl-server built from the commit before the change (e.g. a
# `git worktree add` of fde2634 built with `cmake --build build --target kvl-server`).
set -euo pipefail
cd "$(dirname "$0")/../.."
old=$1 new=$2 out=${3:-experiments/one_engine_path}
args=(--levels 1,8 --workloads large,mix --turns 4 --max-tokens 64)
/usr/bin/python3 bench/load_bench.py --server "$old" --out "$out/before" "${args[@]}"
/usr/bin/python3 bench/load_bench.py --server "$new" --out "$out/after" "${args[@]}"
