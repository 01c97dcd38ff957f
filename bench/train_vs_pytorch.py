#!/usr/bin/python3
"""psflow vs PyTorch, single worker, compute only: the same seed model, batch, optimizer and thread
count, run side by side in one invocation; prints one JSON line per (model, threads) with both
examples/s and their ratio (psflow / PyTorch; > 1 means psflow is faster).

  bench/train_vs_pytorch.py [--build build] [--models mlp,cnn] [--threads 1,2] [--mlp_steps 2000] [--cnn_steps 60]

--builds build,build-native (with --repeats N) compares several builds in one invocation, e.g. the
portable default against -DPSFLOW_NATIVE=ON: each repeat runs every build and PyTorch back to back,
and one JSON line per (model, threads, build) gives the ratio of each repeat, so the spread of
the repeats (the machine's noise) stands beside the difference between the builds.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEEDS = {"mlp": ("adam", 0.01, 100), "cnn": ("rmsprop", 0.001, 128)}


def run_psflow(build, model, steps, threads, data_dir):
    optimizer, lr, batch = SEEDS[model]
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([os.path.join(build, "psflow"), "train", f"--model={model}", f"--train_steps={steps}",
                        f"--batch_size={batch}", f"--optimizer={optimizer}", f"--learning_rate={lr}",
                        f"--intra_op_threads={threads}", f"--data_dir={data_dir}", f"--log_every={steps}",
                        f"--metrics_json={out.name}"], check=True, stdout=subprocess.DEVNULL)
        return json.load(open(out.name))


def run_pytorch(model, steps, threads, data_dir):
    optimizer, lr, batch = SEEDS[model]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "torch_seed_models.py"), f"--model={model}",
                          f"--steps={steps}", f"--batch_size={batch}", f"--optimizer={optimizer}",
                          f"--learning_rate={lr}", f"--threads={threads}", f"--data_dir={data_dir}"],
                         check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data_dir", default=os.path.join(ROOT, "data/mnist"))
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--mlp_steps", type=int, default=2000)
    p.add_argument("--cnn_steps", type=int, default=60)
    p.add_argument("--builds", help="comma-separated build dirs to compare side by side (overrides --build)")
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args()
    if a.builds:
        return compare_builds(a)
    for model in a.models.split(","):
        steps = a.mlp_steps if model == "mlp" else a.cnn_steps
        for threads in map(int, a.threads.split(",")):
            ours = run_psflow(a.build, model, steps, threads, a.data_dir)
            theirs = run_pytorch(model, steps, threads, a.data_dir)
            print(json.dumps({"model": model, "threads": threads, "steps": steps,
                              "psflow_examples_per_sec": round(ours["examples_per_sec"], 1),
                              "pytorch_examples_per_sec": round(theirs["examples_per_sec"], 1),
                              "ratio": round(ours["examples_per_sec"] / theirs["examples_per_sec"], 3)}))
            sys.stdout.flush()


def compare_builds(a):
    builds = a.builds.split(",")
    print(json.dumps({"load_average": os.getloadavg(), "cores": os.cpu_count()}))
    for model in a.models.split(","):
        steps = a.mlp_steps if model == "mlp" else a.cnn_steps
        for threads in map(int, a.threads.split(",")):
            ratios = {b: [] for b in builds}
            for _ in range(a.repeats):
                for build in builds:  # each build next to its own PyTorch run: same load
                    ours = run_psflow(build, model, steps, threads, a.data_dir)
                    theirs = run_pytorch(model, steps, threads, a.data_dir)
                    ratios[build].append(round(ours["examples_per_sec"] / theirs["examples_per_sec"], 3))
            for build in builds:
                r = sorted(ratios[build])
                print(json.dumps({"model": model, "threads": threads, "steps": steps, "build": build,
                                  "ratios": ratios[build], "median_ratio": r[len(r) // 2],
                                  "load_average_after": round(os.getloadavg()[0], 2)}))
                sys.stdout.flush()


if __name__ == "__main__":
    main()
