#!/usr/bin/python3
"""Bytes per parameter server, with and without partitioning: the seeds' balance experiment.
Runs cnn and vgg19 on a local cluster of 2 ps + 1 worker for a few steps under each
(partitioner, placement) and prints one JSON line per run with each ps's parameters and traffic
and the imbalance max/mean of bytes held (target with fixed:2: <= 1.02).

  bench/ps_balance.py [--build build] [--steps 3]
"""
import argparse
import json
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = [("none", "round_robin"), ("none", "greedy"), ("fixed:2", "round_robin"), ("fixed:2", "greedy")]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data_dir", default=os.path.join(ROOT, "data/mnist"))
    p.add_argument("--models", default="cnn,vgg19")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    for model in a.models.split(","):
        for partitioner, placement in CONFIGS:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                subprocess.run([os.path.join(a.build, "psflow"), "local", "--ps=2", "--workers=1", f"--model={model}",
                                f"--partitioner={partitioner}", f"--placement={placement}",
                                f"--train_steps={a.steps}", "--batch_size=8", f"--data_dir={a.data_dir}",
                                f"--metrics_json={out.name}"], check=True, stdout=subprocess.DEVNULL)
                m = json.load(open(out.name))
            params = [t["num_params"] for t in m["ps_traffic"]]
            traffic = [t["bytes_in"] + t["bytes_out"] for t in m["ps_traffic"]]
            print(json.dumps({"model": model, "partitioner": partitioner, "placement": placement,
                              "params_per_ps": params, "traffic_bytes_per_ps": traffic,
                              "max_over_mean_params": round(max(params) / (sum(params) / len(params)), 4),
                              "max_over_mean_traffic": round(max(traffic) / (sum(traffic) / len(traffic)), 4)}),
                  flush=True)


if __name__ == "__main__":
    main()
