# Test AUC against steps of the ctr model on the generator's two presets, beside each one's Bayes
# AUC; called by bench/ctr_presets_curve.py with `dir` = bench/plots and `out` = the PNG.
set terminal pngcairo size 760,440 font 'sans,10'
set output out
set title "psflow train --model=ctr (one process, batch 1024, default flags)\ntest AUC on 65536 examples; dashed: Bayes AUC of each preset"
set termoption noenhanced
set xlabel "steps of 1024"
set ylabel "test AUC"
set grid ytics
set key bottom right
criteo = dir."/ctr_presets_criteo.dat"
learnable = dir."/ctr_presets_learnable.dat"
plot learnable using 1:2 with linespoints lw 2 pt 7 lc rgb "#2ca02c" title "--ctr_preset=learnable", \
     learnable using 1:3 with lines dashtype 2 lc rgb "#2ca02c" notitle, \
     learnable using 1:($3-0.01) with lines dashtype 3 lc rgb "#98df8a" title "learnable: Bayes - 0.01", \
     criteo using 1:2 with linespoints lw 2 pt 5 lc rgb "#1f77b4" title "--ctr_preset=criteo (default)", \
     criteo using 1:3 with lines dashtype 2 lc rgb "#1f77b4" notitle
