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

  bench/ctr_many_workers.py [--build build] [--workers 8] [--batch 128] [--examples 2048000]
                            [--ps 2] [--seed 1] [--modes async,staleness,sync,hybrid,single]
"""
import argparse
import json
import os
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
    common = ["--model=ctr", f"--seed={a.seed}", f"--metrics_json={metrics}", "--log_every=1000000"]
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


def run(a, mode):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.json")
        load = os.getloadavg()[0]
        start = time.time()
        subprocess.run(command(a, mode, metrics), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        m = json.load(open(metrics))
        m["wall_seconds"] = time.time() - start
        m["loadavg_before"] = load
        return m


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch", type=int, default=128, help="per-worker batch")
    p.add_argument("--examples", type=int, default=2048000, help="training examples of every run")
    p.add_argument("--ps", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--modes", default="async,staleness,sync,hybrid,single")
    a = p.parse_args()
    results = {}
    for mode in a.modes.split(","):
        m = run(a, mode)
        results[mode] = m
        line = {"mode": mode, "workers": 1 if mode == "single" else a.workers, "global_step": m["global_step"],
                "train_seconds": round(m["train_seconds"], 2), "examples_per_sec": round(m["examples_per_sec"]),
                "test_auc": m["ctr"]["test_auc"], "test_log_loss": m["ctr"]["test_log_loss"],
                "bayes_auc": m["ctr"]["bayes_auc"], "loadavg_before": round(m["loadavg_before"], 2),
                "cores": os.cpu_count()}
        if "staleness" in m:
            line["staleness"] = {k: m["staleness"][k] for k in ("mean", "p50", "p90", "p99", "max")}
        print(json.dumps(line), flush=True)
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

if __name__ == "__main__":
    main()
