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
