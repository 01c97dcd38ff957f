#!/usr/bin/python3
"""What a table's size costs the tasks that hold it (docs/tables.md, "Scale"). Every task is started
by hand (gRPC over loopback, one process per task) and its peak RSS is the kernel's ru_maxrss of
that process, read with os.wait4 when it exits. The worker is build/bench/psflow_table_scale_worker:
one table on the ps tasks, each step --ids_per_step ids looked up and pushed back with a gradient.

  fixed    a fixed [R, 64] div table with adagrad over 2 ps, for R = 10^5 and 10^7 (5.1 GB of
           state): the worker's peak RSS must not depend on R (goal: within 50 MB), and each ps
           holds <= 1.15 x its state + 100 MB.
  dynamic  a dynamic table of dim 64 with adagrad over 2 ps fed 5*10^7 distinct ids (every push new
           ids) with max_rows=5*10^6: each ps <= 1.25 x the state of its share of 5*10^6 rows +
           100 MB, whatever the number of ids pushed; and the rows created per second.

  bench/table_scale.py [--build build] [--runs fixed,dynamic] [--fixed_rows 100000,10000000]
                       [--distinct_ids 50000000] [--max_rows 5000000] [--ids_per_step 4096]
MB = 2^20 bytes. Needs ~14 GB of free memory for the default runs.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from memory import MB, wait_all  # noqa: E402  (bench/memory.py: os.wait4 peaks, low-memory guard)
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from localhost import free_ports  # noqa: E402

DIM, NUM_PS = 64, 2
ADAGRAD_SLOTS = 1  # the accumulator beside each row


def run_job(build, steps, worker_args, logdir, name):
    """2 ps + 1 worker; returns ({task: peak RSS bytes}, the chief's summary)."""
    ports = free_ports(NUM_PS + 1)
    hosts = [f"--ps_hosts={','.join(f'127.0.0.1:{p}' for p in ports[:NUM_PS])}",
             f"--worker_hosts=127.0.0.1:{ports[NUM_PS]}"]
    metrics = os.path.join(logdir, f"{name}_metrics.json")
    common = hosts + [f"--train_steps={steps}", "--optimizer=adagrad", "--sparse_optimizer=adagrad",
                      "--log_every=1000000", "--worker_timeout_secs=3600", f"--partitioner=fixed:{NUM_PS}"]
    procs = {}
    for i in range(NUM_PS):
        log = open(os.path.join(logdir, f"{name}_ps{i}.log"), "w")
        procs[f"ps{i}"] = subprocess.Popen([os.path.join(build, "psflow"), "train", "--job_name=ps",
                                            f"--task_index={i}"] + common, stdout=log, stderr=subprocess.STDOUT)
    log = open(os.path.join(logdir, f"{name}_worker0.log"), "w")
    procs["worker0"] = subprocess.Popen(
        [os.path.join(build, "bench", "psflow_table_scale_worker"), "--job_name=worker", "--task_index=0",
         f"--metrics_json={metrics}"] + common + worker_args, stdout=log, stderr=subprocess.STDOUT)
    done = wait_all(procs, timeout=3600)
    failed = {k: v[0] for k, v in done.items() if v[0] != 0}
    if failed:
        kept = tempfile.mkdtemp(prefix=f"table_scale_{name}_")
        for f in os.listdir(logdir):
            os.replace(os.path.join(logdir, f), os.path.join(kept, f))
        raise SystemExit(f"table_scale.py: {name}: tasks exited non-zero {failed}; logs in {kept}")
    return {k: v[1] for k, v in done.items()}, json.load(open(metrics))


def fixed_run(build, rows, steps, ids_per_step, logdir):
    start = time.time()
    peaks, summary = run_job(build, steps, ["--table=fixed", f"--rows={rows}", f"--dim={DIM}",
                                            f"--ids_per_step={ids_per_step}"], logdir, f"fixed{rows}")
    out = {"run": "fixed", "rows": rows, "wall_s": round(time.time() - start, 1),
           "worker_peak_mb": round(peaks["worker0"] / MB, 1)}
    for i in range(NUM_PS):
        shard_rows = rows // NUM_PS + (1 if i < rows % NUM_PS else 0)
        state = shard_rows * DIM * 4 * (1 + ADAGRAD_SLOTS)
        out[f"ps{i}_peak_mb"] = round(peaks[f"ps{i}"] / MB, 1)
        out[f"ps{i}_state_mb"] = round(state / MB, 1)
        out[f"ps{i}_goal_mb"] = round((1.15 * state + 100 * MB) / MB, 1)
    return out


def dynamic_run(build, distinct_ids, max_rows, ids_per_step, logdir):
    steps = -(-distinct_ids // ids_per_step)
    start = time.time()
    peaks, summary = run_job(build, steps, ["--table=dynamic", f"--dim={DIM}", f"--ids_per_step={ids_per_step}",
                                            f"--max_rows={max_rows}", "--evict_every=10"], logdir, "dynamic")
    tables = [t for ps in summary["ps_traffic"] for t in ps.get("tables", [])]
    created = sum(t["admissions"] for t in tables)
    share_state = -(-max_rows // NUM_PS) * DIM * 4 * (1 + ADAGRAD_SLOTS)
    out = {"run": "dynamic", "distinct_ids": steps * ids_per_step, "max_rows": max_rows,
           "wall_s": round(time.time() - start, 1), "train_s": round(summary["train_seconds"], 1),
           "rows_created": created, "rows_created_per_s": round(created / summary["train_seconds"]),
           "rows_kept": sum(t["rows"] for t in tables), "evictions": sum(t["evictions"] for t in tables),
           "worker_peak_mb": round(peaks["worker0"] / MB, 1), "share_state_mb": round(share_state / MB, 1),
           "goal_mb": round((1.25 * share_state + 100 * MB) / MB, 1)}
    for i in range(NUM_PS):
        out[f"ps{i}_peak_mb"] = round(peaks[f"ps{i}"] / MB, 1)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--runs", default="fixed,dynamic")
    p.add_argument("--fixed_rows", default="100000,10000000")
    p.add_argument("--fixed_steps", type=int, default=50)
    p.add_argument("--distinct_ids", type=int, default=50_000_000)
    p.add_argument("--max_rows", type=int, default=5_000_000)
    p.add_argument("--ids_per_step", type=int, default=4096, help="ids looked up and pushed per step")
    a = p.parse_args()
    print(f"# load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; MB = 2^20 bytes; "
          f"{NUM_PS} ps + 1 worker, dim {DIM}, adagrad, {a.ids_per_step} ids per step", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as logdir:
        for run in a.runs.split(","):
            if run == "fixed":
                for rows in (int(r) for r in a.fixed_rows.split(",")):
                    results.append(fixed_run(a.build, rows, a.fixed_steps, a.ids_per_step, logdir))
                    print(json.dumps(results[-1]), flush=True)
            elif run == "dynamic":
                results.append(dynamic_run(a.build, a.distinct_ids, a.max_rows, a.ids_per_step, logdir))
                print(json.dumps(results[-1]), flush=True)
            else:
                raise SystemExit(f"table_scale.py: unknown run '{run}'; choose fixed or dynamic")
    fixed = [r for r in results if r["run"] == "fixed"]
    if len(fixed) >= 2:
        spread = max(r["worker_peak_mb"] for r in fixed) - min(r["worker_peak_mb"] for r in fixed)
        print(f"# worker peak RSS spread over fixed tables of {','.join(str(r['rows']) for r in fixed)} rows: "
              f"{spread:.1f} MB (goal <= 50)")


if __name__ == "__main__":
    main()
