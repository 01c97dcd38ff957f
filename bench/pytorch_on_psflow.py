#!/usr/bin/python3
"""PyTorch on psflow beside what a PyTorch user has today, side by side in one run.

The seeds' headline job — mlp 784-100-10, batch 100 per worker, Adam 0.01, 10000 global steps,
2 workers, 1 compute thread each — timed as whole commands (wall time from start to the last
process's exit: Python and torch start-up, data loading and the final test evaluation included):
  psflow_async   psflow local --ps=1 --workers=2 -- python3 examples/pytorch/mnist_mlp.py
  psflow_sync    the same with --sync_replicas
  ddp            torch DistributedDataParallel, gloo, 2 processes on 127.0.0.1
  rpc_ps         a torch.distributed.rpc parameter server (1 ps + 2 trainers) applying each
                 gradient on arrival, written as the PyTorch tutorials do it
  single         one PyTorch process, torch.optim.Adam: 10000 updates of batch 100, the same
                 1,000,000 examples as the async runs without their stale gradients (the
                 accuracy reference for them)
  cpp_async      psflow's own C++ workers on the same job (psflow local --model=mlp), for reference
A global step is one update of the parameters, as in psflow: async runs and the rpc ps make
10000 updates in all (about 5000 batches per worker); sync psflow and DDP make 10000 updates of
2 batches each (10000 batches per worker); the single process makes 10000 updates of one batch.
`ddp_half` is DDP with 5000 steps (the same 1,000,000 examples as the async runs).

With --cnn it also times seed 002's cnn (2 ps, --partitioner=fixed:2, 2 workers, 2000 global
steps, async) with PyTorch workers (examples/pytorch/mnist_cnn.py) beside the C++ workers.

  /usr/bin/python3 bench/pytorch_on_psflow.py [--build build] [--steps 10000] [--only ddp,rpc_ps,...] [--cnn]
      [--seed 1] [--runs 1]

--seed seeds every job (initial values and data order); --runs N runs each mlp job N times, with
seeds seed..seed+N-1, and reports the mean wall time and the mean, min and max test accuracy (the
last iterate's accuracy differs by a few tenths of a percent from one seed to the next).
Prints a table and one JSON line per job, then one JSON line with the ratios and accuracies.
Targets (docs/design.md#targets): psflow_async <= 0.5x ddp and <= 0.5x rpc_ps, accuracy >= 97%;
psflow_sync <= 0.6x ddp.

The same script is its own worker for the PyTorch baselines (--role single|ddp|rpc).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = ["psflow_async", "psflow_sync", "ddp", "ddp_half", "rpc_ps", "single", "cpp_async"]


# --------------------------------------------------------------------------------------------
# The baselines' worker side: plain PyTorch, as a PyTorch user writes it.

def load_mnist(data_dir):
    import numpy as np
    import torch
    from torch_seed_models import read_idx  # bench/torch_seed_models.py, beside this script
    train_x = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte"))[:55000].reshape(-1, 784)
    train_y = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte"))[:55000]
    test_x = read_idx(os.path.join(data_dir, "t10k-images-idx3-ubyte")).reshape(-1, 784)
    test_y = read_idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte"))
    f = lambda x: torch.from_numpy(x.astype(np.float32) / 255.0)
    l = lambda y: torch.from_numpy(y.astype(np.int64))
    return f(train_x), l(train_y), f(test_x), l(test_y)


def mlp():
    """The seed mlp: 784-100 ReLU-10, truncated-normal weights (stddev 1/28 and 1/10), zero biases."""
    import torch
    import torch.nn as nn
    model = nn.Sequential(nn.Linear(784, 100), nn.ReLU(), nn.Linear(100, 10))
    with torch.no_grad():
        for layer, std in ((model[0], 1 / 28), (model[2], 1 / 10)):
            nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
            layer.bias.zero_()
    return model


def test_accuracy(model, test_x, test_y):
    import torch
    with torch.no_grad():
        return float((model(test_x).argmax(1) == test_y).float().mean())


class Batches:
    """Worker `rank` of `world`'s slice of each global batch, reshuffled every epoch."""

    def __init__(self, n, batch, rank, world, seed):
        import torch
        self.n, self.batch, self.rank, self.world = n, batch, rank, world
        self.gen = torch.Generator().manual_seed(seed)
        self.perm, self.pos = None, n

    def next(self):
        import torch
        global_batch = self.batch * self.world
        if self.pos + global_batch > self.n:
            self.perm, self.pos = torch.randperm(self.n, generator=self.gen), 0
        start = self.pos + self.rank * self.batch
        self.pos += global_batch
        return self.perm[start:start + self.batch]


def role_single(a):
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    x, y, tx, ty = load_mnist(a.data_dir)
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = Batches(len(x), 100, 0, 1, a.seed)
    for _ in range(a.steps):
        idx = batches.next()
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
    print(json.dumps({"test_accuracy": test_accuracy(model, tx, ty), "updates": a.steps}), flush=True)


