#!/usr/bin/python3
"""The ctr model (DLRM-style: bottom MLP 13->64->16, one embedding of dim 16 per field, pairwise dots
of the 27 vectors, top MLP 367->128->64->1) on docs/tables.md's synthetic data (psflow.CtrGenerator),
trained the ways a CTR engineer on CPU can train it, side by side in one invocation (issues 18/19):

  (a) torch_single  one PyTorch process, 2 threads, nn.EmbeddingBag(sparse=True) + torch.optim.Adagrad
                    for the tables, Adam for the dense layers;
  (b) torch_ddp     PyTorch DDP (gloo, 2 processes), every table replicated in both;
  (c) torch_rpc     a torch.distributed.rpc parameter server holding the tables (1 server + 2 trainers:
                    remote lookups, sparse adagrad updates applied on arrival; dense layers by DDP
                    between the trainers, as PyTorch's "DDP + RPC" tutorial combines them);
  (d) psflow_single psflow's C++ `psflow train --model=ctr`, one process (in-process tables);
  (e, f) psflow_cluster_async / _sync: C++ workers, 2 ps + 2 workers, the tables on the ps.
  (g, h) psflow_torch_async / _sync: PyTorch workers (examples/pytorch/ctr_dlrm.py, psflow.torch.EmbeddingBag)
                    on 2 ps + 2 workers, the tables on the ps.

Every run covers the same examples: S global steps of 1024 (one process: S steps of 1024; DDP: S
steps of 512 per rank; parameter servers: S/2 steps of 1024 per trainer, async), 26 fields, dim 16.
Tables are fixed [N, 16] per field taking id mod N (nn.EmbeddingBag needs a vocabulary; psflow runs
with --ctr_vocab=N to match). Adagrad is TF's on both sides (accumulator from 0.1, rate 2.0). Prints
one JSON line per run: wall time including start-up, samples/s, test log-loss and AUC (65536 test
examples) beside the Bayes values, and the peak RSS of each process. All traffic on 127.0.0.1.

  bench/ctr_vs_pytorch.py [--build build] [--steps 400] [--vocab 100000] [--runs a,b,c,d,e,f,g,h]
"""
import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIELDS, DENSE, DIM, BATCH = 26, 13, 16, 1024
DENSE_LR, SPARSE_LR, INIT_ACC, INIT_STD = 1e-3, 2.0, 0.1, 0.05
TEST_EXAMPLES = 65536


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---- the model in PyTorch --------------------------------------------------------------------------
def build_dense(torch):
    nn = torch.nn

    class Dense(nn.Module):
        """Everything but the tables: bottom MLP, dot interaction, top MLP."""

        def __init__(self):
            super().__init__()
            self.bottom = nn.Sequential(nn.Linear(DENSE, 64), nn.ReLU(), nn.Linear(64, DIM), nn.ReLU())
            n = FIELDS + 1
            self.register_buffer("iu", torch.triu_indices(n, n, offset=1))
            self.top = nn.Sequential(nn.Linear(DIM + n * (n - 1) // 2, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                                     nn.Linear(64, 1))

        def forward(self, dense, embedded):  # embedded: [B, F, DIM]
            b = self.bottom(dense)
            x = torch.cat([b.unsqueeze(1), embedded], dim=1)
            z = torch.bmm(x, x.transpose(1, 2))[:, self.iu[0], self.iu[1]]
            return self.top(torch.cat([b, z], dim=1)).squeeze(1)

    return Dense()


def make_tables(torch, vocab):
    tables = torch.nn.ModuleList(torch.nn.EmbeddingBag(vocab, DIM, mode="sum", sparse=True) for _ in range(FIELDS))
    with torch.no_grad():
        for t in tables:
            t.weight.normal_(0, INIT_STD)
    return tables


def lookup(torch, tables, ids):  # ids: LongTensor [B, F] already mod N; one id per bag
    offsets = torch.arange(ids.shape[0], dtype=torch.long)
    return torch.stack([tables[f](ids[:, f].contiguous(), offsets) for f in range(FIELDS)], dim=1)


def evaluate(torch, psflow, gen, score):
    """Test log-loss and AUC of score(ids, dense) -> logits, beside the Bayes values."""
    test = gen.test_set(TEST_EXAMPLES)
    with torch.no_grad():
        logits = score(torch.from_numpy(test["ids"]), torch.from_numpy(test["dense"]))
    p = torch.sigmoid(logits.double()).numpy()
    bayes = gen.bayes_metrics(TEST_EXAMPLES)
    return {"test_log_loss": psflow.log_loss(test["labels"], p), "test_auc": psflow.auc(test["labels"], p),
            "bayes_log_loss": bayes["log_loss"], "bayes_auc": bayes["auc"]}


# ---- (a) one PyTorch process ----------------------------------------------------------------------
def torch_single(args):
    import torch
    import psflow
    torch.set_num_threads(2)
    torch.manual_seed(0)
    gen = psflow.CtrGenerator(seed=args.seed, num_fields=FIELDS, num_dense=DENSE)
    dense, tables = build_dense(torch), make_tables(torch, args.vocab)
    opt_d = torch.optim.Adam(dense.parameters(), lr=DENSE_LR)
    opt_s = torch.optim.Adagrad(tables.parameters(), lr=SPARSE_LR, initial_accumulator_value=INIT_ACC)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for step in range(args.steps):
        ids, x, y = gen.batch(step, BATCH, 0)
        ids = torch.from_numpy(ids) % args.vocab
        loss = loss_fn(dense(torch.from_numpy(x), lookup(torch, tables, ids)), torch.from_numpy(y))
        opt_d.zero_grad(set_to_none=True)
        opt_s.zero_grad(set_to_none=True)
        loss.backward()
        opt_d.step()
        opt_s.step()
    out = evaluate(torch, psflow, gen, lambda i, x: dense(x, lookup(torch, tables, i % args.vocab)))
    out["peak_rss_mb"] = [peak_rss_mb()]
    return out


# ---- (b) DDP, tables replicated --------------------------------------------------------------------
def ddp_rank(rank, args, port, queue):
    import torch
    import torch.distributed as dist
    import psflow
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same initial replicas
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    gen = psflow.CtrGenerator(seed=args.seed, num_fields=FIELDS, num_dense=DENSE)

    class Whole(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dense, self.tables = build_dense(torch), make_tables(torch, args.vocab)

        def forward(self, ids, x):
            return self.dense(x, lookup(torch, self.tables, ids))

    model = torch.nn.parallel.DistributedDataParallel(Whole())
    opt_d = torch.optim.Adam(model.module.dense.parameters(), lr=DENSE_LR)
    opt_s = torch.optim.Adagrad(model.module.tables.parameters(), lr=SPARSE_LR, initial_accumulator_value=INIT_ACC)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    half = BATCH // 2
    for step in range(args.steps):
        ids, x, y = gen.batch(step, half, rank)
        loss = loss_fn(model(torch.from_numpy(ids) % args.vocab, torch.from_numpy(x)), torch.from_numpy(y))
        opt_d.zero_grad(set_to_none=True)
        opt_s.zero_grad(set_to_none=True)
        loss.backward()
        opt_d.step()
        opt_s.step()
    out = {"peak_rss_mb": peak_rss_mb()}
    if rank == 0:
        out.update(evaluate(torch, psflow, gen, lambda i, x: model.module(i % args.vocab, x)))
    queue.put((rank, out))
    dist.destroy_process_group()


# ---- (c) rpc parameter server ----------------------------------------------------------------------
class TableServer:
    """The server's tables and adagrad accumulators; updates applied on arrival under a lock."""

    def __init__(self, vocab):
        import threading
        import torch
        torch.manual_seed(1)
        self.w = [torch.empty(vocab, DIM).normal_(0, INIT_STD) for _ in range(FIELDS)]
        self.acc = [torch.full((vocab, DIM), INIT_ACC) for _ in range(FIELDS)]
        self.lock = threading.Lock()

    def lookup(self, unique):  # list per field of LongTensor ids
        return [self.w[f].index_select(0, u) for f, u in enumerate(unique)]

    def update(self, unique, grads):
        with self.lock:
            for f, (u, g) in enumerate(zip(unique, grads)):
                acc = self.acc[f].index_add_(0, u, g * g)  # u unique: a plain per-row update
                self.w[f].index_add_(0, u, -SPARSE_LR * g / acc.index_select(0, u).sqrt())


SERVER = None


def _server_lookup(unique):
    return SERVER.lookup(unique)


def _server_update(unique, grads):
    SERVER.update(unique, grads)


def rpc_rank(rank, args, rpc_port, pg_port, queue):
    import torch
    import torch.distributed as dist
    import torch.distributed.rpc as rpc
    global SERVER
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{rpc_port}", num_worker_threads=8,
                                           _transports=["uv"])
    if rank == 0:
        SERVER = TableServer(args.vocab)
        rpc.init_rpc("ps", rank=0, world_size=3, rpc_backend_options=opts)
        rpc.shutdown()
        queue.put((0, {"peak_rss_mb": peak_rss_mb()}))
        return
    import psflow
    worker = rank - 1
    rpc.init_rpc(f"trainer{worker}", rank=rank, world_size=3, rpc_backend_options=opts)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{pg_port}", rank=worker, world_size=2)
    torch.manual_seed(0)
    dense = torch.nn.parallel.DistributedDataParallel(build_dense(torch))
    opt_d = torch.optim.Adam(dense.parameters(), lr=DENSE_LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    gen = psflow.CtrGenerator(seed=args.seed, num_fields=FIELDS, num_dense=DENSE)
    pending = None

    def gathered(ids):  # unique ids per field, their rows from the server, and each example's index
        uniq, inv = zip(*(torch.unique(ids[:, f], return_inverse=True) for f in range(FIELDS)))
        rows = rpc.rpc_sync("ps", _server_lookup, args=(list(uniq),))
        return list(uniq), list(inv), rows

    for step in range(args.steps // 2):
        ids, x, y = gen.batch(step, BATCH, worker)
        uniq, inv, rows = gathered(torch.from_numpy(ids) % args.vocab)
        for r in rows:
            r.requires_grad_(True)
        embedded = torch.stack([rows[f][inv[f]] for f in range(FIELDS)], dim=1)
        loss = loss_fn(dense(torch.from_numpy(x), embedded), torch.from_numpy(y))
        opt_d.zero_grad(set_to_none=True)
        loss.backward()
        opt_d.step()
        if pending is not None:
            pending.wait()
        pending = rpc.rpc_async("ps", _server_update, args=(uniq, [r.grad for r in rows]))
    pending.wait()
    out = {"peak_rss_mb": peak_rss_mb()}
    dist.barrier()
    if worker == 0:
        def score(i, x):
            uniq, inv, rows = gathered(i % args.vocab)
            return dense.module(x, torch.stack([rows[f][inv[f]] for f in range(FIELDS)], dim=1))
        out.update(evaluate(torch, psflow, gen, score))
    dist.barrier()
    dist.destroy_process_group()
    rpc.shutdown()
    queue.put((rank, out))


def spawn(target, nprocs, extra):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, *extra, queue)) for rank in range(nprocs)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"{target.__name__} process exited {p.exitcode}")
    merged = {}
    for rank in sorted(results):
        merged.update({k: v for k, v in results[rank].items() if k != "peak_rss_mb"})
    merged["peak_rss_mb"] = [results[r]["peak_rss_mb"] for r in sorted(results)]
    return merged


def torch_ddp(args):
    return spawn(ddp_rank, 2, (args, free_port()))


def torch_rpc(args):
    return spawn(rpc_rank, 3, (args, free_port(), free_port()))


# ---- (d) psflow ------------------------------------------------------------------------------------
def psflow_single(args):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([os.path.join(args.build, "psflow"), "train", "--model=ctr", f"--train_steps={args.steps}",
                        f"--batch_size={BATCH}", f"--ctr_fields={FIELDS}", f"--ctr_dim={DIM}",
                        f"--ctr_vocab={args.vocab}", "--optimizer=adam", f"--learning_rate={DENSE_LR}",
                        "--sparse_optimizer=adagrad", f"--sparse_learning_rate={SPARSE_LR}",
                        f"--ctr_test_examples={TEST_EXAMPLES}", "--intra_op_threads=2", f"--seed={args.seed}",
                        f"--log_every={args.steps}", f"--metrics_json={out.name}"],
                       check=True, stdout=subprocess.DEVNULL)
        summary = json.load(open(out.name))
    c = summary["ctr"]
    return {k: c[k] for k in ("test_log_loss", "test_auc", "bayes_log_loss", "bayes_auc")} | {
        "peak_rss_mb": [resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0]}


def run_cluster(program, sync):
    """`program` (the command that runs one task, before its flags) on 2 ps + 2 workers over gRPC on
    127.0.0.1, each task its own process, the tables on the ps (fixed div [N, 16] per field,
    adagrad there, Adam on the dense layers). Async: S global steps of 1024 (each worker about
    S/2); sync: S global steps of 2 x 512. Peak RSS of each process (wait4)."""
    args = program.args
    ports = [free_port() for _ in range(4)]
    ps = ",".join(f"127.0.0.1:{p}" for p in ports[:2])
    workers = ",".join(f"127.0.0.1:{p}" for p in ports[2:])
    batch = BATCH // 2 if sync else BATCH
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "m.json")

        def task(job, index):
            cmd = program.command + [
                f"--job_name={job}", f"--task_index={index}", f"--ps_hosts={ps}", f"--worker_hosts={workers}",
                f"--train_steps={args.steps}", f"--batch_size={batch}", f"--ctr_fields={FIELDS}", f"--ctr_dim={DIM}",
                f"--ctr_vocab={args.vocab}", "--optimizer=adam", f"--learning_rate={DENSE_LR}",
                "--sparse_optimizer=adagrad", f"--sparse_learning_rate={SPARSE_LR}",
                f"--ctr_test_examples={TEST_EXAMPLES}", "--intra_op_threads=1", f"--seed={args.seed}",
                f"--log_every={args.steps}"]
            if sync:
                cmd.append("--sync_replicas")
            if job == "worker" and index == 0:
                cmd.append(f"--metrics_json={out}")
            return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), job, index

        procs = [task("ps", 0), task("ps", 1), task("worker", 0), task("worker", 1)]
        peaks = []
        for p, job, index in procs:
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            peaks.append(round(usage.ru_maxrss / 1024.0, 1))
            if p.returncode != 0:
                raise RuntimeError(f"{job} {index} exited {p.returncode}: {p.stderr.read()[-2000:]}")
        summary = json.load(open(out))
    c = summary["ctr"]
    return {k: c[k] for k in ("test_log_loss", "test_auc", "bayes_log_loss", "bayes_auc")} | {
        "train_examples_per_sec": round(summary["examples_per_sec"]), "peak_rss_mb": peaks}


