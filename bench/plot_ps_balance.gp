# MB of variables held by each of 2 ps tasks, per (partitioner, placement), for cnn and vgg19;
# called by bench/plot_charts.sh with `dir` = the directory of balance_{cnn,vgg19}.dat
# ("partitioner\nplacement", MB on ps 0, MB on ps 1, max/mean).
set multiplot layout 1,2 title "Bytes held per ps, 2 ps (each step pulls and pushes them); numbers: max/mean over the ps"
set termoption noenhanced
set bmargin 4.5
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics
set yrange [0:*]
set key top right
set xtics font ",9"
set ylabel "MB on the ps"
set title "cnn (13.1 MB)"
plot dir."/balance_cnn.dat" using 2:xtic(1) lc rgb "#1f77b4" title "ps 0", \
     "" using 3 lc rgb "#ff7f0e" title "ps 1", \
     "" using 0:(($2 > $3 ? $2 : $3) * 1.04):(sprintf("%.3f", $4)) with labels font ",9" notitle
unset ylabel
set title "vgg19 (155.8 MB)"
plot dir."/balance_vgg19.dat" using 2:xtic(1) lc rgb "#1f77b4" title "ps 0", \
     "" using 3 lc rgb "#ff7f0e" title "ps 1", \
     "" using 0:(($2 > $3 ? $2 : $3) * 1.04):(sprintf("%.3f", $4)) with labels font ",9" notitle
unset multiplot
