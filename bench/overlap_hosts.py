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

Two rates per run. "whole" is the chief's: global steps / its train_seconds, which takes in the
chief's initialization (the initial values, float32 whatever the wire) and every worker's first
pull — for vgg19's short runs a fifth to a third of a ps's bytes. "steady" is the rate in training
proper, as TF's StepCounterHook reports it: from the moment the global step first reaches
2 x workers (every worker past its second step, on average) to the moment it reaches the last
step but one per worker (steps - workers), the same rule for every arm, both seen by the 0.1 s
poll of the workers' logs. (Not the last step: an async worker with --overlap defers its push and
logs the step it claimed when its next step collects the answer, a forward and backward later,
but waits for the push that ends training, whose step it logs at once; both marks must be logged
the same way.) Beside it the
bytes each ps's link carried per global step over that window (its own tx/rx counters, so with
TCP/IP headers and ACKs) and a steady link limit: the link's rate / the busiest direction's bytes
per step, those link bytes scaled by the run's psflow-bytes / link-bytes ratio of that ps (so
both limits count psflow's bytes). The issue's goals are taken on the steady rate.

  sudo nice -n 10 /usr/bin/python3 bench/overlap_hosts.py [--build build] [--models cnn,vgg19]
      [--rates 100mbit,1gbit] [--overlaps none,push,push_pull] [--wire_dtypes float32,bfloat16]
      [--steps 100] [--vgg_steps 24] [--slices 0,262144] [--congestion reno]
      [--out bench/plots/overlap_hosts.jsonl]

