#!/usr/bin/env bash
# Time to first token after a switch against a re-prefill of the history, at
# 1k and 4k tokens, between the house models of different architectures
# (issue 52), and between the Qwen3 pair in the same run for comparison:
# bench/translator_bench --switch-only on random models of the committed
# configurations (cost depends on shapes, not on weights), both directions of
# kvl-small <-> kvl-large, kvl-small <-> kvl-gemma, kvl-small <-> kvl-moe and
# kvl-gemma <-> kvl-moe, with the committed translators' map inputs
# (joint, but split for kvl-small -> kvl-large). translator_bench calls its two models "small" and
# "large": each section's header says which configuration each is.
# Writes docs/results/family_switch_bench.txt.
#   scripts/report/family_switch_bench.sh
# Needs the benchmarks: cmake -DKVL_BUILD_BENCH=ON build && ninja -C build bench/translator_bench
set -euo pipefail
cd "$(dirname "$0")/../.."
BENCH=${KVL_BENCH_BIN:-build/bench/translator_bench}
out=docs/results/family_switch_bench.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
  echo "# Switch TTFT across architectures: scripts/report/family_switch_bench.sh ($(date -u '+%Y-%m-%d'), $(nproc) CPUs)"
  echo
} > "$out"
for pair in kvl-small:kvl-large kvl-small:kvl-gemma kvl-small:kvl-moe kvl-gemma:kvl-moe; do
  a=${pair%%:*}; b=${pair##*:}
  inputs=joint
  [ "$pair" = kvl-small:kvl-large ] && inputs=split,joint  # as the committed translators
  mkdir -p "$tmp/$a-$b"
  cp "models/configs/$a.json" "$tmp/$a-$b/kvl-small.json"
  cp "models/configs/$b.json" "$tmp/$a-$b/kvl-large.json"
  { echo "## small = $a, large = $b"; echo; } >> "$out"
  "$BENCH" --configs "$tmp/$a-$b" --switch-only --contexts 1024,4096 --repeat 3 --inputs "$inputs" \
    --threads 2 >> "$out"
  echo >> "$out"
done
echo "wrote $out" >&2
