# Seed 002 on simulated hosts (bench/seed002_hosts.py): global steps/s per (partitioner, placement),
# 2 ps on tbf-shaped links, one panel per (model, link rate). Called by bench/plot_seed002_hosts.sh
# with `dir` holding panel_I.dat ("partitioner\nplacement", median steps/s, link limit steps/s,
# traffic max/mean), panel_I.limit (the model's steps/s in one process: the compute limit) and
# panel_I.title, for I = 1..n.
set multiplot layout 1,n title "Seed 002 on simulated hosts: global steps/s (median of runs); labels: link limit, traffic max/mean"
set termoption noenhanced
set bmargin 4.5
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.8
set grid ytics
set yrange [0:*]
set offsets 0, 0, graph 0.25, 0
set key top left box opaque font ",9"
set xtics font ",8"
set ylabel "global steps/s"
do for [i=1:n] {
  f = sprintf("%s/panel_%d", dir, i)
  lim = real(system("cat ".f.".limit"))
  set title system("cat ".f.".title")
  plot f.".dat" using 2:xtic(1) lc rgb (i == 1 ? "#1f77b4" : i == 2 ? "#2ca02c" : "#ff7f0e") title "measured", \
       "" using 0:($2 * 1.05 + 0.02):($3 > 0 ? sprintf("link %.2f\n%.2f", $3, $4) : sprintf("no tbf\n%.2f", $4)) with labels font ",8" notitle, \
       lim with lines dt 2 lw 2 lc rgb "#d62728" title sprintf("one process, all cores %.2f", lim)
  unset ylabel
}
unset multiplot
