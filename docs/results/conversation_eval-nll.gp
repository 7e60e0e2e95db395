set terminal pngcairo size 1000,600
set output "docs/results/conversation_eval-nll.png"
set title "Lookups over a conversation alternating kvl-small and kvl-large" noenhanced
set xlabel "turn (the second and later turns are switches)" noenhanced
set ylabel "reference answer NLL (nats/token)" noenhanced
set grid
set key top right noenhanced
plot "docs/results/conversation_eval-nll.dat" index 0 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title "reprefill, starting on kvl-small", \
     "docs/results/conversation_eval-nll.dat" index 1 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title "translate, starting on kvl-small", \
     "docs/results/conversation_eval-nll.dat" index 2 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title "translate +repair, starting on kvl-small", \
     "docs/results/conversation_eval-nll.dat" index 3 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title "reprefill, starting on kvl-large", \
     "docs/results/conversation_eval-nll.dat" index 4 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title "translate, starting on kvl-large", \
     "docs/results/conversation_eval-nll.dat" index 5 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title "translate +repair, starting on kvl-large"
