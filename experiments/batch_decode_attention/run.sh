#!/usr/bin/env bash
# Issue 34: does per-row attention cost hold batched decoding back, and how
# much of the model's batching gain reaches the server's clients?
# 1. bench/batch_step_bench: one decode step of R rows, the tensor path and
#    ops::DecodeAttention in turns (same run);
# 2. bench/load_bench.py at 1 and 8 kvl-large sessions, batching on and off.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=experiments/batch_decode_attention
ninja -C build bench/batch_step_bench server/kvl-server >/dev/null
build/bench/batch_step_bench --steps 40 --out "$here/step_bench.txt"
/usr/bin/python3 bench/load_bench.py --server build/server/kvl-server --out /tmp/kvl_batch_attention_load \
  --turns 4 --max-tokens 64 --levels 1,8 --workloads large >/dev/null 2>&1
grep -v '^"' /tmp/kvl_batch_attention_load.txt > "$here/load_bench_1_8.txt"
cat "$here/load_bench_1_8.txt"
