#!/usr/bin/python3
"""The chief's --eval_every_steps evaluation beside training, against no evaluation during training,
in one run (docs/recommendation.md#what-a-ctr-job-prints): 1 ps + 2 workers, async, the ctr model on
its generator, --steps steps of batch 1024, --checkpoint_dir in both:

  - none: no evaluation during training (saves at the end only);
  - beside: --eval_every_steps=E: the chief saves the checkpoint of each multiple of E (beside
    training) and evaluates that file on its evaluation thread (--ctr_test_examples test examples).

For each: worker 1's examples/s (the mean of its progress lines but the first: the worker the
evaluation must not slow), the chief's, the job's (the summary's), and the evaluations' own seconds.
With --pytorch, the same pair for examples/pytorch/ctr_dlrm.py, whose evaluate() runs on the chief
between two of its steps (its line says how long the chief's training paused).

    /usr/bin/python3 bench/ctr_eval_beside.py [--build=build] [--steps=3000] [--every=500] [--pytorch [--no_cpp]]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(cmd, env=None, timeout=3600):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr


def worker_rate(out, worker):
    rates = [float(x) for x in re.findall(rf"^\[worker{worker}\] (?:hybrid: )?step [^\n]* worker examples/s ([0-9.]+)",
                                          out, re.M)]
    return round(statistics.mean(rates[1:]), 0) if len(rates) > 1 else float("nan")


def job(a, tmp, name, every, pytorch):
    ckpt = os.path.join(tmp, ("pytorch_" if pytorch else "cpp_") + name)
    m = ckpt + ".json"
    flags = ["--ps=1", "--workers=2", f"--train_steps={a.steps}", "--log_every=100", f"--checkpoint_dir={ckpt}",
             "--save_checkpoint_steps=0", "--save_checkpoint_secs=0", f"--ctr_test_examples={a.test_examples}",
             f"--metrics_json={m}", "--seed=1"]
    if every:
        flags.append(f"--eval_every_steps={every}")
    if pytorch:
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, a.build, "python"))
        cmd = [f"{a.build}/psflow", "local", *flags, "--batch_size=1024", "--", "/usr/bin/python3",
               os.path.join(ROOT, "examples", "pytorch", "ctr_dlrm.py")]
    else:
        env = None
        cmd = [f"{a.build}/psflow", "local", *flags, "--model=ctr"]
    out = run(cmd, env)
    evals = [float(s) for s in re.findall(r"eval at global step \d+: [^\n]*\(([0-9.]+)s", out)]
    with open(m) as f:
        summary = json.load(f)
    return {"job": ("pytorch " if pytorch else "c++ ") + name, "worker1_examples_per_sec": worker_rate(out, 1),
            "chief_examples_per_sec": worker_rate(out, 0), "job_examples_per_sec": round(summary["examples_per_sec"]),
            "evaluations": len(evals), "eval_seconds": evals}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--every", type=int, default=500)
    p.add_argument("--test_examples", type=int, default=65536)
    p.add_argument("--pytorch", action="store_true")
    p.add_argument("--no_cpp", action="store_true", help="with --pytorch: the PyTorch pair alone")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="psflow_eval_beside_")
    for pytorch in ([] if a.no_cpp else [False]) + ([True] if a.pytorch else []):
        for name, every in (("none", 0), ("beside" if not pytorch else "inline", a.every)):
            print(json.dumps(job(a, tmp, name, every, pytorch)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
