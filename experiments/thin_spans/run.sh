#!/usr/bin/env bash
# Issue 52 item 5: switch TTFT into kvl-gemma (5 of 6 layers sliding, window
# 128) when the translation computes and stores only what the sliding layers
# will read (thin spans, the router's default) against every entry
# (--whole-spans, as before), in one run: bench/translator_bench --switch-only
# on random models of the committed configurations, the committed
# translators' joint maps and anchors (W = 8).
#   experiments/thin_spans/run.sh   (writes results.txt here)
set -euo pipefail
cd "$(dirname "$0")/../.."
BENCH=${KVL_BENCH_BIN:-build/bench/translator_bench}
out=experiments/thin_spans/results.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# thin spans: experiments/thin_spans/run.sh ($(date -u '+%Y-%m-%d'), $(nproc) CPUs)" > "$out"
for source in kvl-small kvl-moe; do
  mkdir -p "$tmp/$source"
  cp "models/configs/$source.json" "$tmp/$source/kvl-small.json"
  cp models/configs/kvl-gemma.json "$tmp/$source/kvl-large.json"
  for mode in thin whole; do
    flag=""
    [ "$mode" = whole ] && flag=--whole-spans
    { echo; echo "## $source -> kvl-gemma, $mode spans"; echo; } >> "$out"
    "$BENCH" --configs "$tmp/$source" --switch-only --contexts 1024,4096 --repeat 3 \
      --inputs joint --direction small-large --threads 2 $flag >> "$out"
  done
done
echo "wrote $out" >&2
