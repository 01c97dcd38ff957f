# Seed 002 on simulated hosts (bench/seed002_hosts.py): global steps/s per (partitioner, placement),
# 2 ps on tbf-shaped links, for cnn and vgg19. Called by bench/plot_charts.sh with `dir` holding
# seed002_{cnn,vgg19}.dat ("partitioner\nplacement", steps/s, link limit steps/s, traffic max/mean)
# and seed002_{cnn,vgg19}.limit (the same model's steps/s in one process: the compute limit), and
# `title_cnn`, `title_vgg` naming the workers and link rate.
set multiplot layout 1,2 title "Seed 002 on simulated hosts: global steps/s (bars); labels: link limit (rate / bytes per step on the busiest ps), max/mean"
set termoption noenhanced
set bmargin 4.5
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.8
set grid ytics
set yrange [0:*]
set offsets 0, 0, graph 0.2, 0
set key top left box opaque font ",9"
set xtics font ",9"
set ylabel "global steps/s"
set title title_cnn
lim = real(system("cat ".dir."/seed002_cnn.limit"))
plot dir."/seed002_cnn.dat" using 2:xtic(1) lc rgb "#1f77b4" title "measured", \
     "" using 0:($2 * 1.06 + 0.05):(sprintf("link %.1f\n%.2f", $3, $4)) with labels font ",8" notitle, \
     lim with lines dt 2 lw 2 lc rgb "#d62728" title sprintf("one process (compute limit) %.2f", lim)
unset ylabel
set title title_vgg
lim = real(system("cat ".dir."/seed002_vgg19.limit"))
plot dir."/seed002_vgg19.dat" using 2:xtic(1) lc rgb "#ff7f0e" title "measured", \
     "" using 0:($2 * 1.06 + 0.01):(sprintf("link %.2f\n%.2f", $3, $4)) with labels font ",8" notitle, \
     lim with lines dt 2 lw 2 lc rgb "#d62728" title sprintf("one process (compute limit) %.2f", lim)
unset multiplot
