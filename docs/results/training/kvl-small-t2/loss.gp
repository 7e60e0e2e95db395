set terminal pngcairo size 1000,600
set output "build/house/curriculum/kvl-small-t2/mix/loss.png"
set title "kvl train-lm: mix" noenhanced
set xlabel "step" noenhanced
set ylabel "cross-entropy (nats/token)" noenhanced
set grid
set key top right noenhanced
plot "build/house/curriculum/kvl-small-t2/mix/loss.dat" index 0 using 1:2 with lines lw 2 title "train loss (per step)", \
     "build/house/curriculum/kvl-small-t2/mix/loss.dat" index 1 using 1:2 with lines lw 2 title "train loss (trailing mean of 20)", \
     "build/house/curriculum/kvl-small-t2/mix/loss.dat" index 2 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title "valid loss (fp32)"
