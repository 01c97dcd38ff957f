#!/usr/bin/python3
"""Issue 26's big figure: a dynamic table of >= 40 GB of state (value + adagrad accumulator, dim 64)
on disk over 2 ps tasks of a 24 GB machine, --table_cache_bytes=2 GiB per ps, Zipf(1.1) ids. Goal:
each ps's peak RSS <= its cache + 300 MB, every task exits 0.

Every task is a real process over loopback gRPC: `psflow train --job_name=ps` twice and the worker
build/bench/psflow_disk_tier_40gb_worker (bench/disk_tier_40gb_worker.cc), which first fills the
table through the ps RPCs (sequential ids, --fill_batch a step: every push creates its rows), then
trains --zipf_steps steps of Zipf(--zipf_s) ids over the filled id space. The driver polls each ps
every 2 s: VmHWM and VmRSS (/proc/PID/status), its Prometheus counters (--metrics_port: cache hits
and misses, rows read from and written to disk, disk bytes) and the table directory's size (du);
the Zipf phase's hit rate and rows/s are the counters' change over that phase.

  DIR=/var/tmp/psflow_40gb; mkdir -p $DIR
  /usr/bin/python3 bench/disk_tier_40gb.py --table_dir=$DIR [--rows=78200000] [--zipf_steps=3000]

--rows=78200000 is 78.2M rows x 512 B of value and accumulator = 40.0 GB of state (42.8 GB of
records with their 24 B of meta). It needs about 1.12 x that on disk (checked with df first) and
12-20 minutes of fill on this machine (108 k rows/s at load 10-15); the table directory is deleted after the run (--keep keeps
it). RocksDB's compression stays off (floats do not compress). GB = 10^9 bytes, MB = 2^20.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from localhost import free_ports  # noqa: E402

DIM, NUM_PS, MB = 64, 2, 1 << 20
RECORD = 24 + 2 * DIM * 4  # RowMeta + value + accumulator
COUNTERS = {"psflow_table_cache_hits_total": "hits", "psflow_table_cache_misses_total": "misses",
            "psflow_table_disk_rows_read_total": "read", "psflow_table_disk_rows_written_total": "written",
            "psflow_table_disk_bytes": "disk_bytes", "psflow_table_rows": "rows"}


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    out[line.split(":")[0]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def scrape(port):
    """The ps task's table counters, summed over its tables ({} if it does not answer)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{[^}]*\}\s+(\S+)$", line)
        if m and m.group(1) in COUNTERS:
            key = COUNTERS[m.group(1)]
            out[key] = out.get(key, 0) + float(m.group(2))
    return out


