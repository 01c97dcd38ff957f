#!/usr/bin/python3
"""When the network binds (issue 28's figures): seed 002's cnn (2 ps + 7 workers, --partitioner=fixed:2)
and vgg19 (2 ps + 2 workers, fixed:2) on simulated hosts (network namespaces, veth, the ps links
shaped with tc tbf both ways: tests/netns/hosts.py, as bench/seed002_hosts.py does), async, at each
--rates, with each --overlap (none = today's compute, then push, then pull; push = each gradient
pushed as backward finishes it; push_pull = and the next pull in forward order, the first layers
first: "overlap + priority") and each --wire_dtype (float32, bfloat16), side by side in one run.

One JSON line per run (bench/seed002_hosts.py's fields: global_steps_per_sec, the busiest ps's
bytes per global step in and out, and link_limit_steps_per_sec = the link's rate / the busiest
direction's bytes per step), then per model and rate a table: steps/s, the link limit beside it,
steps/s over the limit, and the speed-up over none/float32 (today); and each run's per-ps traffic
table (bytes in and out per ps per global step).

  sudo nice -n 10 /usr/bin/python3 bench/overlap_hosts.py [--build build] [--models cnn,vgg19]
      [--rates 100mbit,1gbit] [--overlaps none,push,push_pull] [--wire_dtypes float32,bfloat16]
      [--steps 100] [--vgg_steps 4] [--out bench/plots/overlap_hosts.jsonl]

Needs root (network namespaces); exits 77 and says why otherwise. The machine's load matters:
each line records the load average before and after.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import seed002_hosts  # noqa: E402  (run_job, the arguments and the JSON lines; tests/netns on the path)


def traffic_table(row, per_ps):
    lines = ["    ps   bytes in/step   bytes out/step"]
    for t in per_ps:
        lines.append(f"    {t['task']:>2} {t['bytes_in'] / row['global_step']:>15,.0f} "
                     f"{t['bytes_out'] / row['global_step']:>16,.0f}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data_dir", default=os.path.join(ROOT, "data/mnist"))
    p.add_argument("--models", default="cnn,vgg19")
    p.add_argument("--rates", default="100mbit,1gbit")
    p.add_argument("--overlaps", default="none,push,push_pull")
    p.add_argument("--wire_dtypes", default="float32,bfloat16")
    p.add_argument("--steps", type=int, default=100, help="cnn global steps per run")
    p.add_argument("--workers", type=int, default=7)
    p.add_argument("--vgg_steps", type=int, default=4)
    p.add_argument("--vgg_workers", type=int, default=2)
    p.add_argument("--partitioner", default="fixed:2")
    p.add_argument("--timeout", type=float, default=900, help="a run not over after this long is killed")
    p.add_argument("--out", default="", help="also append the JSON lines to this file")
    a = seed002_hosts.parse_args_or_skip(p)

    def emit(row):
        seed002_hosts.emit_json_line(row, a.out)

    summary = []
    for model in a.models.split(","):
        workers, steps = (a.vgg_workers, a.vgg_steps) if model == "vgg19" else (a.workers, a.steps)
        for rate in a.rates.split(","):
            rows = []
            for wire in a.wire_dtypes.split(","):
                for overlap in a.overlaps.split(","):
                    extra = [f"--overlap={overlap}", f"--wire_dtype={wire}"]
                    per_ps = []
                    row = seed002_hosts.run_job(a, model, workers, steps, a.partitioner, "round_robin", rate, extra,
                                                per_ps_out=per_ps)
                    if row is None:
                        print(f"{model} {rate} {overlap} {wire}: the run failed (see above)", flush=True)
                        continue
                    row.update(overlap=overlap, wire_dtype=wire)
                    emit(row)
                    print(traffic_table(row, per_ps), flush=True)
                    rows.append(row)
            summary.append((model, rate, rows))

    for model, rate, rows in summary:
        base = next((r for r in rows if r["overlap"] == "none" and r["wire_dtype"] == "float32"), None)
        print(f"\n{model}, {rate} per ps link, {rows[0]['workers'] if rows else '?'} workers, 2 ps ({a.partitioner}):")
        print(f"  {'overlap':<10} {'wire':<9} {'steps/s':>8} {'link limit':>10} {'of limit':>8} {'vs today':>8}")
        for r in rows:
            limit = r["link_limit_steps_per_sec"]
            print(f"  {r['overlap']:<10} {r['wire_dtype']:<9} {r['global_steps_per_sec']:>8.3f} {limit:>10.2f} "
                  f"{r['global_steps_per_sec'] / limit:>8.2f} "
                  f"{r['global_steps_per_sec'] / base['global_steps_per_sec'] if base else float('nan'):>8.2f}")


if __name__ == "__main__":
    main()
