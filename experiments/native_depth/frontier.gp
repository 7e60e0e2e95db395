# The native-depth frontier: recall after the switch against how much sooner
# than a re-prefill its first token comes (4k tokens), one panel per house
# direction, each point labelled with its k.  cd results && gnuplot ../frontier.gp
set terminal pngcairo size 1200,900 font ",10" noenhanced
set output "frontier.png"
set multiplot layout 2,2 title "native-depth dial: recall / re-prefill's against first-token speed-up at 4k (experiments/native_depth)"
set logscale x 2
set xrange [0.5:32]
set yrange [0:1.15]
set xlabel "re-prefill TTFT / dial TTFT at 4k tokens"
set ylabel "recall / re-prefill's"
set key bottom left
set grid
names = "kvl-large->kvl-small kvl-small-b->kvl-small kvl-small->kvl-large kvl-small->kvl-small-b"
do for [i=0:3] {
  set title word(names, i+1)
  plot "frontier.dat" index i using 5:2 with linespoints lw 2 pt 7 title "facts", \
       "frontier.dat" index i using 5:3 with linespoints lw 2 pt 5 title "kv", \
       "frontier.dat" index i using 5:3:(sprintf("k=%d", $1)) with labels offset 0,-1 notitle
}
unset multiplot
