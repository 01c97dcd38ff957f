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
titles=$(/usr/bin/python3 - "$src" "$tmp" <<'PY'
import json, os, sys
src, tmp = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(src) if l.strip()]
titles = {}
for model in ("cnn", "vgg19"):
    runs = [r for r in rows if r.get("model") == model and r.get("kind") != "compute_limit"]
    limits = [r for r in rows if r.get("model") == model and r.get("kind") == "compute_limit"]
    with open(os.path.join(tmp, f"seed002_{model}.dat"), "w") as out:
        for r in runs:
            out.write(f"\"{r['partitioner']}\\n{r['placement']}\" {r['global_steps_per_sec']} "
                      f"{r['link_limit_steps_per_sec'] or 0} {r['max_over_mean_traffic']}\n")
    with open(os.path.join(tmp, f"seed002_{model}.limit"), "w") as out:
        out.write(f"{limits[-1]['global_steps_per_sec'] if limits else 0}\n")
    if runs:
        titles[model] = f"{model}: 2 ps + {runs[0]['workers']} workers, ps links {runs[0]['link_rate']}"
    else:
        titles[model] = f"{model}: not measured"
print(titles["cnn"]); print(titles["vgg19"])
PY
)
title_cnn=$(sed -n 1p <<< "$titles"); title_vgg=$(sed -n 2p <<< "$titles")
mkdir -p "$OUT_DIR"
gnuplot -e "set terminal $terminal; set output '$OUT_DIR/seed002_hosts.$FORMAT'; dir='$tmp'; title_cnn='$title_cnn'; title_vgg='$title_vgg'" bench/plot_seed002_hosts.gp
echo "wrote $OUT_DIR/seed002_hosts.$FORMAT"
