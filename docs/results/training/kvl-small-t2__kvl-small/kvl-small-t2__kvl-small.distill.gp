set terminal pngcairo size 1000,600
set output "docs/results/training/kvl-small-t2__kvl-small/kvl-small-t2__kvl-small.distill.png"
set title "kvl distill: kvl-small-t2__kvl-small.distill" noenhanced
set xlabel "step" noenhanced
set ylabel "KL(native || translated), nats/token" noenhanced
set grid
set key top right noenhanced
set logscale y
plot "docs/results/training/kvl-small-t2__kvl-small/kvl-small-t2__kvl-small.distill.dat" index 0 using 1:2 with lines lw 2 title "train KL (per step)", \
     "docs/results/training/kvl-small-t2__kvl-small/kvl-small-t2__kvl-small.distill.dat" index 1 using 1:2 with lines lw 2 title "train KL (trailing mean of 20)", \
     "docs/results/training/kvl-small-t2__kvl-small/kvl-small-t2__kvl-small.distill.dat" index 2 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title "validation KL"
