#!/usr/bin/python3
"""Watches a ps task's link (--ps, default 0) during one job on simulated hosts (tests/netns/hosts.py): what the wire
does while seed 002's cnn (or another --model) trains, to tell a link that is full from one that
waits. Every 0.1 s the bytes the ps's eth0 sent (pulls and push answers: "out") and received (pushes:
"in"); every second `tc -s qdisc` of both ends of its link (sent, dropped, overlimits, backlog) and
`ss -tin` (cwnd, rtt, retransmits, unsent bytes of each connection), kept in --keep_dir.

Prints one JSON line: steps/s, the busiest ps's bytes per global step, the link limit
(bench/seed002_hosts.py's: rate / busiest direction's bytes per step), the qdisc drops, and over the
middle of the run (the first and last tenth left out) the mean rate each way and the share of
0.5 s windows in which out, in, both or neither ran above 90 % of the rate — a job bound by its
link keeps both directions near the rate at once. With --trace, the 0.1 s series as bars.

  sudo /usr/bin/python3 bench/link_watch.py [--build build] [--model cnn] [--workers 7] [--steps 60]
      [--ps 0] [--rate 100mbit] [--latency 50ms] [--ack_priority none|host|both]
      [--flags "--overlap=push --wire_dtype=bfloat16"] [--keep_dir DIR] [--trace]

--ack_priority (an experiment, not a model of a switch): shapes the ends named with htb instead of
tbf, same rate, burst and queue, with packets under 128 bytes (TCP's pure ACKs) in a class of their
own served first — what a host's fq_codel does for sparse flows, which this kernel lacks.
Needs root (network namespaces); exits 77 and says why otherwise.
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


def run(*argv):
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def shape_ack_priority(ns, dev, rate, burst, latency_secs):
    """htb at `rate` with small packets (pure ACKs) first and the rest in a FIFO of tbf's size."""
    limit = int(hosts._rate_bits(rate) / 8 * latency_secs) + burst
    run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "20")
    for cls, parent, extra in (("1:1", "1:", []), ("1:10", "1:1", ["prio", "0"]), ("1:20", "1:1", ["prio", "1"])):
        run("tc", "-n", ns, "class", "add", "dev", dev, "parent", parent, "classid", cls, "htb", "rate",
            rate if cls != "1:10" else "1mbit", "ceil", rate, "burst", str(burst), "cburst", str(burst), *extra)
    run("tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:20", "handle", "20:", "bfifo", "limit", str(limit))
    # IPv4 total length < 128: bytes 2-3 of the IP header.
    run("tc", "-n", ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match",
        "u16", "0", "0xff80", "at", "2", "flowid", "1:10")


