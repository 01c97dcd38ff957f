#!/usr/bin/python3
"""Steps/s of the GRU job (examples/pytorch/char_gru.py) and the seed mlp script: plain PyTorch,
psflow async and sync (psflow local --ps=1 --workers=2), with OpenBLAS's pool at one thread per
core (its default: 'before the thread fix', forced back after the session opened with the
script's --openblas_threads) and at --intra_op_threads=1 (psflow's fix). Prints a table.

    PYTHONPATH=build/python bench/char_gru_threads.py --steps=300
Timing is the machine's: run it on an otherwise idle machine for figures to compare.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRU = os.path.join(ROOT, "examples", "pytorch", "char_gru.py")


def env():
    e = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TF_CONFIG", "PSFLOW_FLAGS"):
        e.pop(name, None)
    return e


def plain(steps, blas):
    r = subprocess.run(["/usr/bin/python3", GRU, "--plain", f"--train_steps={steps}", "--intra_op_threads=1",
                        f"--openblas_threads={blas}"], capture_output=True, text=True, env=env(), timeout=3600)
    if r.returncode != 0:
        sys.exit(r.stdout[-2000:] + r.stderr[-2000:])
    return float(re.search(r"steps_per_sec=([\d.]+)", r.stdout).group(1))


def cluster(build, mode, steps, blas):
    with tempfile.TemporaryDirectory() as d:
        metrics = os.path.join(d, "m.json")
        flags = [f"--train_steps={steps}", f"--metrics_json={metrics}", "--intra_op_threads=1", "--log_every=100000"]
        if mode == "sync":
            flags.append("--sync_replicas")
        cmd = [os.path.join(build, "psflow"), "local", "--ps=1", "--workers=2", *flags, "--",
               "/usr/bin/python3", GRU, f"--openblas_threads={blas}"]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=3600)
        if r.returncode != 0:
            sys.exit(r.stdout[-2000:] + r.stderr[-2000:])
        with open(metrics) as f:
            m = json.load(f)
        return m["global_step"] / m["train_seconds"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    cores = os.cpu_count()
    print(f"char_gru, {a.steps} global steps, batch 32 x 64 chars, 2 workers on {cores} cores; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')}")
    print(f"{'run':<24}{'openblas=' + str(cores) + ' (before)':>22}{'openblas=1 (fix)':>20}")
    for name, fn in (("plain PyTorch", lambda b: plain(a.steps, b)),
                     ("psflow async 2 workers", lambda b: cluster(a.build, "async", a.steps, b)),
                     ("psflow sync 2 workers", lambda b: cluster(a.build, "sync", a.steps, b))):
        before, after = fn(cores), fn(1)
        print(f"{name:<24}{before:>22.1f}{after:>20.1f}", flush=True)


if __name__ == "__main__":
    main()