--slices: --transfer_slice_bytes values for the push_pull arms (0: none; push_pull with slices
shows as "push_pull/S" with S the slice size in KiB): a big variable's push and pull pipelined in
slices, each pulled back as soon as its push is answered (docs/sync-async.md#overlap).

--congestion: the TCP congestion control every task's sockets use (default reno; '' keeps the
machine's). A Linux cluster runs cubic unless told otherwise, a loss-based one; a namespace may
choose only what net.ipv4.tcp_allowed_congestion_control lists, which here is reno and bbr (this
machine's default), so reno stands in for cubic. bbr (v1, the kernel's) starves whichever direction
of a ps's link has its ACKs queued behind the other direction's data (its window is capped at twice
the bandwidth times the emptiest round trip it saw, ~2 ms, while such ACKs wait up to tbf's 50 ms),
and a job that pushes and pulls at once (slices) loads both directions: docs/sync-async.md#overlap.

vgg19's default 24 steps: the steady window (global steps 4 to 22, nine steps per worker) is long
enough that its first steps (slower, while the TCP connections find their windows) do not weigh.

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


class Steady:
    """Global step and each ps link's counters when the step first reaches `warm` and `last`."""

    def __init__(self, warm, last):
        self.warm, self.last = warm, last
        self.marks = {}  # "warm"/"last" -> (global step, time, [link stats per ps])

    def __call__(self, net, job, step, t):
        for name, at in (("warm", self.warm), ("last", self.last)):
            if name not in self.marks and step >= at:
                self.marks[name] = (step, t, [net.link_stats(job.host(f"ps:{i}")) for i in range(2)])

    def fields(self, row, rate):
        """The row's steady_* fields, or {} when the run was too short to see both marks."""
        if "warm" not in self.marks or "last" not in self.marks or self.marks["last"][0] <= self.marks["warm"][0]:
            return {}
        (s0, t0, l0), (s1, t1, l1) = self.marks["warm"], self.marks["last"]
        steps = s1 - s0
        per_ps = [[(b["rx_bytes"] - a["rx_bytes"]) / steps, (b["tx_bytes"] - a["tx_bytes"]) / steps]
                  for a, b in zip(l0, l1)]
        # The link counts headers and ACKs: scale to psflow's bytes by the whole run's ratio per ps.
        scale = [p / l if l else 1.0 for p, l in zip(row["bytes_per_ps"], row["link_bytes_per_ps"])]
        busiest = max(max(d) * k for d, k in zip(per_ps, scale))
        rate_bytes = seed002_hosts.hosts._rate_bits(rate) / 8
        return {"steady_steps_per_sec": round(steps / (t1 - t0), 4), "steady_window_steps": [s0, s1],
                "steady_window_secs": round(t1 - t0, 2),
                "steady_link_bytes_per_step_in_out": [[round(x) for x in d] for d in per_ps],
                "steady_link_limit_steps_per_sec": round(rate_bytes / busiest, 4)}


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
    p.add_argument("--vgg_steps", type=int, default=24)
    p.add_argument("--vgg_workers", type=int, default=2)
    p.add_argument("--slices", default="0,262144", help="--transfer_slice_bytes values for the push_pull arms")
    p.add_argument("--partitioner", default="fixed:2")
    p.add_argument("--congestion", default="reno",
                   help="TCP congestion control of every task ('': the machine's default; see the docstring)")
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
                arms = []
                for overlap in a.overlaps.split(","):
                    for sb in (a.slices.split(",") if overlap == "push_pull" else ["0"]):
                        arms.append((overlap, int(sb)))
                for overlap, slice_bytes in arms:
                    extra = [f"--overlap={overlap}", f"--wire_dtype={wire}"]
                    if overlap == "push_pull":  # 0 too: the flag's default slices
                        extra.append(f"--transfer_slice_bytes={slice_bytes}")
                    per_ps = []
                    steady = Steady(2 * workers, steps - workers)
                    row = seed002_hosts.run_job(a, model, workers, steps, a.partitioner, "round_robin", rate, extra,
                                                per_ps_out=per_ps, on_step=steady)
                    if row is None:
                        print(f"{model} {rate} {overlap} {slice_bytes} {wire}: the run failed (see above)", flush=True)
                        continue
                    label = overlap if slice_bytes == 0 else f"{overlap}/{slice_bytes >> 10}"
                    row.update(overlap=label, wire_dtype=wire, transfer_slice_bytes=slice_bytes,
                               **steady.fields(row, rate))
                    emit(row)
                    print(traffic_table(row, per_ps), flush=True)
                    if "steady_link_bytes_per_step_in_out" in row:
                        w = row["steady_window_steps"]
                        print(f"    steady window: global steps {w[0]}..{w[1]}, {row['steady_window_secs']} s; "
                              f"link bytes per step in/out per ps: "
                              + ", ".join(f"{i:,}/{o:,}" for i, o in row["steady_link_bytes_per_step_in_out"]),
                              flush=True)
                    rows.append(row)
            summary.append((model, rate, rows))

    for model, rate, rows in summary:
        base = next((r for r in rows if r["overlap"] == "none" and r["wire_dtype"] == "float32"), None)
        print(f"\n{model}, {rate} per ps link, {rows[0]['workers'] if rows else '?'} workers, 2 ps ({a.partitioner}), "
              f"TCP {rows[0]['congestion'] if rows else '?'}:")
        print(f"  {'':<23} {'--------- whole run ---------':>37}   {'----------- steady -----------':>37}")
        print(f"  {'overlap':<13} {'wire':<9} {'steps/s':>8} {'limit':>8} {'of lim':>7} {'vs today':>8}   "
              f"{'steps/s':>8} {'limit':>8} {'of lim':>7} {'vs today':>8}   load before, after")
        nan = float("nan")
        for r in rows:
            limit = r["link_limit_steps_per_sec"]
            whole = r["global_steps_per_sec"]
            st, st_limit = r.get("steady_steps_per_sec", nan), r.get("steady_link_limit_steps_per_sec", nan)
            st_base = base.get("steady_steps_per_sec", nan) if base else nan
            print(f"  {r['overlap']:<13} {r['wire_dtype']:<9} {whole:>8.3f} {limit:>8.3f} {whole / limit:>7.2f} "
                  f"{whole / base['global_steps_per_sec'] if base else nan:>8.2f}   "
                  f"{st:>8.3f} {st_limit:>8.3f} {st / st_limit:>7.2f} {st / st_base:>8.2f}   "
                  f"{r['loadavg_before'][0]:.1f}, {r['loadavg_after'][0]:.1f}")


if __name__ == "__main__":
    main()
