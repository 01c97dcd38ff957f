#!/usr/bin/python3
"""Seed 002's experiment on simulated hosts: 2 ps + 7 workers, each task in its own network
namespace (tests/netns/hosts.py), the ps links shaped to --rate (default 1 Gbit/s) both ways with
tc tbf, async training of cnn (and vgg19 with fewer workers and steps), without partitioning, with
--partitioner=fixed:2 and with --placement=greedy. One JSON line per run:

  global_steps_per_sec (global_step / the chief's train_seconds), wall_secs (start of the tasks to
  the last exit), init_secs (start to the chief's first progress line), bytes per ps (psflow's
  count, bytes_in + bytes_out, and the link's own tx/rx counters, which include TCP/IP and gRPC
  framing), max/mean of the ps traffic, bytes per global step on the busiest ps, the link limit
  that implies (rate / busiest direction's bytes per step) and the load average before and after.

A line with "kind": "compute_limit" gives the same model trained in one process (no network, all
cores, 2 intra-op threads): a reference for what compute allows here, though not a strict bound
(7 worker processes use 2 cores better than one process's threads). The stricter reference is the
same cluster unshaped: a configuration "fixed:2/greedy/unshaped" runs without tbf.

  bench/seed002_hosts.py [--build build] [--models cnn,vgg19] [--steps 300] [--vgg_steps 6]
                         [--vgg_workers 2] [--rate 1gbit] [--repeats 1] [--configs none/round_robin,...]
                         [--out bench/plots/seed002_hosts.jsonl]

Needs root (network namespaces); prints why and exits 77 otherwise. The machine's other load
matters: record it (loadavg fields) and compare runs made side by side.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "netns"))
import cluster  # noqa: E402
import hosts  # noqa: E402

CONFIGS = [("none", "round_robin"), ("fixed:2", "round_robin"), ("none", "greedy"), ("fixed:2", "greedy")]


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def run_job(a, model, workers, steps, partitioner, placement, rate, extra=(), per_ps_out=None, on_step=None):
    """One job; its JSON row, or None when it failed. `per_ps_out` (a list): gets the summary's
    ps_traffic entries (bench/overlap_hosts.py prints them per step). `on_step(net, job, step, t)`:
    called (from the 0.1 s poll) whenever the highest global step a worker logged rises, t the
    time.time() it was seen (bench/overlap_hosts.py's steady-state rate)."""
    workdir = tempfile.mkdtemp(prefix=f"seed002_{model}_")
    load_before = loadavg()
    with hosts.Network() as net:
        flags = [f"--model={model}", f"--train_steps={steps}", f"--data_dir={a.data_dir}", f"--partitioner={partitioner}",
                 f"--placement={placement}", "--log_every=1", *extra]
        job = cluster.Job(net, a.psflow, workdir, 2, workers, flags)
        congestion = getattr(a, "congestion", "")  # "": the machine's default
        if congestion:
            for t in job.tasks:
                net.set_congestion(job.host(t), congestion)
        congestion = net.congestion(job.host("ps:0"))
        if rate:
            for i in range(2):
                net.shape(job.host(f"ps:{i}"), rate)
        start = time.time()
        job.start_all()
        first_step = None
        seen_step = 0
        deadline = start + a.timeout
        while time.time() < deadline and any(c is None for c in job.poll().values()):
            if first_step is None and re.search(r"^step \d+/", job.text("worker:0"), re.M):
                first_step = time.time() - start
            if on_step is not None:
                now, step = time.time(), job.latest_step()
                if step > seen_step:
                    seen_step = step
                    on_step(net, job, step, now)
            time.sleep(0.1)
        codes = job.wait_all(max(1, deadline - time.time()))
        wall = max(job.exited.values()) - start if job.exited else None
        link = [net.link_stats(job.host(f"ps:{i}")) for i in range(2)]
        if any(c != 0 for c in codes.values()):
            print(f"run failed: exit statuses {codes}; logs kept in {workdir}\n{job.logs_tail(5)}", file=sys.stderr)
            return None
        s = job.summary()
    shutil.rmtree(workdir, ignore_errors=True)
    if per_ps_out is not None:
        per_ps_out.extend(s["ps_traffic"])
    traffic = [t["bytes_in"] + t["bytes_out"] for t in s["ps_traffic"]]
    busiest = max(range(2), key=lambda i: traffic[i])
    # Per direction: what the busiest ps receives (pushes) and sends (pulls) per global step.
    per_step_in = s["ps_traffic"][busiest]["bytes_in"] / s["global_step"]
    per_step_out = s["ps_traffic"][busiest]["bytes_out"] / s["global_step"]
    rate_bytes = hosts._rate_bits(rate) / 8 if rate else None
    return {
        "model": model, "ps": 2, "workers": workers, "partitioner": partitioner, "placement": placement,
        "link_rate": rate or "unshaped", "congestion": congestion, "global_step": s["global_step"], "train_seconds": round(s["train_seconds"], 2),
        "global_steps_per_sec": round(s["global_step"] / s["train_seconds"], 3),
        "wall_secs": round(wall, 1), "init_secs": round(first_step, 1) if first_step else None,
        "test_accuracy": s["test_accuracy"],
        "bytes_per_ps": traffic, "max_over_mean_traffic": round(max(traffic) / (sum(traffic) / 2), 4),
        "link_bytes_per_ps": [l["tx_bytes"] + l["rx_bytes"] for l in link],
        "busiest_ps_bytes_per_step_in_out": [round(per_step_in), round(per_step_out)],
        "link_limit_steps_per_sec": round(rate_bytes / max(per_step_in, per_step_out), 4) if rate_bytes else None,
        "loadavg_before": load_before, "loadavg_after": loadavg(),
    }


def compute_limit(a, model, steps):
    """The model trained in one process, all cores: steps/s with no network at all."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "m.json")
        load_before = loadavg()
        subprocess.run([a.psflow, "train", f"--model={model}", f"--train_steps={steps}", f"--data_dir={a.data_dir}",
                        f"--metrics_json={out}"], check=True, stdout=subprocess.DEVNULL)
        s = json.load(open(out))
    return {"kind": "compute_limit", "model": model, "global_step": s["global_step"],
            "global_steps_per_sec": round(s["global_step"] / s["train_seconds"], 3),
            "loadavg_before": load_before, "loadavg_after": loadavg()}


def parse_args_or_skip(p):
    """p's arguments (it has --build and --data_dir), with a.psflow the binary and a.data_dir made
    absolute; exits with hosts.SKIP when the simulated hosts are unavailable here."""
    a = p.parse_args()
    a.psflow = os.path.join(os.path.abspath(a.build), "psflow")
    a.data_dir = os.path.abspath(a.data_dir)
    reason = hosts.unavailable()
    if reason:
        print(f"SKIPPED: simulated hosts unavailable: {reason}")
        sys.exit(hosts.SKIP)
    check_congestion(getattr(a, "congestion", ""))
    return a


def check_congestion(name):
    """Exits with one line when a network namespace may not choose TCP congestion control `name`."""
    if not name:
        return
    with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
        allowed = f.read().split()
    if name not in allowed:
        sys.exit(f"--congestion={name}: a network namespace here may choose only {' or '.join(allowed)} "
                 "(net.ipv4.tcp_allowed_congestion_control)")


def emit_json_line(row, out):
    """Prints row as a JSON line and, given an --out file, appends the line to it."""
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data_dir", default=os.path.join(ROOT, "data/mnist"))
    p.add_argument("--models", default="cnn,vgg19")
    p.add_argument("--steps", type=int, default=300, help="cnn global steps per run")
    p.add_argument("--workers", type=int, default=7)
    p.add_argument("--vgg_steps", type=int, default=6)
    p.add_argument("--vgg_workers", type=int, default=2)
    p.add_argument("--rate", default="1gbit", help="tc tbf rate of each ps link, both ways ('' = unshaped)")
    p.add_argument("--configs", default=",".join(f"{x}/{y}" for x, y in CONFIGS),
                   help="partitioner/placement[/rate],... (rate overrides --rate; 'unshaped': no tbf)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each configuration, interleaved")
    p.add_argument("--timeout", type=float, default=900, help="a run not over after this long is killed")
    p.add_argument("--out", default="", help="also append the JSON lines to this file")
    a = parse_args_or_skip(p)
    # partitioner/placement[/rate]: a third field overrides --rate ("unshaped": no tbf at all).
    configs = [(c.split("/") + [a.rate])[:3] for c in a.configs.split(",")]

    def emit(row):
        if row is not None:
            emit_json_line(row, a.out)

    for model in a.models.split(","):
        workers, steps = (a.vgg_workers, a.vgg_steps) if model == "vgg19" else (a.workers, a.steps)
        # Repeats go round the configurations, so that the machine's changing load hits them alike.
        for repeat in range(a.repeats):
            for partitioner, placement, rate in configs:
                rate = "" if rate == "unshaped" else rate
                row = run_job(a, model, workers, steps, partitioner, placement, rate)
                if row is not None:
                    row["repeat"] = repeat
                emit(row)
        emit(compute_limit(a, model, steps))


if __name__ == "__main__":
    main()
