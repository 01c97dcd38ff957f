#!/usr/bin/python3
"""The ctr model (DLRM-style: bottom MLP 13->64->16, one embedding of dim 16 per field, pairwise dots
of the 27 vectors, top MLP 367->128->64->1) on docs/tables.md's synthetic data (psflow.CtrGenerator),
trained the ways a CTR engineer on CPU can train it, side by side in one invocation:

  (a) torch_single  one PyTorch process, 2 threads, one fused nn.Embedding(sparse=True) + torch.optim.Adagrad
                    for the tables, Adam for the dense layers;
  (b) torch_ddp     PyTorch DDP (gloo, 2 processes), every table replicated in both: the dense layers
                    in DDP, the tables' sparse gradients in one all_gather (k: torch_ddp_naive, the
                    whole model in DDP, each table's sparse gradient its own bucket);
  (c) torch_rpc     a torch.distributed.rpc parameter server holding the tables (1 server + 2 trainers:
                    remote lookups, sparse adagrad updates applied on arrival, the update and the next
                    batch's rows in one call; dense layers by DDP between the trainers, as PyTorch's
                    "DDP + RPC" tutorial combines them);
  (d) psflow_single psflow's C++ `psflow train --model=ctr`, one process (in-process tables);
  (e, f) psflow_cluster_async / _sync: C++ workers, 2 ps + 2 workers, the tables on the ps.
  (g, h) psflow_torch_async / _sync: PyTorch workers (examples/pytorch/ctr_dlrm.py, psflow.torch.EmbeddingBagCollection)
                    on 2 C++ ps tasks + 2 workers, the tables on the ps.
  (i, j) psflow_torch_overhead_shm / _grpc: psflow's own time per step inside one PyTorch worker
                    (2 ps tasks), over shared memory and over gRPC (figures per step, not per job).

Every run covers the same number of examples: S global steps of 1024 (one process: S steps of 1024;
DDP: S steps of 512 per rank; parameter servers: S/2 steps of 1024 per trainer, async; sync: S
steps of 2 x 512), 26 fields, dim 16. Tables are fixed [N, 16] per field taking id mod N
(PyTorch's tables need a vocabulary; psflow runs with --ctr_vocab=N to match; the PyTorch runs fuse the 26
fields into one table of 26·N rows). Adagrad is TF's on
both sides (accumulator from 0.1, rate 2.0). Prints one JSON line per run: wall time including
start-up, samples/s, the CPU seconds of all its processes, test log-loss and AUC (65536 test
examples) beside the Bayes values, the peak RSS of each process, and the 1-minute load average at
its end (the figures are only as quiet as the machine). All traffic on 127.0.0.1. The model's sizes
and rates are the constants below, in one place; the C++ runs get them as flags.

  bench/ctr_vs_pytorch.py [--build build] [--steps 400] [--vocab 100000] [--runs a,b,c,d,e,f,g,h,i,j]
"""
import argparse
import json
import os
import resource
import socket
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON = "/usr/bin/python3"  # Debian's, with its torch (a pyenv python3 on $PATH has none)
# The model and its training hyper-parameters, for every run (the C++ runs get them as flags).
FIELDS, DENSE, DIM, BATCH = 26, 13, 16, 1024
DENSE_LR, SPARSE_LR, INIT_ACC, INIT_STD = 1e-3, 2.0, 0.1, 0.05
TEST_EXAMPLES = 65536
TORCH_THREADS = 2  # the one PyTorch process's intra-op threads (the comparison: 2 threads)


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
    """The 26 fields' tables as one nn.Embedding of 26·N rows (field f's id i is row f·N + i), as a
    competent user fuses them: one lookup and one sparse gradient per step instead of 26 (26
    separate tables ran 21 % slower). The same rows, the same per-row Adagrad."""
    table = torch.nn.Embedding(FIELDS * vocab, DIM, sparse=True)
    with torch.no_grad():
        table.weight.normal_(0, INIT_STD)
    return table


def fused_ids(torch, ids, vocab):  # ids: LongTensor [B, F] already mod N -> rows of the fused table
    return ids + torch.arange(FIELDS, dtype=ids.dtype) * vocab


def lookup(torch, table, ids, vocab):  # [B, F] ids mod N -> [B, F, DIM]
    return table(fused_ids(torch, ids, vocab))


