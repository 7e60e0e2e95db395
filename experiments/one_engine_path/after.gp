set terminal pngcairo size 1100,450 font ",10" noenhanced
set output "after.png"
set multiplot layout 1,2 title "kvl-server load benchmark (bench/load_bench.py)"
set logscale x 2
set xlabel "concurrent sessions"
set key top left
set grid
set ylabel "generated tokens/s (all sessions)"
plot for [i=0:3] "after.dat" index i using 1:2 with linespoints lw 2 \
     title word("large-batched large-unbatched mix-batched mix-unbatched", i+1)
set ylabel "client TTFT p99 (ms)"
set logscale y
plot for [i=0:3] "after.dat" index i using 1:3 with linespoints lw 2 \
     title word("large-batched large-unbatched mix-batched mix-unbatched", i+1)
unset multiplot
