#!/usr/bin/python3
"""psflow's own time per step inside a PyTorch worker: what `sess.step()` costs (the binding, the
push of the gradients and the pull of the new values in one call per ps, and the ps applying Adam),
for the seed mlp (784-100-10, 79,510 parameters) over shared memory and over gRPC.

One C++ ps task (`psflow train --job_name=ps`) and one PyTorch worker in this process; each step
runs a real forward/backward on an MNIST-sized random batch of 100 (not timed), then times
sess.step() and the time spent inside --overlap's hooks (handing gradients over during backward,
waiting for a layer's values before its forward: psflow's time not hidden behind compute), one
run per --overlaps value. Prints one JSON line per transport: mean/p10/median/p90 microseconds per step
and the machine's load average (the figures are only as quiet as the machine: on a shared 2-core
box, p10 is the closest to psflow's own cost), and the CPU time per step of the stepping thread
(worker_cpu_us: binding + client, including the wire copies) and of the ps task (ps_cpu_us:
decode, Adam on 79,510 floats, encode), which contention does not inflate as much.

    /usr/bin/python3 bench/session_overhead.py --build build [--steps 3000] [--transports shm,grpc]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "lib"))
from localhost import free_ports  # noqa: E402  (tests/lib/localhost.py)


def ps_cpu_seconds(pid):
    """User + system CPU time of a process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --overlap's hooks (handing a gradient over during backward, waiting for a layer's values before
# its forward) are psflow's time too: timed into the step's.
hook_time = [0.0]


def time_hooks():
    import psflow.overlap

    O = psflow.overlap.Overlap
    if getattr(O, "_timed_by_bench", False):
        return
    O._timed_by_bench = True

    def timed(fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                hook_time[0] += time.perf_counter() - start
        return wrapper

    grad_hook, pre_hook, root_hook = O._gradient_hook, O._pre_hook, O._root_hook
    O._gradient_hook = lambda self, i: timed(grad_hook(self, i))
    O._pre_hook = lambda self, own: timed(pre_hook(self, own))
    O._root_hook = timed(root_hook)


def run(build, transport, steps, warmup, overlap):
    import torch
    import torch.nn.functional as F

    import psflow

    time_hooks()

    ps_port, worker_port = free_ports(2)
    hosts = [f"--ps_hosts=127.0.0.1:{ps_port}", f"--worker_hosts=127.0.0.1:{worker_port}"]
    ps = subprocess.Popen([os.path.join(build, "psflow"), "train", "--job_name=ps", "--task_index=0", *hosts,
                           f"--transport={transport}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        flags = psflow.parse_flags(["--job_name=worker", "--task_index=0", *hosts, f"--transport={transport}",
                                    f"--train_steps={steps + warmup}", "--log_every=1000000", f"--overlap={overlap}"])
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(784, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
        x = torch.rand(100, 784)
        y = torch.randint(0, 10, (100,))
        times = []
        cpu = 0.0
        ps_cpu_start = None
        with psflow.WorkerSession(model, flags) as sess:
            while not sess.should_stop():
                hook_time[0] = 0.0
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                if len(times) == warmup:
                    ps_cpu_start = ps_cpu_seconds(ps.pid)
                start, start_cpu = time.perf_counter(), time.thread_time()
                sess.step(loss)
                times.append(time.perf_counter() - start + hook_time[0])
                if len(times) > warmup:
                    cpu += time.thread_time() - start_cpu
            ps_cpu = ps_cpu_seconds(ps.pid) - ps_cpu_start
        code = ps.wait(timeout=60)
        assert code == 0, f"ps exited {code}"
    finally:
        if ps.poll() is None:
            ps.kill()
    t = sorted(times[warmup:])
    us = [v * 1e6 for v in t]
    return {"transport": transport, "overlap": overlap, "model": "mlp", "params": sum(p.numel() for p in model.parameters()),
            "steps": len(us), "mean_us": round(statistics.fmean(us), 1), "median_us": round(statistics.median(us), 1),
            "p10_us": round(us[int(0.1 * len(us))], 1), "p90_us": round(us[int(0.9 * len(us))], 1),
            "worker_cpu_us": round(cpu / len(us) * 1e6, 1), "ps_cpu_us": round(ps_cpu / len(us) * 1e6, 1),
            "torch_threads": torch.get_num_threads(), "load_avg_1min": os.getloadavg()[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--transports", default="shm,grpc")
    parser.add_argument("--overlaps", default="none,auto,push_pull", help="--overlap values, each a run")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    import torch

    torch.set_num_threads(1)
    for transport in args.transports.split(","):
        for overlap in args.overlaps.split(","):
            print(json.dumps(run(os.path.abspath(args.build), transport, args.steps, args.warmup, overlap)),
                  flush=True)


if __name__ == "__main__":
    main()
