#!/usr/bin/env bash
# Charts for the README from the benchmarks' JSON lines (gnuplot; Debian package gnuplot-nox):
#   docs/img/scaling.svg     examples/s versus number of workers (bench/scaling_workers.py)
#   docs/img/ps_balance.svg  bytes held per ps with and without partitioning (bench/ps_balance.py)
#
#   bench/plot_charts.sh                    # plot the committed measurements in bench/plots/
#   bench/plot_charts.sh --measure build    # re-measure with build/psflow first (several minutes), then plot
#   FORMAT=png bench/plot_charts.sh         # PNG (pngcairo) instead of SVG
#
# Inputs: bench/plots/scaling_async.jsonl, bench/plots/scaling_sync.jsonl (optional),
# bench/plots/ps_balance.jsonl. Outputs go to OUT_DIR (default docs/img).
set -euo pipefail
cd "$(dirname "$0")/.."
FORMAT=${FORMAT:-svg}
OUT_DIR=${OUT_DIR:-docs/img}
PLOTS=bench/plots
PYTHON=/usr/bin/python3  # Debian's python: the scripts need only the standard library

if [[ "${1:-}" == "--measure" ]]; then
  build=${2:?usage: bench/plot_charts.sh --measure BUILD_DIR}
  mkdir -p "$PLOTS"
  # The exact commands behind the committed figures:
  bench/scaling_workers.py --build "$build" --steps 3000 --repeats 5 | tee "$PLOTS/scaling_async.jsonl"
  bench/scaling_workers.py --build "$build" --steps 3000 --repeats 5 --sync | tee "$PLOTS/scaling_sync.jsonl"
  bench/ps_balance.py --build "$build" | tee "$PLOTS/ps_balance.jsonl"
fi

case "$FORMAT" in
  svg) terminal="svg size 760,440 dynamic font 'sans,12' background rgb 'white'" ;;
  png) terminal="pngcairo size 760,440 font 'sans,10'" ;;
  *) echo "FORMAT must be svg or png, not '$FORMAT'" >&2; exit 2 ;;
esac
command -v gnuplot > /dev/null || { echo "gnuplot is missing: apt-get install gnuplot-nox" >&2; exit 1; }
mkdir -p "$OUT_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# JSON lines -> whitespace-separated tables gnuplot reads.
"$PYTHON" - "$PLOTS" "$tmp" <<'PY'
import json, os, sys
plots, tmp = sys.argv[1], sys.argv[2]
for mode in ("async", "sync"):
    src = os.path.join(plots, f"scaling_{mode}.jsonl")
    rows = [json.loads(l) for l in open(src)] if os.path.exists(src) else []
    with open(os.path.join(tmp, f"scaling_{mode}.dat"), "w") as out:
        for r in rows:  # workers, median, min, max (thousands of examples/s)
            lo = r.get("min_examples_per_sec", r["examples_per_sec"])
            hi = r.get("max_examples_per_sec", r["examples_per_sec"])
            out.write(f"{r['workers']} {r['examples_per_sec']/1e3:.2f} {lo/1e3:.2f} {hi/1e3:.2f}\n")
for model in ("cnn", "vgg19"):
    with open(os.path.join(tmp, f"balance_{model}.dat"), "w") as out:
        for l in open(os.path.join(plots, "ps_balance.jsonl")):
            r = json.loads(l)
            if r["model"] != model:
                continue
            mb = [4 * p / 1e6 for p in r["params_per_ps"]]  # float32 variables held
            label = f"\"{r['partitioner']}\\n{r['placement']}\""
            out.write(f"{label} {mb[0]:.2f} {mb[1]:.2f} {r['max_over_mean_params']:.3f}\n")
PY

gnuplot -e "set terminal $terminal; set output '$OUT_DIR/scaling.$FORMAT'; dir='$tmp'" bench/plot_scaling.gp
gnuplot -e "set terminal $terminal; set output '$OUT_DIR/ps_balance.$FORMAT'; dir='$tmp'" bench/plot_ps_balance.gp
echo "wrote $OUT_DIR/scaling.$FORMAT and $OUT_DIR/ps_balance.$FORMAT"