def role_ddp(a):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)  # the same initial values on both ranks (DDP broadcasts rank 0's anyway)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=2)
    x, y, tx, ty = load_mnist(a.data_dir)
    model = DDP(mlp())
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = Batches(len(x), 100, a.rank, 2, a.seed)
    for _ in range(a.steps):
        idx = batches.next()
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
    if a.rank == 0:
        print(json.dumps({"test_accuracy": test_accuracy(model.module, tx, ty), "updates": a.steps}), flush=True)
    dist.destroy_process_group()


class ParameterServer:
    """Holds the model and its optimizer; applies each trainer's gradients as they arrive and
    answers with the new parameters (the pattern of PyTorch's parameter-server tutorials)."""

    def __init__(self, steps, seed):
        import torch
        torch.manual_seed(seed)
        self.model = mlp()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.lock = threading.Lock()
        self.step, self.steps = 0, steps

    @staticmethod
    def get_params(ps_rref):
        self = ps_rref.local_value()
        with self.lock:
            return [p.detach().clone() for p in self.model.parameters()], self.step

    @staticmethod
    def apply_gradients(ps_rref, grads):
        self = ps_rref.local_value()
        with self.lock:
            if self.step < self.steps:
                for p, g in zip(self.model.parameters(), grads):
                    p.grad = g
                self.opt.step()
                self.step += 1
            return [p.detach().clone() for p in self.model.parameters()], self.step


def run_trainer(ps_rref, data_dir, rank, seed, steps):
    import torch
    import torch.distributed.rpc as rpc
    torch.set_num_threads(1)
    x, y, _, _ = load_mnist(data_dir)
    model = mlp()
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = Batches(len(x), 100, rank - 1, 2, seed)
    params, step = rpc.rpc_sync(ps_rref.owner(), ParameterServer.get_params, args=(ps_rref,))
    local_steps = 0
    while step < steps:
        with torch.no_grad():
            for p, v in zip(model.parameters(), params):
                p.copy_(v)
        idx = batches.next()
        model.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        params, step = rpc.rpc_sync(ps_rref.owner(), ParameterServer.apply_gradients,
                                    args=(ps_rref, [p.grad for p in model.parameters()]))
        local_steps += 1
    return local_steps


def role_rpc(a):
    import torch
    import torch.distributed.rpc as rpc
    torch.set_num_threads(1)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{a.port}", num_worker_threads=4)
    name = "ps" if a.rank == 0 else f"trainer{a.rank}"
    rpc.init_rpc(name, rank=a.rank, world_size=3, rpc_backend_options=options)
    if a.rank == 0:
        ps_rref = rpc.RRef(ParameterServer(a.steps, a.seed))
        futures = [rpc.rpc_async(f"trainer{r}", run_trainer, args=(ps_rref, a.data_dir, r, a.seed, a.steps)) for r in (1, 2)]
        local_steps = [f.wait() for f in futures]
        ps = ps_rref.local_value()
        _, _, tx, ty = load_mnist(a.data_dir)
        print(json.dumps({"test_accuracy": test_accuracy(ps.model, tx, ty), "updates": ps.step,
                          "trainer_steps": local_steps}), flush=True)
    rpc.shutdown()


