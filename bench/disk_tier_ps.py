#!/usr/bin/python3
"""Issue 26's rows/s against the cache hit rate as a worker sees them: the table and ids of
build/bench/psflow_disk_table_bench (2^18 rows of dim 64 with adagrad, 4096 unique ids a step, a
fraction p of them from a hot set of 16384 rows spread over the table) pulled and pushed through a
real ps task over loopback gRPC, memory tier beside disk tier.

Each run is one `psflow train --job_name=ps` task and build/bench/psflow_disk_tier_ps_worker
(bench/disk_tier_ps_worker.cc): it fills the table, warms the hot set, then measures --steps steps,
timing Lookup (the pull) and Step (the push) apart. The driver reads the ps task's CPU time
(/proc/PID/stat) and its cache counters (Prometheus) when the measured phase begins and ends.
The disk tier's cache holds the hot set and 4 steps' rows, as in the in-process bench.

  mkdir -p /var/tmp/psflow_disk_ps
  /usr/bin/python3 bench/disk_tier_ps.py --table_dir=/var/tmp/psflow_disk_ps [--runs=3] [--hot=100,97,82,55]

Prints one line a run and a JSON line a run; ratio = disk rows/s over the median memory rows/s
at the same p. hit_rate is over the pulls' and pushes' lookups (a push finds the rows its pull just
read: counted as hits); pull_hit_rate = 1 - misses / rows pulled, the rate the in-process bench reports.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from localhost import free_ports  # noqa: E402

ROWS, HOT, BATCH, DIM = 1 << 18, 16384, 4096, 64
RECORD = 64 + 2 * DIM * 4  # a cached record: header + meta, value, accumulator
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def counters(port):
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return {}
    out = {"hits": 0.0, "misses": 0.0}
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{[^}]*\}\s+(\S+)$", line)
        if m and m.group(1) == "psflow_table_cache_hits_total":
            out["hits"] += float(m.group(2))
        elif m and m.group(1) == "psflow_table_cache_misses_total":
            out["misses"] += float(m.group(2))
    return out


def run(a, storage, p):
    ports = free_ports(3)
    fill_steps = -(-ROWS // BATCH)
    steps = fill_steps + a.warm_steps + a.steps
    common = [f"--ps_hosts=127.0.0.1:{ports[0]}", f"--worker_hosts=127.0.0.1:{ports[1]}", f"--train_steps={steps}",
              "--optimizer=adagrad", "--sparse_optimizer=adagrad", "--log_every=1000000",
              f"--table_storage={storage}"]
    if storage == "disk":
        common += [f"--table_dir={a.table_dir}", f"--table_cache_bytes={(HOT + 4 * BATCH) * RECORD}"]
    common += a.extra.split()
    logdir = tempfile.mkdtemp(prefix="disk_tier_ps_")
    ps_log = open(os.path.join(logdir, "ps0.log"), "w")
    ps = subprocess.Popen([os.path.join(a.build, "psflow"), "train", "--job_name=ps", "--task_index=0",
                           f"--metrics_port={ports[2]}"] + common, stdout=ps_log, stderr=subprocess.STDOUT)
    worker_log = os.path.join(logdir, "worker0.log")
    worker = subprocess.Popen([os.path.join(a.build, "bench", "psflow_disk_tier_ps_worker"), "--job_name=worker",
                               "--task_index=0", f"--hot_percent={p}", f"--warm_steps={a.warm_steps}"] + common,
                              stdout=open(worker_log, "w"), stderr=subprocess.STDOUT)
    marks = {}
    while worker.poll() is None:
        text = open(worker_log).read()
        for name in ("begins", "ends"):
            if name not in marks and f"phase measure {name}" in text:
                time.sleep(0.5)  # the ps publishes its counters every second; the worker waits 2 s
                marks[name] = (cpu_seconds(ps.pid), counters(ports[2]))
        time.sleep(0.1)
    code_w, code_ps = worker.wait(), ps.wait(timeout=60)
    text = open(worker_log).read()
    m = re.search(r"measure: (\d+) steps, (\d+) rows; pull (\S+) rows/s, push (\S+) rows/s, pull\+push (\S+)", text)
    if code_w != 0 or code_ps != 0 or m is None or len(marks) < 2:
        raise SystemExit(f"disk_tier_ps.py: {storage} p={p}: worker exited {code_w}, ps {code_ps}; logs in {logdir}")
    rows = int(m.group(2))
    (c0, k0), (c1, k1) = marks["begins"], marks["ends"]
    out = {"storage": storage, "hot_percent": p, "rows": rows, "pull_rows_per_s": float(m.group(3)),
           "push_rows_per_s": float(m.group(4)), "rows_per_s": float(m.group(5)),
           "ps_cpu_us_per_row": round((c1 - c0) / rows * 1e6, 3), "load": round(os.getloadavg()[0], 1)}
    if storage == "disk" and k0 and k1:
        h, mi = k1["hits"] - k0["hits"], k1["misses"] - k0["misses"]
        out["hit_rate"] = round(h / max(1.0, h + mi), 4)
        out["pull_hit_rate"] = round(1 - mi / rows, 4)  # a push finds its pull's rows: every miss is a pull's
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--table_dir", required=True, help="an existing directory for the disk tier")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--hot", default="100,97,82,55", help="percents of ids from the hot set")
    p.add_argument("--steps", type=int, default=300, help="measured steps a run")
    p.add_argument("--warm_steps", type=int, default=16)
    p.add_argument("--extra", default="", help="more flags for both tasks, space-separated")
    a = p.parse_args()
    if not os.path.isdir(a.table_dir):
        raise SystemExit(f"disk_tier_ps.py: --table_dir={a.table_dir} is not a directory; create it")
    results = []
    for hot in [int(x) for x in a.hot.split(",")]:
        for _ in range(a.runs):  # memory and disk alternate: the machine's load hits both alike
            for storage in ("memory", "disk"):
                r = run(a, storage, hot)
                results.append(r)
                print(json.dumps(r), flush=True)
    print("# p  storage  pull rows/s  push rows/s  pull+push rows/s  ps CPU us/row  pull hit rate  ratio to memory")
    for hot in sorted({r["hot_percent"] for r in results}, reverse=True):
        mem = [r for r in results if r["hot_percent"] == hot and r["storage"] == "memory"]
        base = {k: statistics.median(r[k] for r in mem) for k in ("pull_rows_per_s", "push_rows_per_s", "rows_per_s")}
        for r in [x for x in results if x["hot_percent"] == hot]:
            ratio = "/".join(f"{r[k] / base[k]:.2f}" for k in ("pull_rows_per_s", "push_rows_per_s", "rows_per_s"))
            print(f"{hot:3d}  {r['storage']:6s}  {r['pull_rows_per_s'] / 1e6:6.3f} M  {r['push_rows_per_s'] / 1e6:6.3f} M  "
                  f"{r['rows_per_s'] / 1e6:6.3f} M  {r['ps_cpu_us_per_row']:6.3f}  {r.get('pull_hit_rate', '-')}  "
                  f"{ratio} (pull/push/both) load {r['load']}", flush=True)


if __name__ == "__main__":
    main()