def evaluate(torch, psflow, gen, score):
    """Test log-loss and AUC of score(ids, dense) -> logits, beside the Bayes values."""
    test = gen.test_set(TEST_EXAMPLES)
    ids, dense = torch.from_numpy(test["ids"]), torch.from_numpy(test["dense"])
    with torch.no_grad():  # in chunks of 8192, as ctr_dlrm.py evaluates
        logits = torch.cat([score(ids[i:i + 8192], dense[i:i + 8192]) for i in range(0, len(ids), 8192)])
    p = torch.sigmoid(logits.double()).numpy()
    bayes = gen.bayes_metrics(TEST_EXAMPLES)
    return {"test_log_loss": psflow.log_loss(test["labels"], p), "test_auc": psflow.auc(test["labels"], p),
            "bayes_log_loss": bayes["log_loss"], "bayes_auc": bayes["auc"]}


# ---- (a) one PyTorch process ----------------------------------------------------------------------
def torch_single(args, threads=None):
    import torch
    import psflow
    torch.set_num_threads(threads or args.torch_threads)
    torch.manual_seed(0)
    gen = psflow.CtrGenerator(seed=args.seed, num_fields=FIELDS, num_dense=DENSE)
    dense, tables = build_dense(torch), make_tables(torch, args.vocab)
    opt_d = torch.optim.Adam(dense.parameters(), lr=DENSE_LR)
    opt_s = torch.optim.Adagrad(tables.parameters(), lr=SPARSE_LR, initial_accumulator_value=INIT_ACC)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for step in range(args.steps):
        ids, x, y = gen.batch(step, BATCH, 0)
        ids = torch.from_numpy(ids) % args.vocab
        loss = loss_fn(dense(torch.from_numpy(x), lookup(torch, tables, ids, args.vocab)), torch.from_numpy(y))
        opt_d.zero_grad(set_to_none=True)
        opt_s.zero_grad(set_to_none=True)
        loss.backward()
        opt_d.step()
        opt_s.step()
    out = evaluate(torch, psflow, gen, lambda i, x: dense(x, lookup(torch, tables, i % args.vocab, args.vocab)))
    out["peak_rss_mb"] = [peak_rss_mb()]
    return out