def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--table_dir", required=True, help="an existing directory on the disk to measure")
    p.add_argument("--rows", type=int, default=78_200_000)
    p.add_argument("--cache_bytes", type=int, default=2 << 30, help="--table_cache_bytes per ps")
    p.add_argument("--fill_batch", type=int, default=4096,
                   help="ids a fill step (32768 cost each ps ~400 MB more RSS in gRPC buffers: not the tier's)")
    p.add_argument("--zipf_steps", type=int, default=3000)
    p.add_argument("--zipf_draws", type=int, default=8192)
    p.add_argument("--zipf_s", type=float, default=1.1)
    p.add_argument("--keep", action="store_true", help="keep the table directory")
    p.add_argument("--extra", default="", help="more flags for every task, space-separated")
    a = p.parse_args()
    if not os.path.isdir(a.table_dir):
        raise SystemExit(f"disk_tier_40gb.py: --table_dir={a.table_dir} is not a directory; create it")
    need = int(a.rows * (RECORD + 8) * 1.12)
    free = shutil.disk_usage(a.table_dir).free
    print(f"# {a.table_dir}: {free / 1e9:.1f} GB free, the table needs ~{need / 1e9:.1f} GB", flush=True)
    if free < need + (5 << 30):
        raise SystemExit(f"disk_tier_40gb.py: {a.table_dir} has {free / 1e9:.1f} GB free; the table needs "
                         f"~{need / 1e9:.1f} GB + 5 GB of margin: free space or lower --rows")
    fill_steps = -(-a.rows // a.fill_batch)
    steps = fill_steps + a.zipf_steps
    ports = free_ports(2 * NUM_PS + 1)
    hosts = [f"--ps_hosts={','.join(f'127.0.0.1:{q}' for q in ports[:NUM_PS])}",
             f"--worker_hosts=127.0.0.1:{ports[NUM_PS]}"]
    metrics_ports = ports[NUM_PS + 1:]
    common = hosts + [f"--train_steps={steps}", "--optimizer=adagrad", "--sparse_optimizer=adagrad",
                      "--log_every=1000000", "--worker_timeout_secs=7200", "--table_storage=disk",
                      f"--table_dir={a.table_dir}", f"--table_cache_bytes={a.cache_bytes}"] + a.extra.split()
    logdir = tempfile.mkdtemp(prefix="disk_tier_40gb_")
    metrics_json = os.path.join(logdir, "summary.json")
    print(f"# load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {NUM_PS} ps + 1 worker; "
          f"{a.rows} rows of dim {DIM} (adagrad) = {a.rows * 2 * DIM * 4 / 1e9:.1f} GB of state; "
          f"{fill_steps} fill steps of {a.fill_batch} ids, {a.zipf_steps} Zipf({a.zipf_s}) steps of "
          f"{a.zipf_draws} draws; logs in {logdir}", flush=True)
    procs = {}
    for i in range(NUM_PS):
        log = open(os.path.join(logdir, f"ps{i}.log"), "w")
        procs[f"ps{i}"] = subprocess.Popen(
            [os.path.join(a.build, "psflow"), "train", "--job_name=ps", f"--task_index={i}",
             f"--metrics_port={metrics_ports[i]}"] + common, stdout=log, stderr=subprocess.STDOUT)
    worker_log = os.path.join(logdir, "worker0.log")
    procs["worker0"] = subprocess.Popen(
        [os.path.join(a.build, "bench", "psflow_disk_tier_40gb_worker"), "--job_name=worker", "--task_index=0",
         f"--metrics_json={metrics_json}", f"--rows={a.rows}", f"--fill_batch={a.fill_batch}",
         f"--zipf_draws={a.zipf_draws}", f"--zipf_s={a.zipf_s}"] + common,
        stdout=open(worker_log, "w"), stderr=subprocess.STDOUT)
    start = time.time()
    hwm = {i: 0 for i in range(NUM_PS)}
    last = {i: {} for i in range(NUM_PS)}
    at_zipf, zipf_time, max_du = None, None, 0
    samples = []  # (time, summed counters) during the Zipf phase
    next_print = start
    codes = {}
    while len(codes) < len(procs):
        for name, proc in procs.items():
            if name not in codes and proc.poll() is not None:
                codes[name] = proc.returncode
        for i in range(NUM_PS):
            st = proc_status(procs[f"ps{i}"].pid)
            hwm[i] = max(hwm[i], st.get("VmHWM", 0))
            got = scrape(metrics_ports[i])
            if got:
                last[i] = got
        if at_zipf is None and "phase zipf begins" in open(worker_log).read():
            at_zipf, zipf_time = {i: dict(last[i]) for i in range(NUM_PS)}, time.time()
        if at_zipf is not None and all(last[i] for i in range(NUM_PS)):
            samples.append((time.time(), {k: sum(last[i].get(k, 0) for i in range(NUM_PS))
                                          for k in ("hits", "misses", "read", "written")}))
        max_du = max(max_du, du(a.table_dir))
        if time.time() >= next_print:
            next_print += 60
            rows = sum(last[i].get("rows", 0) for i in range(NUM_PS))
            print(f"t={time.time() - start:.0f}s rows={rows:.0f} du={max_du / 1e9:.1f}GB "
                  + " ".join(f"ps{i}: hwm={hwm[i] / MB:.0f}MB rss={proc_status(procs[f'ps{i}'].pid).get('VmRSS', 0) / MB:.0f}MB"
                             for i in range(NUM_PS)), flush=True)
        if any(c != 0 for c in codes.values()):
            for name, proc in procs.items():
                if name not in codes:
                    proc.kill()
            break
        time.sleep(2)
    end = time.time()
    for name, proc in procs.items():
        codes[name] = proc.wait()
    print(open(worker_log).read().strip(), flush=True)
    out = {"rows": a.rows, "state_gb": round(a.rows * 2 * DIM * 4 / 1e9, 2), "cache_mb": a.cache_bytes / MB,
           "exit_codes": codes, "wall_s": round(end - start, 1), "max_table_dir_gb": round(max_du / 1e9, 2)}
    for i in range(NUM_PS):
        out[f"ps{i}_peak_rss_mb"] = round(hwm[i] / MB, 1)
        out[f"ps{i}_over_cache_mb"] = round((hwm[i] - a.cache_bytes) / MB, 1)
    if os.path.exists(metrics_json):
        summary = json.load(open(metrics_json))
        tables = [t for ps in summary["ps_traffic"] for t in ps.get("tables", [])]
        final = {k: sum(t.get(k, 0) for t in tables) for k in ("cache_hits", "cache_misses", "disk_rows_read",
                                                                "disk_rows_written", "disk_bytes", "rows")}
        out.update({"rows_stored": final["rows"], "disk_bytes_gb": round(final["disk_bytes"] / 1e9, 2),
                    "train_s": round(summary.get("train_seconds", 0), 1)})
        if at_zipf is not None:
            z = {k: sum(at_zipf[i].get(k, 0) for i in range(NUM_PS)) for k in ("hits", "misses", "read", "written")}
            hits, misses = final["cache_hits"] - z["hits"], final["cache_misses"] - z["misses"]
            out.update({"fill_s": round(zipf_time - start, 1), "fill_rows_per_s": round(a.rows / (zipf_time - start)),
                        "zipf_s": round(end - zipf_time, 1),
                        "zipf_hit_rate": round(hits / max(1, hits + misses), 4),
                        "zipf_disk_rows_read": final["disk_rows_read"] - z["read"],
                        "zipf_disk_rows_written": final["disk_rows_written"] - z["written"]})
            # The second half of the phase alone (the cache warmed by then), from the polls.
            half = [c for t, c in samples if t >= (zipf_time + samples[-1][0]) / 2] if samples else []
            if len(half) >= 2:
                h = half[-1]["hits"] - half[0]["hits"]
                m = half[-1]["misses"] - half[0]["misses"]
                out["zipf_second_half_hit_rate"] = round(h / max(1, h + m), 4)
    print(json.dumps(out), flush=True)
    if not a.keep:
        for i in range(NUM_PS):
            shutil.rmtree(os.path.join(a.table_dir, f"ps_{i}"), ignore_errors=True)
        print(f"# removed {a.table_dir}/ps_*", flush=True)
    if any(c != 0 for c in codes.values()):
        raise SystemExit(f"disk_tier_40gb.py: tasks exited non-zero {codes}; logs in {logdir}")


if __name__ == "__main__":
    main()
