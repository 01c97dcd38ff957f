#!/usr/bin/python3
"""The seeds' headline run, measured side by side in one invocation: mlp, 10000 global steps,
batch 100, Adam 0.01 — once in a single process, once on a local cluster of 1 ps + 2 async
workers (separate processes over loopback gRPC). Prints one JSON line with both wall times
(whole commands, start-up and evaluation included), their ratio and test accuracies.
Target (issue 3): cluster wall <= 0.65x single-process wall, test accuracy >= 97%.

  bench/cluster_vs_single.py [--build build] [--steps 10000] [--mode async|sync]
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        start = time.perf_counter()
        subprocess.run(cmd + [f"--metrics_json={out.name}"], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        return wall, json.load(open(out.name))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data_dir", default=os.path.join(ROOT, "data/mnist"))
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--mode", default="async")
    a = p.parse_args()
    psflow = os.path.join(a.build, "psflow")
    common = ["--model=mlp", f"--train_steps={a.steps}", "--batch_size=100", "--optimizer=adam",
              "--learning_rate=0.01", f"--data_dir={a.data_dir}", f"--log_every={a.steps}"]
    single_wall, single = timed([psflow, "train"] + common)
    cluster_flags = ["--sync_replicas"] if a.mode == "sync" else []
    cluster_wall, cluster = timed([psflow, "local", "--ps=1", "--workers=2"] + common + cluster_flags)
    print(json.dumps({"model": "mlp", "steps": a.steps, "mode": a.mode,
                      "single_wall_secs": round(single_wall, 2), "cluster_wall_secs": round(cluster_wall, 2),
                      "ratio": round(cluster_wall / single_wall, 3),
                      "single_test_accuracy": single["test_accuracy"],
                      "cluster_test_accuracy": cluster["test_accuracy"],
                      "cluster_global_step": cluster["global_step"]}))


if __name__ == "__main__":
    main()