# ---- (b) DDP, tables replicated --------------------------------------------------------------------
def ddp_rank(rank, args, port, naive, queue):
    """One of 2 DDP ranks, 512 examples per step each, every table replicated. naive: the whole
    model in DDP (each table's sparse gradient its own bucket: gloo's sparse allreduce, several
    collectives per table per step). Otherwise, as a user who profiled it writes it: the dense
    layers in DDP, and the fused table's sparse gradient (a fixed 512 rows per field: one id per example
    and field) sent in one all_gather of ids and one of rows, then averaged like DDP's (divided by the 2 ranks)."""
    import torch
    import torch.distributed as dist
    import psflow
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same initial replicas
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    gen = psflow.CtrGenerator(seed=args.seed, num_fields=FIELDS, num_dense=DENSE)
    ddp = torch.nn.parallel.DistributedDataParallel

    class Whole(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dense, self.tables = build_dense(torch), make_tables(torch, args.vocab)

        def forward(self, ids, x):
            return self.dense(x, lookup(torch, self.tables, ids, args.vocab))

    whole = Whole()
    dense = whole.dense
    if naive:
        model = ddp(whole)
    else:  # no buffers to broadcast each step (the constant triu indices)
        whole.dense = ddp(dense, broadcast_buffers=False)
        model = whole
    opt_d = torch.optim.Adam(dense.parameters(), lr=DENSE_LR)
    opt_s = torch.optim.Adagrad(whole.tables.parameters(), lr=SPARSE_LR, initial_accumulator_value=INIT_ACC)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    half = BATCH // 2
    shape = (FIELDS * args.vocab, DIM)

    def all_gather_table_grads():
        grad = whole.tables.weight.grad  # uncoalesced: 512 x 26 ids and rows
        ids, rows = grad._indices()[0], grad._values()
        all_ids, all_rows = [torch.empty_like(ids) for _ in range(2)], [torch.empty_like(rows) for _ in range(2)]
        works = [dist.all_gather(all_ids, ids, async_op=True), dist.all_gather(all_rows, rows, async_op=True)]
        for w in works:
            w.wait()
        all_ids, all_rows = torch.cat(all_ids), torch.cat(all_rows).mul_(0.5)
        whole.tables.weight.grad = torch.sparse_coo_tensor(all_ids.unsqueeze(0), all_rows, shape)

    for step in range(args.steps):
        ids, x, y = gen.batch(step, half, rank)
        loss = loss_fn(model(torch.from_numpy(ids) % args.vocab, torch.from_numpy(x)), torch.from_numpy(y))
        opt_d.zero_grad(set_to_none=True)
        opt_s.zero_grad(set_to_none=True)
        loss.backward()
        if not naive:
            all_gather_table_grads()
        opt_d.step()
        opt_s.step()
    out = {"peak_rss_mb": peak_rss_mb()}
    if rank == 0:
        out.update(evaluate(torch, psflow, gen, lambda i, x: dense(x, lookup(torch, whole.tables, i % args.vocab, args.vocab))))
    queue.put((rank, out))
    dist.destroy_process_group()


# ---- (c) rpc parameter server ----------------------------------------------------------------------
class TableServer:
    """The server's tables and adagrad accumulators; updates applied on arrival under a lock."""

    def __init__(self, vocab):
        import threading
        import torch
        torch.manual_seed(1)
        self.w = torch.empty(FIELDS * vocab, DIM).normal_(0, INIT_STD)  # the 26 fields fused, as make_tables
        self.acc = torch.full((FIELDS * vocab, DIM), INIT_ACC)
        self.lock = threading.Lock()

    def lookup(self, unique):  # LongTensor of unique rows of the fused table
        return self.w.index_select(0, unique)

    def update(self, unique, grads):
        with self.lock:
            acc = self.acc.index_add_(0, unique, grads * grads)  # unique: a plain per-row update
            self.w.index_add_(0, unique, -SPARSE_LR * grads / acc.index_select(0, unique).sqrt())


SERVER = None


def _server_lookup(unique):
    return SERVER.lookup(unique)


def _server_update_lookup(unique, grads, next_unique):
    """The step's sparse update, then the next batch's rows (None at the end): one round trip per step."""
    SERVER.update(unique, grads)
    return SERVER.lookup(next_unique) if next_unique is not None else None


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
    dense = torch.nn.parallel.DistributedDataParallel(build_dense(torch), broadcast_buffers=False)
    opt_d = torch.optim.Adam(dense.parameters(), lr=DENSE_LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    gen = psflow.CtrGenerator(seed=args.seed, num_fields=FIELDS, num_dense=DENSE)

    def unique(ids):  # the unique rows of the fused table and each (example, field)'s index into them
        return torch.unique(fused_ids(torch, ids, args.vocab), return_inverse=True)

    def gathered(ids):  # unique ids per field, each example's index, their rows from the server
        uniq, inv = unique(ids)
        return uniq, inv, rpc.rpc_sync("ps", _server_lookup, args=(uniq,))

    steps = args.steps // 2

    def batch(step):
        ids, x, y = gen.batch(step, BATCH, worker)
        return (*unique(torch.from_numpy(ids) % args.vocab), torch.from_numpy(x), torch.from_numpy(y))

    uniq, inv, x, y = batch(0)
    rows = rpc.rpc_sync("ps", _server_lookup, args=(uniq,))
    for step in range(steps):
        rows.requires_grad_(True)
        embedded = rows[inv]  # [B, F, DIM]
        loss = loss_fn(dense(x, embedded), y)
        opt_d.zero_grad(set_to_none=True)
        loss.backward()
        opt_d.step()
        following = batch(step + 1) if step + 1 < steps else (None,) * 4
        # The update and the next batch's rows in one call (as psflow's prefetch: one round trip).
        rows = rpc.rpc_sync("ps", _server_update_lookup, args=(uniq, rows.grad, following[0]))
        uniq, inv, x, y = following
    out = {"peak_rss_mb": peak_rss_mb()}
    dist.barrier()
    if worker == 0:
        def score(i, x):
            uniq, inv, rows = gathered(i % args.vocab)
            return dense.module(x, rows[inv])
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
    results = {}
    while len(results) < nprocs:  # a rank that died (import error, crash) must not hang the bench
        try:
            rank, out = queue.get(timeout=5)
            results[rank] = out
        except Exception:  # queue.Empty
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    if p.is_alive():
                        p.kill()
                raise RuntimeError(f"{target.__name__}: a process exited {dead[0].exitcode}")
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"{target.__name__} process exited {p.exitcode}")
    merged = {}
    for rank in sorted(results):
        merged.update({k: v for k, v in results[rank].items() if k != "peak_rss_mb"})
    merged["peak_rss_mb"] = [results[r]["peak_rss_mb"] for r in sorted(results)]
    return merged


def torch_ddp(args, naive=False):
    return spawn(ddp_rank, 2, (args, free_port(), naive))


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
            cmd = (program.ps_command if job == "ps" else program.command) + [
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
    """The commands that run a worker and a ps task of the cluster runs, and the bench's arguments."""

    def __init__(self, args, command, ps_command=None):
        self.args, self.command, self.ps_command = args, command, ps_command or command


def cpp_ps(args):
    return [os.path.join(args.build, "psflow"), "train", "--model=ctr"]


def cpp_workers(args):
    """C++ workers: `psflow train --model=ctr`."""
    return Program(args, cpp_ps(args))


def torch_workers(args):
    """PyTorch workers: examples/pytorch/ctr_dlrm.py (psflow.torch.EmbeddingBagCollection, next batch prefetched),
    the ps tasks C++ (`psflow train --job_name=ps`: the tables and their rules are the C++ ps's
    whoever runs it; a ps started from the script would serve the same, and hold PyTorch's ~250 MB)."""
    return Program(args, [PYTHON, os.path.join(ROOT, "examples/pytorch/ctr_dlrm.py")], cpp_ps(args))


# ---- psflow's own time per step inside a PyTorch worker ------------------------------------------
def behind_cpu_seconds():
    """CPU time so far of this process's psflow_behind threads (the binding's helper, which hands
    the overlap's early parts and the prefetch to the C++ session beside the compute)."""
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != "psflow_behind":
                    continue
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return total


def psflow_torch_overhead(args, transport):
    """One PyTorch worker (ctr_dlrm.py's model and batches, in this process) against 2 C++ ps tasks
    over `transport`, async, S/2 steps of 1024. Per step (after 20 warm-up steps), the wall time of
    the loop and psflow's part of it: sess.step() (the binding, the push of the dense gradients and
    the rows' gradients and the pull of the new values — async: the next batch's rows were pulled
    ahead, beside the compute — one call per ps), the tables' forwards' session calls (taking the
    prefetched rows, and giving the next batch's ids to the prefetch), sess.batches' wait for the
    next batch's ids made behind (settle) and --overlap's hooks; `rpc_ms` is the C++ Step alone (the round trip), `psflow_cpu_ms` the
    worker thread's CPU in psflow's part, `behind_cpu_ms` the CPU of the binding's helper thread
    (the early parts', the prefetch's and the pull ahead's work, run beside the compute: hidden
    when a core is free), `parts_ms` psflow's part by cause, [wall, CPU] each: step (sess.step()
    whole, rpc included), tables, hooks. The rest is the model's own forward/backward (the tables'
    gather and its backward included: a local nn.EmbeddingBag does them too).

    Only the outermost psflow call is timed (a psflow call made inside another is inside its
    interval, untimed), with two clock reads each side; `timed_calls_per_step` says how many, and
    `timer_ms` what their clock reads cost inside the intervals per step (a timed call of a
    function that does nothing, calibrated in this process): part of psflow_ms, reported beside
    it, not subtracted. rpc_ms's two reads of perf_counter (inside step) are not calibrated.
    `psflow_share` = psflow_ms / step_ms."""
    import importlib.util
    import torch
    import psflow
    import psflow.session as session
    import psflow.torch as ptables

    spec = importlib.util.spec_from_file_location("ctr_dlrm", args.dlrm)
    ctr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ctr)
    ports = [free_port() for _ in range(3)]
    hosts = [f"--ps_hosts=127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}", f"--worker_hosts=127.0.0.1:{ports[2]}"]
    common = hosts + [f"--transport={transport}", f"--train_steps={args.steps // 2}", f"--batch_size={BATCH}",
                      f"--ctr_fields={FIELDS}", f"--ctr_dim={DIM}", f"--ctr_vocab={args.vocab}", "--optimizer=adam",
                      f"--learning_rate={DENSE_LR}", "--sparse_optimizer=adagrad",
                      f"--sparse_learning_rate={SPARSE_LR}", "--intra_op_threads=1", f"--seed={args.seed}",
                      f"--log_every={args.steps}", f"--overlap={args.overlap}"]
    ps = [subprocess.Popen(cpp_ps(args) + ["--job_name=ps", f"--task_index={i}"] + common,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    clock = {"psflow": 0.0, "rpc": 0.0, "cpu": 0.0, "calls": 0}
    parts = {}  # psflow's part by cause: [wall, Python-thread CPU] seconds
    depth = [0]  # psflow calls in progress: only the outermost is timed (no timer inside another's interval)

    def timed(fn, part):
        """fn, its wall and CPU time added to psflow's time when it is the outermost psflow call."""
        def wrapper(*a, **k):
            if depth[0]:
                return fn(*a, **k)
            depth[0] = 1
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                wall, used = time.perf_counter() - start, time.thread_time() - start_cpu
                depth[0] = 0
                clock["psflow"] += wall
                clock["cpu"] += used
                clock["calls"] += 1
                spent = parts.setdefault(part, [0.0, 0.0])
                spent[0] += wall
                spent[1] += used
        return wrapper

    def timed_rpc(fn):
        """The C++ Step (inside sess.step(), whose time holds it): wall time only, two clock reads."""
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                clock["rpc"] += time.perf_counter() - start
        return wrapper

    class TimedSession:  # the C++ session, its Step timed
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            attr = getattr(self._inner, name)
            return timed_rpc(attr) if name == "step" else attr

    for cls, name, part in ((session.WorkerSession, "step", "step"), (session.WorkerSession, "lookup", "tables"),
                            (session.WorkerSession, "prefetch", "tables"), (ptables._Tables, "rows", "tables"),
                            (ptables._Tables, "rows_looked_up", "tables"),
                            (ptables._Tables, "group_rows", "tables"), (ptables._Tables, "settle", "tables")):
        if hasattr(cls, name):  # (a build without EmbeddingBagCollection has no group_rows)
            setattr(cls, name, timed(getattr(cls, name), part))
    # --overlap's hooks run inside backward and forward: psflow's time too (handing a gradient over,
    # waiting for a layer's values).
    import psflow.overlap as overlap
    grad_hook, pre_hook = overlap.Overlap._gradient_hook, overlap.Overlap._pre_hook
    overlap.Overlap._gradient_hook = lambda self, i: timed(grad_hook(self, i), "hooks")
    overlap.Overlap._pre_hook = lambda self, own: timed(pre_hook(self, own), "hooks")
    overlap.Overlap._root_hook = timed(overlap.Overlap._root_hook, "hooks")
    # The timers' own cost inside the intervals they measure, per timed call: what a timed call of
    # a function that does nothing records (calibrated here, reported beside psflow_ms, not subtracted).
    noop = timed(lambda: None, "calibration")
    for _ in range(2000):
        noop()
    saved = dict(clock)
    for _ in range(20000):
        noop()
    timer_in = (clock["psflow"] - saved["psflow"]) / 20000
    clock.update(psflow=0.0, rpc=0.0, cpu=0.0, calls=0)
    parts.clear()
    try:
        flags = psflow.parse_flags(["--job_name=worker", "--task_index=0"] + common)
        torch.set_num_threads(1)
        torch.manual_seed(args.seed)
        gen = psflow.CtrGenerator(seed=args.seed, num_fields=FIELDS, num_dense=DENSE)
        model = ctr.DLRM(FIELDS, DIM, args.vocab)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        warmup, steps, wall = 20, 0, 0.0
        with psflow.WorkerSession(model, flags, model_name=ctr.MODEL_NAME) as sess:
            sess._session = TimedSession(sess._session)
            start = time.perf_counter()
            for ids, dense, labels in sess.batches(ctr.batches(gen, sess, BATCH)):
                loss = loss_fn(model(ids, dense), labels)
                loss.backward()
                sess.step(loss.item())
                steps += 1
                if steps == warmup:
                    clock.update(psflow=0.0, rpc=0.0, cpu=0.0, calls=0)
                    parts.clear()
                    behind_start = behind_cpu_seconds()
                    start = time.perf_counter()
            wall = time.perf_counter() - start
            behind = behind_cpu_seconds() - behind_start
        for p in ps:
            p.wait(timeout=60)
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
    n = steps - warmup
    return {"transport": transport, "overlap": args.overlap, "steps_timed": n, "step_ms": round(wall / n * 1e3, 3),
            "psflow_ms": round(clock["psflow"] / n * 1e3, 3),
            "psflow_share": round(clock["psflow"] / wall, 4) if wall > 0 else None,
            "timed_calls_per_step": round(clock["calls"] / n, 1),
            "timer_ms": round(clock["calls"] / n * timer_in * 1e3, 3),
            "rpc_ms": round(clock["rpc"] / n * 1e3, 3),
            "psflow_cpu_ms": round(clock["cpu"] / n * 1e3, 3), "behind_cpu_ms": round(behind / n * 1e3, 3),
            "parts_ms": {k: [round(w / n * 1e3, 3), round(c / n * 1e3, 3)] for k, (w, c) in sorted(parts.items())},
            "load_avg_1min": os.getloadavg()[0],
            "peak_rss_mb": [peak_rss_mb()]}


RUNS = {"a": ("torch_single", torch_single), "b": ("torch_ddp", torch_ddp), "c": ("torch_rpc", torch_rpc),
        "d": ("psflow_single", psflow_single), "e": ("psflow_cluster_async", lambda a: run_cluster(cpp_workers(a), False)),
        "f": ("psflow_cluster_sync", lambda a: run_cluster(cpp_workers(a), True)),
        "g": ("psflow_torch_async", lambda a: run_cluster(torch_workers(a), False)),
        "h": ("psflow_torch_sync", lambda a: run_cluster(torch_workers(a), True)),
        "k": ("torch_ddp_naive", lambda a: torch_ddp(a, naive=True)),
        "l": ("torch_single_1thread", lambda a: torch_single(a, threads=1)),
        "i": ("psflow_torch_overhead_shm", lambda a: psflow_torch_overhead(a, "shm")),
        "j": ("psflow_torch_overhead_grpc", lambda a: psflow_torch_overhead(a, "grpc"))}
OVERHEAD_RUNS = ("i", "j")  # their figures are per step, not a whole job's


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=400, help="global steps of 1024 examples")
    ap.add_argument("--vocab", type=int, default=100000, help="rows per field's table (ids mod N)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default="a,b,c,d,e,f,g,h,i,j")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one configuration in this process
    ap.add_argument("--torch_threads", type=int, default=TORCH_THREADS, help="intra-op threads of the one process")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds before a run is given up")
    ap.add_argument("--overlap", default="auto", help="--overlap of the overhead runs (i, j)")
    ap.add_argument("--dlrm", default=os.path.join(ROOT, "examples/pytorch/ctr_dlrm.py"),
                    help="the DLRM script of the overhead runs (i, j): another checkout's, to measure its build")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    args.dlrm = os.path.abspath(args.dlrm)
    # Every child (the runs, their ranks and tasks) finds the binding of --build, and runs libgomp's
    # threads passive: with its default spin-then-sleep barrier, 2 intra-op threads on this shared
    # 2-vCPU VM spent 0.7 s per step of the one process against 0.023 s passive (a 30x loss on every
    # parallel op whenever the other vCPU is busy); 1-thread runs are unaffected either way.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(args.build, "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.one:
        print(json.dumps(RUNS[args.one][1](args)))
        return
    for key in args.runs.split(","):
        name = RUNS[key][0]
        start = time.monotonic()  # a fresh interpreter per run: start-up included, RSS its own
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            proc = subprocess.run([PYTHON, __file__, f"--one={key}", f"--build={args.build}", f"--steps={args.steps}",
                                   f"--vocab={args.vocab}", f"--seed={args.seed}",
                                   f"--torch_threads={args.torch_threads}", f"--overlap={args.overlap}",
                                   f"--dlrm={args.dlrm}"],
                                  capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(json.dumps({"run": name, "error": f"no result within --timeout={args.timeout:.0f} s"}), flush=True)
            continue
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process of the run, waited for
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        if proc.returncode != 0:
            print(json.dumps({"run": name, "error": proc.stderr.strip().splitlines()[-3:]}), flush=True)
            continue
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if key in OVERHEAD_RUNS:
            print(json.dumps({"run": name, **result}), flush=True)
            continue
        samples = args.steps * BATCH
        print(json.dumps({"run": name, "global_steps": args.steps, "samples": samples, "wall_seconds": round(wall, 2),
                          "samples_per_sec": round(samples / wall), "cpu_seconds": round(cpu, 1), **result,
                          "load_avg_1min": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
