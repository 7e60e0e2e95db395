#!/usr/bin/env bash
# Real model shapes on this machine (issue 51): random-initialised checkpoints
# with the configurations of Qwen3-0.6B and Qwen3-1.7B (bench/shapes/), then,
# in one sitting:
#   1. decode: bench/batch_step_bench at 1, 8 and 32 sessions, one-token
#      steps as 1-row GEMMs against matrix-vector products (the default), with
#      the machine's read bandwidth and GEMM rates (float32, bfloat16) measured
#      in the same run and each step as a fraction of its limit;
#   2. switch: bench/translator_bench --switch-only, time to first token after
#      a translated switch against a re-prefill, 0.6B -> 1.7B and 1.7B -> 0.6B,
#      maps reading 2 source layers each (band 2: the house translators' band
#      "all" would be 28x the maps, 13 GB at these shapes), anchored (8 tokens,
#      rank 64) as a real vocabulary needs;
#   3. the switch curve plotted as the paper's Figure 6.
# Quality does not matter here (random weights), cost does.
#   scripts/report/real_shapes.sh [WORK_DIR]       # default /var/tmp/kvl-real-shapes
#   KVL_REAL_CONTEXTS=256,1024 scripts/report/real_shapes.sh  # default 256,1024,4096,8192
#   KVL_REAL_PARTS=decode scripts/report/real_shapes.sh   # one part: decode or switch
# WORK_DIR holds the checkpoints (2.4 GB + 6.8 GB, float32; reused when
# there). Output: docs/results/real_shapes/{decode_qwen3-0.6b,decode_qwen3-1.7b,
# switch}.txt, switch.dat, switch.gp, switch.png.
# KVL_REAL_STEPS: median of N decode steps per cell (default 10).
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
BENCH=${KVL_BENCH_DIR:-build/bench}
work=${1:-/var/tmp/kvl-real-shapes}
contexts=${KVL_REAL_CONTEXTS:-256,1024,4096,8192}
steps=${KVL_REAL_STEPS:-10}
parts=${KVL_REAL_PARTS:-decode switch}
out=docs/results/real_shapes
for bin in "$KVL" "$BENCH/batch_step_bench" "$BENCH/translator_bench"; do
  [ -x "$bin" ] || { echo "real_shapes: $bin is not built (cmake -DKVL_BUILD_BENCH=ON)" >&2; exit 1; }
done
mkdir -p "$work/pair" "$out"
for m in qwen3-0.6b qwen3-1.7b; do
  if [ ! -f "$work/$m/model.safetensors" ]; then
    "$KVL" init-model --config "bench/shapes/$m.json" --out "$work/$m" --seed 1
  fi
done

if [[ " $parts " == *" decode "* ]]; then
  for m in qwen3-0.6b qwen3-1.7b; do
    "$BENCH/batch_step_bench" --model "$work/$m" --compare matvec --rows 1,8,32 --history 256 \
      --steps "$steps" --limits --out "$out/decode_$m.txt"
  done
fi

if [[ " $parts " == *" switch "* ]]; then
  # translator_bench reads the pair as kvl-small.json and kvl-large.json.
  cp bench/shapes/qwen3-0.6b.json "$work/pair/kvl-small.json"
  cp bench/shapes/qwen3-1.7b.json "$work/pair/kvl-large.json"
  "$BENCH/translator_bench" --configs "$work/pair" --contexts "$contexts" --switch-only \
    --band 2 --anchor-window 8 --anchor-rank 64 --threads 2 --out "$out/switch.txt"

  # The plot: (a) translated and (b) re-prefilled time to first token against
  # the context, one block per direction.
  awk -F'|' '
    /^small->large: TTFT/ { if (n++) print "\n"; print "# 0.6B -> 1.7B: T translated_ms reprefill_ms" }
    /^large->small: TTFT/ { if (n++) print "\n"; print "# 1.7B -> 0.6B: T translated_ms reprefill_ms" }
    /^\| [0-9]/ { gsub(/ /, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4); print $2, $3, $4 }
  ' "$out/switch.txt" > "$out/switch.dat"
  cat > "$out/switch.gp" <<'EOF'
set terminal pngcairo size 1100,450 font ",10" noenhanced
set output "switch.png"
set multiplot layout 1,2 title "time to first token after a switch, Qwen3 shapes, random weights, 2-core CPU (scripts/report/real_shapes.sh)"
set logscale xy 2
set xlabel "context (tokens)"
set ylabel "ms"
set key top left
set grid
do for [i=0:1] {
  set title word("0.6B->1.7B 1.7B->0.6B", i+1)
  plot "switch.dat" index i using 1:3 with linespoints lw 2 title "re-prefill", \
       "switch.dat" index i using 1:2 with linespoints lw 2 title "translated (KV-Lingo)"
}
unset multiplot
EOF
  (cd "$out" && gnuplot switch.gp)
fi
echo "real_shapes: wrote $out"