class Program:
    """The command that runs one task of the cluster runs, and the bench's arguments."""

    def __init__(self, args, command):
        self.args, self.command = args, command


def cpp_workers(args):
    """C++ workers: `psflow train --model=ctr`."""
    return Program(args, [os.path.join(args.build, "psflow"), "train", "--model=ctr"])


def torch_workers(args):
    """PyTorch workers: examples/pytorch/ctr_dlrm.py (psflow.torch.EmbeddingBag, next batch prefetched)."""
    return Program(args, ["/usr/bin/python3", os.path.join(ROOT, "examples/pytorch/ctr_dlrm.py")])


RUNS = {"a": ("torch_single", torch_single), "b": ("torch_ddp", torch_ddp), "c": ("torch_rpc", torch_rpc),
        "d": ("psflow_single", psflow_single), "e": ("psflow_cluster_async", lambda a: run_cluster(cpp_workers(a), False)),
        "f": ("psflow_cluster_sync", lambda a: run_cluster(cpp_workers(a), True)),
        "g": ("psflow_torch_async", lambda a: run_cluster(torch_workers(a), False)),
        "h": ("psflow_torch_sync", lambda a: run_cluster(torch_workers(a), True))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=400, help="global steps of 1024 examples")
    ap.add_argument("--vocab", type=int, default=100000, help="rows per field's table (ids mod N)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default="a,b,c,d,e,f,g,h")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one configuration in this process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(RUNS[args.one][1](args)))
        return
    for key in args.runs.split(","):
        name = RUNS[key][0]
        start = time.monotonic()  # a fresh interpreter per run: start-up included, RSS its own
        proc = subprocess.run([sys.executable, __file__, f"--one={key}", f"--build={args.build}",
                               f"--steps={args.steps}", f"--vocab={args.vocab}", f"--seed={args.seed}"],
                              capture_output=True, text=True)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            print(json.dumps({"run": name, "error": proc.stderr.strip().splitlines()[-1:]}), flush=True)
            continue
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        samples = args.steps * BATCH
        print(json.dumps({"run": name, "global_steps": args.steps, "samples": samples, "wall_seconds": round(wall, 2),
                          "samples_per_sec": round(samples / wall), **result}), flush=True)


if __name__ == "__main__":
    main()