# --------------------------------------------------------------------------------------------
# The driver: each job as whole commands, timed from start to the last exit.

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_procs(cmds, env=None, timeout=900):
    """Starts every command at once; returns (wall seconds, the JSON lines they printed)."""
    start = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for c in cmds]
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    wall = time.perf_counter() - start
    for c, p, out in zip(cmds, procs, outputs):
        if p.returncode != 0:
            raise SystemExit(f"bench: {' '.join(c)} exited {p.returncode}:\n{out[-3000:]}")
    lines = []
    for out in outputs:
        lines += [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return wall, lines


def run_psflow(cmd, timeout=900):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "m.json")
        start = time.perf_counter()
        r = subprocess.run(cmd[:3] + [f"--metrics_json={out}"] + cmd[3:], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        wall = time.perf_counter() - start
        if r.returncode != 0:
            raise SystemExit(f"bench: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}")
        m = json.load(open(out))
        return wall, {"test_accuracy": m["test_accuracy"], "updates": m["global_step"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--role", choices=["single", "ddp", "rpc"], help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data_dir", default=os.path.join(ROOT, "data/mnist"))
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--seed", type=int, default=1, help="seed of every job's initial values and data order")
    p.add_argument("--runs", type=int, default=1, help="runs of each mlp job, with seeds seed, seed+1, ...")
    p.add_argument("--only", default=",".join(JOBS), help="comma-separated jobs to run: " + ",".join(JOBS))
    p.add_argument("--cnn", action="store_true", help="also time seed 002's cnn, PyTorch workers beside C++ workers")
    p.add_argument("--cnn_steps", type=int, default=2000)
    p.add_argument("--cnn_only", action="store_true", help="time only the cnn jobs")
    p.add_argument("--timeout", type=float, default=1800, help="seconds a job may take before it counts as failed")
    a = p.parse_args()
    if a.role:
        {"single": role_single, "ddp": role_ddp, "rpc": role_rpc}[a.role](a)
        return

    py = sys.executable
    me = os.path.abspath(__file__)
    psflow = os.path.join(a.build, "psflow")
    example = os.path.join(ROOT, "examples/pytorch/mnist_mlp.py")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", TP_SOCKET_IFNAME="lo")

    def job(name, seed):
        base = [me, f"--data_dir={a.data_dir}", f"--seed={seed}"]
        common = [f"--train_steps={a.steps}", "--intra_op_threads=1", f"--data_dir={a.data_dir}",
                  f"--log_every={a.steps}", f"--seed={seed}"]
        if name == "psflow_async":
            return run_psflow([psflow, "local", "--ps=1"] + ["--workers=2"] + common + ["--", py, example])
        if name == "psflow_sync":
            return run_psflow([psflow, "local", "--ps=1"] + ["--workers=2", "--sync_replicas"] + common + ["--", py, example])
        if name == "cpp_async":
            return run_psflow([psflow, "local", "--ps=1"] + ["--workers=2", "--model=mlp"] + common)
        if name in ("ddp", "ddp_half"):
            port, steps = free_port(), a.steps if name == "ddp" else a.steps // 2
            return run_procs([[py] + base + ["--role=ddp", f"--rank={r}", f"--port={port}", f"--steps={steps}"]
                              for r in (0, 1)], env)
        if name == "rpc_ps":
            port = free_port()
            return run_procs([[py] + base + ["--role=rpc", f"--rank={r}", f"--port={port}", f"--steps={a.steps}"]
                              for r in (0, 1, 2)], env)
        if name == "single":
            return run_procs([[py] + base + ["--role=single", f"--steps={a.steps}"]], env)
        raise SystemExit(f"bench: unknown job {name}; the jobs are {','.join(JOBS)}")

    results = {}
    w = 14 if a.runs == 1 else 19  # the job column: "psflow_async mean" with --runs
    print(f"{'job':<{w}} {'wall s':>8} {'updates':>8} {'test acc':>9}", flush=True)
    for name in ([] if a.cnn_only else a.only.split(",")):
        walls, accs = [], []
        for seed in range(a.seed, a.seed + a.runs):
            label = name if a.runs == 1 else f"{name}/{seed}"
            try:
                wall, out = job(name, seed)
            except (SystemExit, subprocess.TimeoutExpired) as e:  # one job failing does not lose the others
                print(f"{label:<{w}} failed: {str(e)[:300]}", flush=True)
                continue
            info = out if isinstance(out, dict) else next(l for l in out if "test_accuracy" in l)
            walls.append(wall)
            accs.append(info["test_accuracy"])
            print(f"{label:<{w}} {wall:>8.2f} {info['updates']:>8} {info['test_accuracy']:>9.4f}", flush=True)
        if not accs:
            continue
        results[name] = {"job": name, "wall_secs": round(sum(walls) / len(walls), 2),
                         "test_accuracy": round(sum(accs) / len(accs), 4), "updates": info["updates"]}
        if a.runs > 1:
            results[name].update(runs=len(accs), test_accuracy_min=round(min(accs), 4),
                                 test_accuracy_max=round(max(accs), 4))
            print(f"{name + ' mean':<{w}} {results[name]['wall_secs']:>8.2f} {info['updates']:>8} "
                  f"{results[name]['test_accuracy']:>9.4f}  (min {min(accs):.4f}, max {max(accs):.4f}, "
                  f"{len(accs)} runs)", flush=True)
    if a.cnn or a.cnn_only:
        cnn_common = ["--ps=2", "--workers=2", "--partitioner=fixed:2", f"--train_steps={a.cnn_steps}",
                      f"--data_dir={a.data_dir}", f"--log_every={a.cnn_steps}", f"--seed={a.seed}"]
        cnn_example = os.path.join(ROOT, "examples/pytorch/mnist_cnn.py")
        for name, cmd in (("cnn_pytorch", [psflow, "local"] + cnn_common + ["--", py, cnn_example]),
                          ("cnn_cpp", [psflow, "local"] + cnn_common + ["--model=cnn"])):
            try:
                wall, info = run_psflow(cmd, a.timeout)
            except (SystemExit, subprocess.TimeoutExpired) as e:
                print(f"{name:<14} failed: {str(e)[:300]}", flush=True)
                continue
            results[name] = {"job": name, "wall_secs": round(wall, 2), "test_accuracy": round(info["test_accuracy"], 4),
                             "updates": info["updates"]}
            print(f"{name:<14} {wall:>8.2f} {info['updates']:>8} {info['test_accuracy']:>9.4f}", flush=True)
    for r in results.values():
        print(json.dumps(r))
    ratios = {}
    for num, den in (("psflow_async", "ddp"), ("psflow_async", "rpc_ps"), ("psflow_sync", "ddp"),
                     ("psflow_async", "ddp_half"), ("psflow_async", "single"), ("psflow_async", "cpp_async"),
                     ("cnn_pytorch", "cnn_cpp")):
        if num in results and den in results:
            ratios[f"{num}/{den}"] = round(results[num]["wall_secs"] / results[den]["wall_secs"], 3)
    print(json.dumps({"steps": a.steps, "ratios": ratios,
                      "test_accuracy": {k: v["test_accuracy"] for k, v in results.items()}}))


if __name__ == "__main__":
    main()
