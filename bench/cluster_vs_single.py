#!/usr/bin/python3
"""The seeds' headline run, measured side by side in one invocation: mlp, 10000 global steps,
batch 100, Adam 0.01 — once in a single process, once on a local cluster of 1 ps + 2 async
workers (separate processes), once per transport (shared memory, the default of `psflow local`,
and gRPC over loopback). Prints one JSON line with the wall times (whole commands, start-up and
evaluation included), the ratios to the single process and the test accuracies.
Target (docs/design.md#targets): cluster wall <= 8 s on 2 cores, test accuracy >= 97%.

  bench/cluster_vs_single.py [--build build] [--steps 10000] [--mode async|sync] [--transports shm,grpc]
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
    p.add_argument("--transports", default="shm,grpc")
    a = p.parse_args()
    psflow = os.path.join(a.build, "psflow")
    common = ["--model=mlp", f"--train_steps={a.steps}", "--batch_size=100", "--optimizer=adam",
              "--learning_rate=0.01", f"--data_dir={a.data_dir}", f"--log_every={a.steps}"]
    single_wall, single = timed([psflow, "train"] + common)
    cluster_flags = ["--sync_replicas"] if a.mode == "sync" else []
    result = {"model": "mlp", "steps": a.steps, "mode": a.mode, "single_wall_secs": round(single_wall, 2),
              "single_test_accuracy": single["test_accuracy"]}
    for transport in a.transports.split(","):
        wall, cluster = timed([psflow, "local", "--ps=1", "--workers=2", f"--transport={transport}"] + common +
                              cluster_flags)
        result[f"cluster_{transport}_wall_secs"] = round(wall, 2)
        result[f"cluster_{transport}_ratio"] = round(wall / single_wall, 3)
        result[f"cluster_{transport}_test_accuracy"] = cluster["test_accuracy"]
        result[f"cluster_{transport}_global_step"] = cluster["global_step"]
    print(json.dumps(result))

if __name__ == "__main__":
    main()
