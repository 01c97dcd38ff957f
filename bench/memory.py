#!/usr/bin/python3
"""Peak resident memory of every psflow task, with PyTorch's peak for the same model and batch
beside it (docs/memory.md). Each task is started by hand (gRPC over loopback, one process per task)
and its peak RSS is the kernel's ru_maxrss of that process, read with os.wait4 when it exits, so
no sample is missed. PyTorch trains the same network (bench/torch_seed_models.py) for the same
steps in one process, holding a data set of the same size as psflow's.

  bench/memory.py [--build build] [--configs vgg19_sgd,vgg19_adam,mlp80k_adam] [--steps 3] [--json]
  bench/memory.py --configs mlp320k_adam      # the 1 GB model (250M parameters): minutes, ~10 GB
  bench/memory.py --checkpoint                # the chief also writes a checkpoint (PyTorch: torch.save
                                              # of the model's and the optimizer's state_dict)

Prints a table: per task its peak RSS (MB), the state it must hold (parameters on a worker;
parameters + optimizer slots on a ps) and the goals: worker <= PyTorch's peak, ps <= 1.25 x state
+ 100 MB. Figures are MB = 2^20 bytes.
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
MB = 1 << 20

# name: (model, hidden_units, optimizer, batch, ps, workers, partitioner)
CONFIGS = {
    "vgg19_sgd": ("vgg19", 0, "sgd", 8, 1, 1, None),
    "vgg19_adam": ("vgg19", 0, "adam", 8, 1, 1, None),
    "mlp80k_adam": ("mlp", 80000, "adam", 100, 2, 2, "fixed:2"),
    "mlp320k_adam": ("mlp", 320000, "adam", 100, 2, 2, "fixed:2"),
}
SLOTS = {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2, "rmsprop": 2}
VGG19_PARAMS = 38947914


def num_params(model, hidden):
    if model == "vgg19":
        return VGG19_PARAMS
    return 784 * hidden + hidden + hidden * 10 + 10


sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from localhost import free_ports  # noqa: E402  (tests/lib/localhost.py)


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# The machine is shared: a run that would push it into the OOM killer is stopped first.
MIN_AVAILABLE = 1 << 30


def wait_all(procs, timeout):
    """Waits for every process; returns {name: (exit status, peak RSS bytes)}."""
    deadline = time.time() + timeout
    left = dict(procs)
    done = {}
    while left:
        low = mem_available() < MIN_AVAILABLE
        if time.time() > deadline or low:
            for p in left.values():
                p.kill()
            why = "less than 1 GB of memory left on the machine" if low else f"still running after {timeout} s"
            raise SystemExit(f"memory.py: tasks {sorted(left)} killed: {why}")
        for name, p in list(left.items()):
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                done[name] = (os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024)
                p.returncode = 0  # reaped
                del left[name]
        time.sleep(0.05)
    return done


def run_psflow(build, name, steps, logdir, checkpoint=False):
    model, hidden, optimizer, batch, num_ps, num_workers, partitioner = CONFIGS[name]
    params = num_params(model, hidden)
    ports = free_ports(num_ps + num_workers)
    ps_hosts = ",".join(f"127.0.0.1:{p}" for p in ports[:num_ps])
    worker_hosts = ",".join(f"127.0.0.1:{p}" for p in ports[num_ps:])
    metrics = os.path.join(logdir, f"{name}_metrics.json")
    common = [os.path.join(build, "psflow"), "train", f"--model={model}", f"--optimizer={optimizer}",
              f"--batch_size={batch}", f"--train_steps={steps}", f"--log_every={steps}",
              f"--ps_hosts={ps_hosts}", f"--worker_hosts={worker_hosts}",
              f"--data_dir={os.path.join(ROOT, 'data/mnist')}"]
    if hidden:
        common.append(f"--hidden_units={hidden}")
    if partitioner:
        common.append(f"--partitioner={partitioner}")
    if params > 100_000_000:
        # The chief evaluates 15000 images on a 1 GB model for many minutes on a busy machine;
        # the ps tasks must not give up on it meanwhile (default 600 s).
        common.append("--worker_timeout_secs=3600")
    procs = {}
    start = time.time()
    for job, count in (("ps", num_ps), ("worker", num_workers)):
        for i in range(count):
            extra = [f"--metrics_json={metrics}"] if (job, i) == ("worker", 0) else []
            if checkpoint and (job, i) == ("worker", 0):
                extra.append(f"--checkpoint_dir={os.path.join(logdir, 'ckpt')}")
            log = open(os.path.join(logdir, f"{name}_{job}{i}.log"), "w")
            procs[f"{job}{i}"] = subprocess.Popen(common + [f"--job_name={job}", f"--task_index={i}"] + extra,
                                                  stdout=log, stderr=subprocess.STDOUT)
    done = wait_all(procs, timeout=1800)
    wall = time.time() - start
    failed = {k: v[0] for k, v in done.items() if v[0] != 0}
    if failed:
        kept = tempfile.mkdtemp(prefix=f"memory_{name}_")
        for f in os.listdir(logdir):
            os.replace(os.path.join(logdir, f), os.path.join(kept, f))
        peaks = {k: round(v[1] / MB) for k, v in done.items()}
        raise SystemExit(f"memory.py: {name}: tasks exited non-zero {failed} (peak MB {peaks}); logs in {kept}")
    summary = json.load(open(metrics))
    return {k: v[1] for k, v in done.items()}, wall, summary


def run_torch(name, steps, checkpoint=False):
    model, hidden, optimizer, batch = CONFIGS[name][:4]
    cmd = ["/usr/bin/python3", os.path.abspath(__file__), "--torch_child", name, f"--steps={steps}"]
    if checkpoint:
        cmd.append("--checkpoint")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = 0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"memory.py: the PyTorch run of {name} failed")
    return usage.ru_maxrss * 1024, json.loads(out.strip().splitlines()[-1])


def torch_child(name, steps, checkpoint=False):
    """The PyTorch peer: same network, batch and optimizer; a data set as large as psflow's."""
    import torch
    import torch.nn as nn
    sys.path.insert(0, HERE)
    import torch_seed_models
    model_name, hidden, optimizer, batch = CONFIGS[name][:4]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if model_name == "vgg19":  # psflow's synthetic 5000 + 500 + 500 images of 32x32x3
        x_all = torch.rand(6000, 3, 32, 32)
    else:  # MNIST as psflow holds it: 70000 images of 784 floats
        x_all = torch.rand(70000, 784)
    y_all = torch.randint(0, 10, (x_all.shape[0],))
    model = torch_seed_models.build(model_name, hidden or 100)
    lr = 0.01 if optimizer == "sgd" else 0.001
    opt = torch_seed_models.optimizer_for(optimizer, model.parameters(), lr)
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(0, 5000, (batch,))
        opt.zero_grad()
        loss = loss_fn(model(x_all[idx]), y_all[idx])
        loss.backward()
        opt.step()
    if checkpoint:
        with tempfile.TemporaryDirectory() as d:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, os.path.join(d, "ckpt.pt"))
    print(json.dumps({"steps_per_sec": steps / (time.perf_counter() - start), "loss": float(loss)}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--configs", default="vgg19_sgd,vgg19_adam,mlp80k_adam")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--no_torch", action="store_true", help="skip the PyTorch peer")
    p.add_argument("--json", action="store_true", help="one JSON line per config instead of a table")
    p.add_argument("--checkpoint", action="store_true",
                   help="the chief writes a checkpoint at the end (PyTorch saves its model and optimizer)")
    p.add_argument("--torch_child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.torch_child:
        return torch_child(a.torch_child, a.steps, a.checkpoint)
    for name in a.configs.split(","):
        if name not in CONFIGS:
            raise SystemExit(f"memory.py: unknown config '{name}'; choose from {','.join(CONFIGS)}")
    load = os.getloadavg()[0]
    print(f"# load average {load:.2f} on {os.cpu_count()} cores; MB = 2^20 bytes; steps={a.steps}"
          + ("; with a checkpoint at the end" if a.checkpoint else ""))
    if not a.json:
        print(f"{'config':<14} {'task':<8} {'peak MB':>8} {'state MB':>9} {'goal MB':>8}  ok")
    for name in a.configs.split(","):
        model, hidden, optimizer, batch, num_ps, num_workers, _ = CONFIGS[name]
        params = num_params(model, hidden)
        with tempfile.TemporaryDirectory() as logdir:
            peaks, wall, summary = run_psflow(a.build, name, a.steps, logdir, a.checkpoint)
        torch_peak, torch_run = (None, None) if a.no_torch else run_torch(name, a.steps, a.checkpoint)
        ps_state = params * 4 * (1 + SLOTS[optimizer]) / num_ps
        rows = []
        for task, peak in sorted(peaks.items()):
            if task.startswith("ps"):
                state, goal = ps_state, 1.25 * ps_state + 100 * MB
            else:
                state, goal = params * 4, torch_peak
            rows.append({"task": task, "peak_mb": round(peak / MB), "state_mb": round(state / MB),
                         "goal_mb": None if goal is None else round(goal / MB),
                         "ok": None if goal is None else peak <= goal})
        steps_per_sec = summary.get("examples_per_sec", 0) / batch / (1 if num_workers == 1 else 1)
        result = {"config": name, "params": params, "batch": batch, "optimizer": optimizer,
                  "ps": num_ps, "workers": num_workers, "wall_secs": round(wall, 1),
                  "chief_steps_per_sec": round(steps_per_sec, 2), "tasks": rows,
                  "pytorch_peak_mb": None if torch_peak is None else round(torch_peak / MB),
                  "pytorch_steps_per_sec": None if torch_run is None else round(torch_run["steps_per_sec"], 2)}
        if a.json:
            print(json.dumps(result))
        else:
            for r in rows:
                ok = "-" if r["ok"] is None else ("yes" if r["ok"] else "NO")
                print(f"{name:<14} {r['task']:<8} {r['peak_mb']:>8} {r['state_mb']:>9} "
                      f"{'-' if r['goal_mb'] is None else r['goal_mb']:>8}  {ok}")
            if torch_peak is not None:
                print(f"{name:<14} {'pytorch':<8} {round(torch_peak / MB):>8} {round(params * 4 / MB):>9}")
            print(f"{name:<14} wall {wall:.1f} s, chief {result['chief_steps_per_sec']} steps/s"
                  + ("" if torch_run is None else f", pytorch {result['pytorch_steps_per_sec']} steps/s"))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
