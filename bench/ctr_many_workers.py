#!/usr/bin/python3
"""The ctr job with many workers (issue 27.6, docs/sync-async.md#many-workers): the same examples
(--examples, default 2,048,000 = 2000 global batches of 1024) trained by W workers of batch B
(default 8 x 128) in each mode, beside one process of batch W*B:

  async            psflow local --workers=W --batch_size=B                      (W*steps pushes of B)
  async, staleness + --staleness_aware_lr (a dense push of staleness t at lr / max(1, t))
  sync             + --sync_replicas                                            (steps of W*B)
  hybrid           + --sync_replicas --table_sync=async (dense sync, tables as pushes arrive)
  one process      psflow train --batch_size=W*B

Every task of `psflow local` runs on this machine: with more workers than cores they share them
(the 2-core machine runs 8 workers and 2 ps tasks overcommitted), so samples/s compare the modes
under the same load, not what 8 machines would do. Prints one JSON line per run, then a markdown
table: test AUC and log-loss on the generator's test set, AUC minus sync's, samples/s and its ratio
to async's, and the staleness distribution the ps measured (async modes).

Then where the time went: each worker's step in phases (its log line "step timing": data,
lookup, forward+backward, push and wait; wall and the thread's CPU, averaged over the workers; sync
workers fill the batch after next on a thread of their own during the wait: "data beside the wait"), the
sync ps tasks' barrier (their "sync timing" line: a push's wait for its step's quorum, the step's
first arrival to its quorum, its apply and its answers, averaged over the ps tasks), and the job's
CPU: CPU seconds of all its processes per 1024 examples and the cores it kept busy (CPU / wall).

--load N starts N busy loops at nice 5 (as the machine's other builds run) for every run, so the
modes can be compared under a known load; --repeats R runs the modes R times in rotation and keeps
each mode's median samples/s (the run of that median is the one shown), and prints each round's
ratio to async (the runs of a round ran one right after the other, so the machine's load moved
least between them). --extra passes more flags to every run (e.g. --extra=--partitioner=fixed:2).

  bench/ctr_many_workers.py [--build build] [--workers 8] [--batch 128] [--examples 2048000]
                            [--ps 2] [--seed 1] [--modes async,staleness,sync,hybrid,single]
                            [--load 0] [--repeats 1] [--extra FLAGS]
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABELS = {"async": "async", "staleness": "async, --staleness_aware_lr", "sync": "sync",
          "hybrid": "hybrid (--table_sync=async)", "single": "one process"}


def command(a, mode, metrics):
    psflow = os.path.join(a.build, "psflow")
    global_batch = a.workers * a.batch
    sync_steps = a.examples // global_batch
    common = ["--model=ctr", f"--seed={a.seed}", f"--metrics_json={metrics}", "--log_every=1000000"] + a.extra.split()
    if mode == "single":
        return [psflow, "train", f"--batch_size={global_batch}", f"--train_steps={sync_steps}"] + common
    cmd = [psflow, "local", f"--ps={a.ps}", f"--workers={a.workers}", f"--batch_size={a.batch}"] + common
    if mode in ("async", "staleness"):
        cmd.append(f"--train_steps={sync_steps * a.workers}")
        if mode == "staleness":
            cmd.append("--staleness_aware_lr")
    else:
        cmd += [f"--train_steps={sync_steps}", "--sync_replicas"]
        if mode == "hybrid":
            cmd.append("--table_sync=async")
    return cmd


PHASES = ("data", "lookup", "forward+backward", "push and wait")
WORKER_TIMING = re.compile(r"worker \d+ step timing: (\d+) steps; ms per step, wall/cpu: data ([\d.]+)/([\d.]+) "
                           r"lookup ([\d.]+)/([\d.]+) forward\+backward ([\d.]+)/([\d.]+) push and wait ([\d.]+)/([\d.]+)"
                           r"(?:; data filled beside the wait ([\d.]+)/([\d.]+))?")
PS_TIMING = re.compile(r"ps task \d+ sync timing: (\d+) steps of [\d.]+ pushes; a push waited for its step's quorum "
                       r"([\d.]+) ms on average, the step's first push ([\d.]+) ms \(first arrival to quorum\); "
                       r"apply ([\d.]+) ms, answering the step's pushes ([\d.]+) ms")


def timing(log):
    """The workers' step phases (mean over workers, ms per step: [wall, cpu] each) and the sync ps
    tasks' barrier figures (mean over the ps tasks), from the job's log."""
    workers = [[float(x or 0) for x in m.groups()[1:]] for m in WORKER_TIMING.finditer(log)]
    ps = [[float(x) for x in m.groups()[1:]] for m in PS_TIMING.finditer(log)]
    out = {}
    if workers:
        mean = [statistics.mean(col) for col in zip(*workers)]
        out["worker_ms"] = {p: [round(mean[2 * i], 3), round(mean[2 * i + 1], 3)]
                            for i, p in enumerate(PHASES + ("data beside the wait",))}
    if ps:
        mean = [statistics.mean(col) for col in zip(*ps)]
        out["ps_ms"] = dict(zip(("push_wait", "first_to_quorum", "apply", "answer"), (round(x, 3) for x in mean)))
    return out


def run(a, mode):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.json")
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.time()
        done = subprocess.run(command(a, mode, metrics), check=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        wall = time.time() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        m = json.load(open(metrics))
        m["wall_seconds"] = wall
        m["loadavg_before"] = load
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        examples = m["global_step"] * (a.workers * a.batch if mode in ("sync", "hybrid", "single") else a.batch)
        m["cpu_ms_per_1024"] = 1e3 * cpu / (examples / 1024)
        m["cores_busy"] = cpu / wall
        m.update(timing(done.stdout))
        return m


def busy_loops(n):
    """n busy processes at nice 5 (the other builds' priority); the caller kills them."""
    return [subprocess.Popen(["nice", "-n", "5", "/usr/bin/python3", "-c", "while True: pass"]) for _ in range(n)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch", type=int, default=128, help="per-worker batch")
    p.add_argument("--examples", type=int, default=2048000, help="training examples of every run")
    p.add_argument("--ps", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--modes", default="async,staleness,sync,hybrid,single")
    p.add_argument("--load", type=int, default=0, help="busy loops at nice 5 beside every run")
    p.add_argument("--repeats", type=int, default=1, help="runs of every mode, in rotation; the median is kept")
    p.add_argument("--extra", default="", help="more flags for every run, space-separated")
    a = p.parse_args()
    modes = a.modes.split(",")
    runs = {mode: [] for mode in modes}
    loops = busy_loops(a.load)
    try:
        for r in range(a.repeats):
            for mode in modes:
                m = run(a, mode)
                runs[mode].append(m)
                print(json.dumps(line_of(a, mode, m, r)), flush=True)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    results = {}
    for mode in modes:  # each mode's median run by samples/s
        ordered = sorted(runs[mode], key=lambda m: m["examples_per_sec"])
        results[mode] = ordered[(len(ordered) - 1) // 2]
    table(a, results)
    if a.repeats > 1 and "async" in runs:
        print()
        print("Each round's samples/s over its async run's (the runs of a round ran one after the other):")
        for mode in modes:
            if mode != "async":
                ratios = [m["examples_per_sec"] / r["examples_per_sec"] for m, r in zip(runs[mode], runs["async"])]
                print("  %s: %s" % (LABELS[mode], ", ".join("%.2f" % x for x in ratios)))


def line_of(a, mode, m, repeat):
    line = {"mode": mode, "workers": 1 if mode == "single" else a.workers, "global_step": m["global_step"],
                "train_seconds": round(m["train_seconds"], 2), "examples_per_sec": round(m["examples_per_sec"]),
                "test_auc": m["ctr"]["test_auc"], "test_log_loss": m["ctr"]["test_log_loss"],
                "bayes_auc": m["ctr"]["bayes_auc"], "loadavg_before": round(m["loadavg_before"], 2),
                "cores": os.cpu_count(), "load": a.load, "repeat": repeat,
                "cpu_ms_per_1024": round(m["cpu_ms_per_1024"], 2), "cores_busy": round(m["cores_busy"], 2)}
    for key in ("worker_ms", "ps_ms"):
        if key in m:
            line[key] = m[key]
    if "staleness" in m:
        line["staleness"] = {k: m["staleness"][k] for k in ("mean", "p50", "p90", "p99", "max")}
    return line


def table(a, results):
    sync_auc = results.get("sync", {}).get("ctr", {}).get("test_auc")
    async_rate = results.get("async", {}).get("examples_per_sec")
    print()
    print(f"| mode ({a.workers} x {a.batch}, {a.ps} ps; one process: {a.workers * a.batch}) | global steps | "
          "test AUC | AUC - sync | test log-loss | samples/s | / async | staleness mean, p90, max |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, m in results.items():
        auc, rate, st = m["ctr"]["test_auc"], m["examples_per_sec"], m.get("staleness")
        vs_sync = "" if sync_auc is None else "%+.4f" % (auc - sync_auc)
        vs_async = "" if not async_rate else "%.2f" % (rate / async_rate)
        stale = "" if st is None else "%.2f, %d, %d" % (st["mean"], st["p90"], st["max"])
        print("| %s | %d | %.4f | %s | %.5f | %s | %s | %s |" % (
            LABELS[mode], m["global_step"], auc, vs_sync, m["ctr"]["test_log_loss"], f"{rate:,.0f}", vs_async, stale))
    print()
    print("Where the time went (ms per worker step, wall / CPU, mean over the workers; sync ps tasks: ms per step")
    print("or per push, mean over the ps tasks; the job's CPU per 1024 examples and the cores it kept busy):")
    print()
    print("| mode | data | lookup | forward+backward | push and wait | data beside the wait | push's wait for quorum "
          "| first arrival to quorum | apply | answers | CPU ms / 1024 ex. | cores busy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, m in results.items():
        w = m.get("worker_ms")
        cells = ["%.2f / %.2f" % tuple(w[p]) for p in PHASES + ("data beside the wait",)] if w else [""] * 5
        ps = m.get("ps_ms")
        cells += ["%.2f" % ps[k] for k in ("push_wait", "first_to_quorum", "apply", "answer")] if ps else [""] * 4
        print("| %s | %s | %.1f | %.2f |" % (LABELS[mode], " | ".join(cells), m["cpu_ms_per_1024"], m["cores_busy"]))

if __name__ == "__main__":
    main()
