# examples/s versus number of workers (psflow local, 1 ps); called by bench/plot_charts.sh with
# `dir` = the directory of scaling_{async,sync}.dat (workers, median, min, max in thousands).
set title "mlp on MNIST, psflow local --ps=1 --workers=W, 3000 global steps\n(median of 5 runs, bars: min-max; 2 cores shared with other builds)"
set termoption noenhanced
set xlabel "workers"
set ylabel "examples/s (thousands)"
set xrange [0.7:4.3]
set xtics 1
set yrange [0:*]
set grid ytics
set key bottom right
set arrow from 2,graph 0 to 2,graph 1 nohead dashtype 2 lc rgb "gray50"
set label "2 cores" at 2.05,graph 0.93 tc rgb "gray40"
async = dir."/scaling_async.dat"
sync = dir."/scaling_sync.dat"
has_sync = system("test -s ".sync." && echo 1 || echo 0") + 0
if (has_sync) {
  plot async using 1:2:3:4 with yerrorlines lw 2 pt 7 lc rgb "#1f77b4" title "async", \
       sync using 1:2:3:4 with yerrorlines lw 2 pt 5 lc rgb "#d62728" title "sync (--sync_replicas)"
} else {
  plot async using 1:2:3:4 with yerrorlines lw 2 pt 7 lc rgb "#1f77b4" title "async"
}