def link_summary(samples, rate_bits):
    """Mean Mbit/s each way and shares of 0.5 s windows above 90 % of the rate, middle 80 % of the run."""
    windows = []
    for i in range(5, len(samples), 5):
        (t0, tx0, rx0), (t1, tx1, rx1) = samples[i - 5], samples[i]
        windows.append(((tx1 - tx0) * 8 / (t1 - t0), (rx1 - rx0) * 8 / (t1 - t0)))
    busy = [i for i, (o, n) in enumerate(windows) if o + n > 0.05 * rate_bits]
    if len(busy) < 10:
        return {}
    cut = (busy[-1] - busy[0]) // 10
    mid = windows[busy[0] + cut:busy[-1] - cut + 1]
    hi = 0.9 * rate_bits

    def share(pred):
        return round(sum(1 for w in mid if pred(*w)) / len(mid), 2)

    return {"out_mbit_s": round(sum(o for o, _ in mid) / len(mid) / 1e6, 1),
            "in_mbit_s": round(sum(n for _, n in mid) / len(mid) / 1e6, 1),
            "out_full": share(lambda o, n: o > hi), "in_full": share(lambda o, n: n > hi),
            "both_full": share(lambda o, n: o > hi and n > hi), "neither_full": share(lambda o, n: o <= hi and n <= hi)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data_dir", default=os.path.join(ROOT, "data/mnist"))
    p.add_argument("--model", default="cnn")
    p.add_argument("--workers", type=int, default=7)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--partitioner", default="fixed:2")
    p.add_argument("--ps", type=int, default=0, choices=[0, 1], help="the ps task whose link is watched")
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--latency", default="50ms", help="tbf's queue, as the time it takes to drain")
    p.add_argument("--ack_priority", default="none", choices=["none", "host", "both"])
    p.add_argument("--congestion", default="", help="TCP congestion control in every task's namespace (default: "
                   "the machine's, net.ipv4.tcp_congestion_control)")
    p.add_argument("--flags", default="--overlap=push --wire_dtype=bfloat16", help="more psflow train flags")
    p.add_argument("--keep_dir", default="", help="keep the logs, tc and ss samples here")
    p.add_argument("--trace", action="store_true", help="print the 0.1 s series of the watched ps's link")
    p.add_argument("--timeout", type=float, default=900)
    a = p.parse_args()
    reason = hosts.unavailable()
    if reason:
        print(f"SKIPPED: simulated hosts unavailable: {reason}")
        sys.exit(hosts.SKIP)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import seed002_hosts  # noqa: E402  (check_congestion)
    seed002_hosts.check_congestion(a.congestion)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)ms", a.latency)
    if not m:
        sys.exit(f"--latency '{a.latency}' is not like 50ms")
    psflow = os.path.join(os.path.abspath(a.build), "psflow")
    workdir = a.keep_dir or tempfile.mkdtemp(prefix="link_watch_")
    os.makedirs(workdir, exist_ok=True)
    rate_bits = hosts._rate_bits(a.rate)
    burst = max(64 * 1024, int(rate_bits / 8 * 0.005))  # hosts.shape()'s default
    with hosts.Network() as net:
        flags = [f"--model={a.model}", f"--train_steps={a.steps}", f"--data_dir={os.path.abspath(a.data_dir)}",
                 f"--partitioner={a.partitioner}", "--log_every=1", *a.flags.split()]
        job = cluster.Job(net, psflow, workdir, 2, a.workers, flags)
        if a.congestion:
            for t in job.tasks:
                net.set_congestion(job.host(t), a.congestion)
        congestion = net.congestion(job.host("worker:0"))
        for i in range(2):
            h = job.host(f"ps:{i}")
            net.shape(h, a.rate, latency=a.latency)
            if a.ack_priority in ("host", "both"):
                shape_ack_priority(h.ns, "eth0", a.rate, burst, float(m.group(1)) / 1000)
            if a.ack_priority == "both":
                shape_ack_priority(net.bridge_ns, h.bridge_if, a.rate, burst, float(m.group(1)) / 1000)
        watched = job.host(f"ps:{a.ps}")
        stats = "/sys/class/net/eth0/statistics"
        sampler = subprocess.Popen(
            ["ip", "netns", "exec", watched.ns, "sh", "-c",
             f"while :; do read t < {stats}/tx_bytes; read r < {stats}/rx_bytes; echo $(date +%s.%N) $t $r; "
             "sleep 0.1; done"], stdout=open(os.path.join(workdir, "bytes.txt"), "w"))
        start = time.time()
        job.start_all()
        with open(os.path.join(workdir, "ss.txt"), "w") as ss, open(os.path.join(workdir, "tc.txt"), "w") as tc:
            while any(c is None for c in job.poll().values()) and time.time() < start + a.timeout:
                t = f"=== {time.time() - start:.1f} s\n"
                ss.write(t + run("ip", "netns", "exec", watched.ns, "ss", "-tin"))
                tc.write(t + f"out (ps {a.ps} eth0):\n" + run("tc", "-n", watched.ns, "-s", "qdisc", "show", "dev", "eth0") +
                         "in (bridge port):\n" + run("tc", "-n", net.bridge_ns, "-s", "qdisc", "show", "dev",
                                                     watched.bridge_if))
                time.sleep(1.0)
        codes = job.wait_all(max(1, start + a.timeout - time.time()))
        sampler.kill()
        sampler.wait()
        qdiscs = [run("tc", "-n", watched.ns, "-s", "qdisc", "show", "dev", "eth0"),
                  run("tc", "-n", net.bridge_ns, "-s", "qdisc", "show", "dev", watched.bridge_if)]
        if any(c != 0 for c in codes.values()):
            sys.exit(f"the job failed: exit statuses {codes}; logs in {workdir}\n{job.logs_tail(5)}")
        s = job.summary()
    with open(os.path.join(workdir, "bytes.txt")) as f:
        samples = [(float(t), int(tx), int(rx)) for t, tx, rx in (line.split() for line in f if len(line.split()) == 3)]
    busiest = max(s["ps_traffic"], key=lambda t: t["bytes_in"] + t["bytes_out"])
    per_step = [busiest["bytes_in"] / s["global_step"], busiest["bytes_out"] / s["global_step"]]
    row = {"model": a.model, "workers": a.workers, "rate": a.rate, "latency": a.latency,
           "ack_priority": a.ack_priority, "flags": a.flags, "watched_ps": a.ps, "congestion": congestion, "global_step": s["global_step"],
           "global_steps_per_sec": round(s["global_step"] / s["train_seconds"], 3),
           "busiest_ps_bytes_per_step_in_out": [round(x) for x in per_step],
           "link_limit_steps_per_sec": round(rate_bits / 8 / max(per_step), 2),
           "drops_out_in": [int(re.search(r"dropped (\d+)", q).group(1)) for q in qdiscs],
           "watched_link": link_summary(samples, rate_bits), "loadavg": os.getloadavg()}
    if a.keep_dir:
        row["kept"] = workdir
    print(json.dumps(row), flush=True)
    if a.trace:
        for (t0, tx0, rx0), (t1, tx1, rx1) in zip(samples, samples[1:]):
            o, n = (tx1 - tx0) * 8 / (t1 - t0), (rx1 - rx0) * 8 / (t1 - t0)
            bar = lambda v: "#" * int(10 * v / rate_bits)  # noqa: E731
            print(f"{t1 - samples[0][0]:6.2f} s  out {o / 1e6:5.0f} {bar(o):<11} in {n / 1e6:5.0f} {bar(n)}")
    if not a.keep_dir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
