#!/usr/bin/python3
"""Throughput versus number of workers: `psflow local --ps=1 --workers=W` for W = 1..4 on one
model for a fixed number of global steps, and one JSON line per run with the chief's
examples_per_sec (global steps x per-worker batch / training seconds, see docs/design.md#command-line-and-summary).

Every task of `psflow local` runs on this machine, so the curve shows how far the cores go: past
the number of cores, extra workers only share them. The load average before each run is recorded
because other processes on the machine distort the figures.

  bench/scaling_workers.py [--build build] [--model mlp] [--steps 3000] [--max_workers 4]
                           [--repeats 3] [--sync]

Each line reports the median of the repeats, with the smallest and largest figures beside it.
"""
import argparse
import json
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(a, workers):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [os.path.join(a.build, "psflow"), "local", "--ps=1", f"--workers={workers}", f"--model={a.model}",
               f"--train_steps={a.steps}", f"--data_dir={a.data_dir}", f"--metrics_json={out.name}"]
        if a.sync:
            cmd.append("--sync_replicas")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.load(open(out.name))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data_dir", default=os.path.join(ROOT, "data/mnist"))
    p.add_argument("--model", default="mlp")
    p.add_argument("--steps", type=int, default=3000, help="global steps per run")
    p.add_argument("--max_workers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="runs per worker count; the median is reported")
    p.add_argument("--sync", action="store_true", help="synchronous training instead of async")
    a = p.parse_args()
    for workers in range(1, a.max_workers + 1):
        load = os.getloadavg()[0]
        runs = [run_once(a, workers) for _ in range(a.repeats)]
        # The median run: on a shared machine single runs swing widely, and the best one flatters.
        runs.sort(key=lambda m: m["examples_per_sec"])
        median = runs[len(runs) // 2]
        print(json.dumps({"model": a.model, "mode": median["mode"], "ps": 1, "workers": workers,
                          "global_step": median["global_step"], "train_seconds": round(median["train_seconds"], 3),
                          "examples_per_sec": round(median["examples_per_sec"], 1),
                          "min_examples_per_sec": round(runs[0]["examples_per_sec"], 1),
                          "max_examples_per_sec": round(runs[-1]["examples_per_sec"], 1),
                          "test_accuracy": median["test_accuracy"], "loadavg_1min_before": round(load, 2),
                          "cores": os.cpu_count()}), flush=True)


if __name__ == "__main__":
    main()
