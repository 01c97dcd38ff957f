#!/usr/bin/env bash
# Chart of seed 002 on simulated hosts from bench/plots/seed002_hosts.jsonl (bench/seed002_hosts.py):
# docs/img/seed002_hosts.svg, global steps/s per (partitioner, placement) for cnn and vgg19, with
# each run's link limit and the one-process compute limit. Needs gnuplot (gnuplot-nox).
#   bench/plot_seed002_hosts.sh [JSONL]        FORMAT=png for PNG; OUT_DIR (default docs/img)
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-bench/plots/seed002_hosts.jsonl}
FORMAT=${FORMAT:-svg}
OUT_DIR=${OUT_DIR:-docs/img}
case "$FORMAT" in
  svg) terminal="svg size 900,460 dynamic font 'sans,12' background rgb 'white'" ;;
  png) terminal="pngcairo size 900,460 font 'sans,10'" ;;
  *) echo "FORMAT must be svg or png, not '$FORMAT'" >&2; exit 2 ;;
esac
command -v gnuplot > /dev/null || { echo "gnuplot is missing: apt-get install gnuplot-nox" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=$(/usr/bin/python3 - "$src" "$tmp" <<'PY'
import json, os, statistics, sys
src, tmp = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(src) if l.strip()]
runs = [r for r in rows if r.get("kind") != "compute_limit"]
limits, last = {}, None  # a compute limit belongs to the runs just before it (same load)
for r in rows:
    if r.get("kind") == "compute_limit":
        limits[last if last and last[0] == r["model"] else (r["model"], None)] = r["global_steps_per_sec"]
    elif r["link_rate"] != "unshaped":
        last = (r["model"], r["link_rate"])
panels = []
for r in runs:  # one panel per (model, link rate); unshaped runs join their model's first panel
    if r["link_rate"] != "unshaped" and (r["model"], r["link_rate"]) not in panels:
        panels.append((r["model"], r["link_rate"]))
for i, (model, rate) in enumerate(panels, 1):
    first = [p for p in panels if p[0] == model][0] == (model, rate)
    mine = [r for r in runs if r["model"] == model and (r["link_rate"] == rate or first and r["link_rate"] == "unshaped")]
    configs = []
    for r in mine:
        if (r["partitioner"], r["placement"], r["link_rate"]) not in configs:
            configs.append((r["partitioner"], r["placement"], r["link_rate"]))
    with open(os.path.join(tmp, f"panel_{i}.dat"), "w") as out:
        for c in configs:
            rs = [r for r in mine if (r["partitioner"], r["placement"], r["link_rate"]) == c]
            label = f"{c[0]}\\n{c[1]}" + ("\\nunshaped" if c[2] == "unshaped" else "")
            out.write(f"\"{label}\" {statistics.median(r['global_steps_per_sec'] for r in rs):.3f} "
                      f"{statistics.mean(r['link_limit_steps_per_sec'] or 0 for r in rs):.2f} "
                      f"{statistics.mean(r['max_over_mean_traffic'] for r in rs):.2f}\n")
    with open(os.path.join(tmp, f"panel_{i}.limit"), "w") as out:
        out.write(f"{limits.get((model, rate), limits.get((model, None), 0))}\n")
    with open(os.path.join(tmp, f"panel_{i}.title"), "w") as out:
        out.write(f"{model}: 2 ps + {mine[0]['workers']} workers, ps links {rate}\n")
print(len(panels))
PY
)
mkdir -p "$OUT_DIR"
width=$((420 * n + 100)); [ "$width" -lt 760 ] && width=760
case "$FORMAT" in
  svg) terminal="svg size $width,460 dynamic font 'sans,12' background rgb 'white'" ;;
  png) terminal="pngcairo size $width,460 font 'sans,10'" ;;
esac
gnuplot -e "set terminal $terminal; set output '$OUT_DIR/seed002_hosts.$FORMAT'; dir='$tmp'; n=$n" bench/plot_seed002_hosts.gp
echo "wrote $OUT_DIR/seed002_hosts.$FORMAT"
