#!/usr/bin/python3
"""Steps/s of a PyTorch job on psflow before and after the compute-thread fix.

Before: a build without the fix (e.g. main's, --before=/work/main/build): OpenBLAS keeps its own
pool of one thread per core beside torch's. After: this build, where `psflow local` and the
session set every pool to --intra_op_threads. Each configuration runs the script under
`psflow local --ps=1 --workers=2` in async and sync mode, and a plain run (1 worker, standalone
when the build has it); steps/s = global_step / train_seconds of the chief's --metrics_json.

    bench/thread_fix.py --before=/work/main/build --after=build --steps=2000 \
        [--script=examples/pytorch/mnist_mlp.py] [-- script flags]
Timing is the machine's: run it on an otherwise idle machine for figures to compare.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(build, mode, steps, script, extra, workers):
    with tempfile.TemporaryDirectory() as d:
        metrics = os.path.join(d, "m.json")
        env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TF_CONFIG", "PSFLOW_FLAGS"):
            env.pop(name, None)
        flags = [f"--train_steps={steps}", f"--metrics_json={metrics}", "--intra_op_threads=1", "--log_every=100000"]
        if mode == "sync":
            flags.append("--sync_replicas")
        cmd = [os.path.join(build, "psflow"), "local", "--ps=1", f"--workers={workers}", *flags, "--",
               "/usr/bin/python3", script, *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        with open(metrics) as f:
            m = json.load(f)
        return m["global_step"] / m["train_seconds"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="build directory without the fix")
    p.add_argument("--after", default=os.path.join(ROOT, "build"), help="build directory with the fix")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--script", default=os.path.join(ROOT, "examples", "pytorch", "mnist_mlp.py"))
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    print(f"script {os.path.relpath(args.script, ROOT)} {' '.join(extra)}, {args.steps} global steps, steps/s:")
    print(f"{'build':8} {'1 worker':>9} {'2w async':>9} {'2w sync':>9}")
    for label, build in (("before", args.before), ("after", args.after)):
        one = run(build, "async", args.steps, args.script, extra, 1)
        a = run(build, "async", args.steps, args.script, extra, 2)
        s = run(build, "sync", args.steps, args.script, extra, 2)
        print(f"{label:8} {one:9.1f} {a:9.1f} {s:9.1f}", flush=True)


if __name__ == "__main__":
    main()
