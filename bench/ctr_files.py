#!/usr/bin/python3
"""The ctr job from files beside the same job from the generator in memory, and the work queue
beside a static split with one worker slowed, in one run (docs/data-files.md#speed-of-training-from-files):

  1. `psflow train --model=ctr` in one process, --steps steps of --batch_size: from the generator,
     then from the generator's own files (`psflow data ctr-files`, plain and gzip): examples/s of
     each (the summary's), the same batches bit for bit. The goal: files within 5 % of memory.
  2. The same on a cluster (1 ps + 2 workers, async, on loopback): generator vs gzip files.
  3. 1 ps + 2 workers async on the gzip files to their end, worker 1 slowed 3x (SIGSTOP 20 ms of
     every 30 ms, sent from here): wall time of the job with the work queue (--file_split=queue)
     and with the usual static split (--file_split=static: worker w reads slices w, w+2, ...),
     and how many slices each worker read.

    /usr/bin/python3 bench/ctr_files.py [--build=build] [--steps=2000] [--json=OUT]
                                        [--repeats=R] [--only_speed | --only_slowed]
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "lib"))
from localhost import free_ports  # noqa: E402  (tests/lib/localhost.py)

COMMON = ["--model=ctr", "--seed=1", "--log_every=100000", "--ctr_test_examples=4096"]


def run(cmd, timeout=3600):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr


def summary(path):
    with open(path) as f:
        return json.load(f)


def single(build, tmp, batch, steps, files=None):
    m = os.path.join(tmp, "single.json")
    extra = [f"--train_files={files}/train-*"] if files else []
    run([f"{build}/psflow", "train", *COMMON, f"--batch_size={batch}", f"--train_steps={steps}",
         f"--metrics_json={m}", *extra])
    return summary(m)["examples_per_sec"]


def cluster(build, tmp, batch, steps, files=None):
    m = os.path.join(tmp, "cluster.json")
    extra = [f"--train_files={files}/train-*"] if files else []
    run([f"{build}/psflow", "local", "--ps=1", "--workers=2", *COMMON, f"--batch_size={batch}",
         f"--train_steps={steps}", f"--metrics_json={m}", *extra])
    return summary(m)["examples_per_sec"]


def slowed_job(build, files, batch, split, slices):
    """Wall seconds of a 1 ps + 2 worker async job over the files, worker 1 slowed 3x, and each
    worker's slices."""
    ports = free_ports(3)
    ps = f"127.0.0.1:{ports[0]}"
    workers = f"127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}"

    def task(job, i):
        return [f"{build}/psflow", "train", f"--job_name={job}", f"--task_index={i}", f"--ps_hosts={ps}",
                f"--worker_hosts={workers}", *COMMON, f"--batch_size={batch}", f"--train_files={files}/train-*",
                f"--file_split={split}", f"--file_slices={slices}"]

    t0 = time.perf_counter()
    procs = [subprocess.Popen(task("ps", 0), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    procs += [subprocess.Popen(task("worker", i), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for i in (0, 1)]
    done = threading.Event()

    def throttle():
        try:
            while not done.is_set():
                os.kill(procs[2].pid, signal.SIGSTOP)
                time.sleep(0.020)
                os.kill(procs[2].pid, signal.SIGCONT)
                time.sleep(0.010)
        except ProcessLookupError:  # it ended
            pass

    t = threading.Thread(target=throttle)
    t.start()
    outs = [None, None, None]
    outs[1] = procs[1].communicate(timeout=3600)[0]
    outs[2] = procs[2].communicate(timeout=3600)[0]
    done.set()
    t.join()
    if procs[2].poll() is None:
        os.kill(procs[2].pid, signal.SIGCONT)
    outs[0] = procs[0].communicate(timeout=600)[0]
    wall = time.perf_counter() - t0
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"a task failed ({p.returncode}):\n{out[-3000:]}")
    got = [int(re.search(r"training files: \d+ examples read in (\d+) slices", outs[i]).group(1)) for i in (1, 2)]
    step = int(re.search(r"global_step=(\d+)", outs[1]).group(1))
    return wall, got, step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--json", default="")
    parser.add_argument("--only_slowed", action="store_true", help="part 3 only")
    parser.add_argument("--only_speed", action="store_true", help="parts 1 and 2 only")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of parts 1 and 2, in rotation")
    a = parser.parse_args()
    b = a.batch_size
    tmp = tempfile.mkdtemp(prefix="psflow_bench_ctr_files_")
    per_file = a.steps * b // 4 + b  # 4 files holding the job's batches and a little more
    for kind in ("gzip",) if a.only_slowed else ("plain", "gzip"):
        run([f"{a.build}/psflow", "data", "ctr-files", f"--out={tmp}/{kind}", "--files=4",
             f"--examples_per_file={per_file}", "--seed=1", f"--batch_size={b}", "--ctr_test_examples=4096",
             *(["--gzip"] if kind == "gzip" else [])])
    res = {}
    if not a.only_slowed:
        # 1 and 2, interleaved so that the machine's load falls alike on each; --repeats rounds of the
        # five runs in rotation, each round's ratios printed, then the medians.
        runs = {"single_memory": lambda: single(a.build, tmp, b, a.steps),
                "single_plain": lambda: single(a.build, tmp, b, a.steps, f"{tmp}/plain"),
                "single_gzip": lambda: single(a.build, tmp, b, a.steps, f"{tmp}/gzip"),
                "cluster_memory": lambda: cluster(a.build, tmp, b, a.steps),
                "cluster_gzip": lambda: cluster(a.build, tmp, b, a.steps, f"{tmp}/gzip")}
        rounds = {name: [] for name in runs}
        for r in range(a.repeats):
            for name, job in runs.items():
                rounds[name].append(job())
            got = {name: values[-1] for name, values in rounds.items()}
            print(f"round {r + 1} (load {os.getloadavg()[0]:.1f}): one process plain {got['single_plain'] / got['single_memory']:.3f}x, "
                  f"gzip {got['single_gzip'] / got['single_memory']:.3f}x memory; cluster gzip "
                  f"{got['cluster_gzip'] / got['cluster_memory']:.3f}x memory", flush=True)
        res = {name: statistics.median(values) for name, values in rounds.items()}
        res["rounds"] = rounds
        print(f"ctr, one process, {a.steps} steps of {b}: memory {res['single_memory']:.0f} examples/s, "
              f"plain files {res['single_plain']:.0f} ({res['single_plain'] / res['single_memory'] - 1:+.1%}), "
              f"gzip files {res['single_gzip']:.0f} ({res['single_gzip'] / res['single_memory'] - 1:+.1%})"
              + (f" (medians of {a.repeats})" if a.repeats > 1 else ""))
        print(f"ctr, 1 ps + 2 workers async: memory {res['cluster_memory']:.0f} examples/s, gzip files "
              f"{res['cluster_gzip']:.0f} ({res['cluster_gzip'] / res['cluster_memory'] - 1:+.1%})"
              + (f" (medians of {a.repeats})" if a.repeats > 1 else ""))
    # 3: the whole gzip data set, worker 1 slowed 3x.
    for split in () if a.only_speed else ("queue", "static"):
        wall, slices, step = slowed_job(a.build, f"{tmp}/gzip", b, split, 10)
        res[f"slowed_{split}"] = {"wall_secs": wall, "slices": slices, "global_step": step}
        print(f"worker 1 slowed 3x, --file_split={split}: {wall:.1f} s wall to the end of the files "
              f"({step} steps), slices read by worker 0 / 1: {slices[0]} / {slices[1]}")
    if not a.only_speed:
        print(f"the work queue ends the job in {res['slowed_queue']['wall_secs'] / res['slowed_static']['wall_secs']:.2f}x "
              "the static split's wall time")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
