"""Tests of the psflow Python package against real components: the psflow binary's own error
lines, real ps tasks (C++ `psflow train --job_name=ps` and psflow.Server in a Python process), real
gRPC on loopback, real PyTorch workers (torch_worker.py) on real MNIST, and the checkpoints the
chief writes (safetensors, read here with numpy).

Run: PYTHONPATH=build/python PSFLOW_BINARY=build/psflow PSFLOW_DATA_DIR=data/mnist \
     /usr/bin/python3 -m unittest -v test_binding      (from python/tests; CTest does this)
"""
import glob
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import torch

import psflow

HERE = os.path.dirname(os.path.abspath(__file__))
BINARY = os.environ.get("PSFLOW_BINARY", os.path.join(HERE, "..", "..", "build", "psflow"))
DATA_DIR = os.environ.get("PSFLOW_DATA_DIR", os.path.join(HERE, "..", "..", "data", "mnist"))
PYTHON = "/usr/bin/python3"
WORKER = os.path.join(HERE, "torch_worker.py")
TIMEOUT = 120  # every process of a test must end within this (they end in seconds)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "lib"))
from localhost import free_ports  # noqa: E402  (tests/lib/localhost.py)


def cluster_flags(num_ps, num_workers):
    ports = free_ports(num_ps + num_workers)
    ps = ",".join(f"127.0.0.1:{p}" for p in ports[:num_ps])
    workers = ",".join(f"127.0.0.1:{p}" for p in ports[num_ps:])
    return [f"--ps_hosts={ps}", f"--worker_hosts={workers}"]


def child_env(**extra):
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env.pop("PSFLOW_FLAGS", None)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def start(args, log_path, env=None):
    with open(log_path, "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env or child_env())


def wait_all(procs):
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=TIMEOUT))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"process {p.args} did not end within {TIMEOUT} s")
    return codes


def read(path):
    with open(path) as f:
        return f.read()


def cli_error(*flags):
    """The one-line error `psflow train` prints for these flags."""
    r = subprocess.run([BINARY, "train", *flags], capture_output=True, text=True, env=child_env(), timeout=60)
    line = r.stderr.strip().splitlines()[-1]
    prefix = "psflow: error: "
    assert line.startswith(prefix), line
    return line[len(prefix):]


def load_checkpoint(directory):
    """The newest DIR/model.ckpt-STEP.safetensors: (step, {name: float32 array}, metadata)."""
    paths = glob.glob(os.path.join(directory, "model.ckpt-*.safetensors"))
    assert paths, f"no checkpoint in {directory}"
    path = max(paths, key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        b, e = info["data_offsets"]
        tensors[name] = np.frombuffer(data[b:e], dtype=np.float32).reshape(info["shape"])
    step = int(path.rsplit("-", 1)[1].split(".")[0])
    return step, tensors, header.get("__metadata__", {})


def wait_for_line(path, text, proc, logs, timeout=60):
    deadline = time.time() + timeout
    while text not in read(path):
        if proc.poll() is not None or time.time() > deadline:
            raise AssertionError(f"'{text}' never appeared in {path}\n{logs()}")
        time.sleep(0.1)


def worker_cmd(flags, index, *extra):
    return [PYTHON, WORKER, "--job_name=worker", f"--task_index={index}", *flags,
            f"--data_dir={DATA_DIR}", *extra]


class ClusterSpecAndFlagsTest(unittest.TestCase):
    def test_cluster_spec_from_dict_and_tf_config(self):
        c = psflow.ClusterSpec({"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]})
        self.assertEqual((c.num_ps, c.num_workers), (1, 2))
        self.assertEqual(c.as_dict(), {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]})
        # A chief entry is worker 0, as in TF_CONFIG.
        c = psflow.ClusterSpec({"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]})
        self.assertEqual(c.worker, ["h:1", "h:2"])
        tf = psflow.ClusterSpec.from_tf_config(json.dumps(
            {"cluster": {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]}, "task": {"type": "ps", "index": 0}}))
        self.assertEqual(tf, c)

    def test_cluster_spec_errors_are_the_cli_errors(self):
        cases = [
            ({"ps": ["127.0.0.1"], "worker": ["127.0.0.1:2"]}, ["--ps_hosts=127.0.0.1", "--worker_hosts=127.0.0.1:2"]),
            ({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:1"]}, ["--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:1"]),
            ({"ps": ["127.0.0.1:70000"], "worker": ["127.0.0.1:2"]},
             ["--ps_hosts=127.0.0.1:70000", "--worker_hosts=127.0.0.1:2"]),
        ]
        for jobs, flags in cases:
            with self.assertRaises(psflow.InvalidArgumentError) as e:
                psflow.ClusterSpec(jobs)
            self.assertEqual(str(e.exception), cli_error("--job_name=worker", *flags))
            self.assertIsInstance(e.exception, psflow.Error)
            self.assertIsInstance(e.exception, ValueError)  # Python's own meaning of a bad argument
        with self.assertRaises(ValueError):
            psflow.ClusterSpec({"ps": ["h:1"], "worker": ["h:2"], "parameter_servers": ["h:3"]})
        with self.assertRaises(psflow.InvalidArgumentError):
            psflow.ClusterSpec.from_tf_config("{not json")

    def test_errors_are_also_the_python_builtins_they_mean(self):
        expected = {
            "InvalidArgumentError": ValueError, "NotFoundError": LookupError,
            "DeadlineExceededError": TimeoutError, "UnavailableError": ConnectionError,
            "PermissionDeniedError": PermissionError, "UnauthenticatedError": PermissionError,
            "UnimplementedError": NotImplementedError, "FailedPreconditionError": RuntimeError,
            "InternalError": RuntimeError, "DataLossError": OSError,
        }
        for name, builtin in expected.items():
            cls = getattr(psflow, name)
            self.assertTrue(issubclass(cls, psflow.Error), name)
            self.assertTrue(issubclass(cls, builtin), f"{name} is not a {builtin.__name__}")
            with self.assertRaises(builtin):
                raise cls("x")
        for name in ("CancelledError", "AbortedError", "OutOfRangeError", "ResourceExhaustedError"):
            self.assertTrue(issubclass(getattr(psflow, name), psflow.Error), name)
        self.assertFalse(issubclass(psflow.CancelledError, ValueError))

    def test_parse_flags_layers(self):
        old = os.environ.pop("PSFLOW_FLAGS", None)
        old_tf = os.environ.pop("TF_CONFIG", None)
        try:
            f = psflow.parse_flags([])
            self.assertEqual((f.model, f.train_steps, f.batch_size, f.optimizer), ("mlp", 10000, 100, "adam"))
            self.assertAlmostEqual(f.learning_rate, 0.01, places=6)
            self.assertFalse(f.sync_replicas)
            self.assertEqual(f.unparsed, [])
            # Script defaults < PSFLOW_FLAGS < argv; unknown argv flags pass through in order.
            os.environ["PSFLOW_FLAGS"] = json.dumps(["--train_steps=500", "--sync_replicas", "--batch_size=20"])
            f = psflow.parse_flags(["--batch_size=30", "--my_flag=1", "--other", "x"],
                                   defaults={"batch_size": 10, "optimizer": "sgd", "learning_rate": 0.5,
                                             "train_steps": 7})
            self.assertEqual((f.train_steps, f.batch_size, f.optimizer), (500, 30, "sgd"))
            self.assertAlmostEqual(f.learning_rate, 0.5)
            self.assertTrue(f.sync_replicas)
            self.assertEqual(f.unparsed, ["--my_flag=1", "--other", "x"])
            del os.environ["PSFLOW_FLAGS"]
            # as_argv() gives the same flags back through psflow train's parser.
            self.assertEqual(psflow.parse_flags(f.as_argv()).as_dict(), f.as_dict())
            self.assertEqual(f.as_dict()["batch_size"], 30)
            os.environ["PSFLOW_FLAGS"] = "--train_steps=5"
            with self.assertRaises(psflow.InvalidArgumentError) as e:
                psflow.parse_flags([])
            self.assertIn("PSFLOW_FLAGS must be a JSON array of strings", str(e.exception))
            os.environ["PSFLOW_FLAGS"] = json.dumps(["--no_such_flag=1"])
            with self.assertRaises(psflow.InvalidArgumentError) as e:
                psflow.parse_flags([])
            self.assertIn("--no_such_flag=1", str(e.exception))
            del os.environ["PSFLOW_FLAGS"]
            # TF_CONFIG gives the role.
            os.environ["TF_CONFIG"] = json.dumps(
                {"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]},
                 "task": {"type": "worker", "index": 1}})
            f = psflow.parse_flags([])
            self.assertEqual((f.job_name, f.task_index), ("worker", 1))
            self.assertEqual(psflow.ClusterSpec.from_flags(f).num_workers, 2)
        finally:
            os.environ.pop("PSFLOW_FLAGS", None)
            os.environ.pop("TF_CONFIG", None)
            if old is not None:
                os.environ["PSFLOW_FLAGS"] = old
            if old_tf is not None:
                os.environ["TF_CONFIG"] = old_tf

    def test_bad_flag_values_are_the_cli_errors(self):
        for flag in ["--batch_size=0", "--log_every=0", "--transport=udp", "--optimizer=lbfgs", "--train_steps=abc",
                     "--learning_rate=fast"]:
            with self.assertRaises(psflow.InvalidArgumentError) as e:
                psflow.parse_flags([flag])
            self.assertEqual(str(e.exception), cli_error(flag))

    def test_batch_sampler_is_the_data_order_contract(self):
        # Sync N x B: the workers' slices of global batch k together are the first N*B examples of
        # one worker's global batch k with batch N*B.
        whole = psflow.BatchSampler(1000, 40, 0, 1, 3).batch(5)
        parts = [psflow.BatchSampler(1000, 20, i, 2, 3).batch(5) for i in range(2)]
        self.assertEqual(sorted(np.concatenate(parts).tolist()), sorted(whole.tolist()))
        with self.assertRaises(psflow.InvalidArgumentError):
            psflow.BatchSampler(1000, 20, 2, 2, 0)


class RemainderTransposedTest(unittest.TestCase):
    """_psflow._remainder_transposed, which psflow.torch's ids learner uses for a DLRM's next batch,
    is (x % m).t().contiguous() bit for bit: every sign, the int64 extremes, multiples of m and their
    neighbours, moduli from 1 to 2^63 - 1."""

    def test_equals_torch_remainder_transposed(self):
        g = torch.Generator().manual_seed(7)
        edges = torch.tensor([0, 1, -1, 2**63 - 1, -2**63, -2**63 + 1, 2**62, -(2**62), 2**63 - 2], dtype=torch.int64)
        for m in (1, 2, 3, 7, 64, 100000, 1000003, 2**31 - 1, 2**32, 2**32 + 1, 2**62, 2**62 + 12345, 2**63 - 2,
                  2**63 - 1):
            x = torch.randint(-2**63, 2**63 - 1, (301, 5), dtype=torch.int64, generator=g)
            x[:len(edges), 0] = edges
            if m < 2**40:
                x[:, 1] = m * torch.arange(-150, 151) + torch.arange(301) % 3 - 1  # k*m - 1, k*m, k*m + 1
            got = psflow._psflow._remainder_transposed(x.numpy(), m)
            self.assertTrue(np.array_equal(got, (x % m).t().contiguous().numpy()), f"modulus {m}")
            self.assertTrue(got.flags["C_CONTIGUOUS"])

    def test_bad_input_is_refused(self):
        with self.assertRaisesRegex(ValueError, "positive"):
            psflow._psflow._remainder_transposed(np.zeros((2, 2), np.int64), 0)
        with self.assertRaisesRegex(ValueError, "2-D"):
            psflow._psflow._remainder_transposed(np.zeros(4, np.int64), 3)


class TableOptionsTest(unittest.TestCase):
    """psflow.torch's table keyword arguments are made from the C++ table of fields
    (include/psflow/dist/table_spec.h): the same names, defaults and checks."""

    def test_keyword_arguments_and_defaults_are_the_cpp_fields(self):
        import inspect
        fields = psflow._psflow._table_fields()
        names = [name for name, _, _ in fields]
        self.assertEqual(names[:7], ["initializer", "seed", "partition_strategy", "admit_after", "steps_to_live",
                                     "max_rows", "evict_every"])
        self.assertIn("storage", names)
        self.assertIn("sparse_optimizer", names)
        defaults = {name: default for name, default, _ in fields}
        self.assertEqual(defaults["initializer"], "truncated_normal:0:0.01")
        self.assertEqual(defaults["evict_every"], 100)
        self.assertEqual(defaults["storage"], "memory")
        self.assertIsNone(defaults["sparse_optimizer"])
        for cls in (psflow.torch.Embedding, psflow.torch.EmbeddingBag):
            params = inspect.signature(cls).parameters
            for name, default, help in fields:
                self.assertEqual(params[name].kind, inspect.Parameter.KEYWORD_ONLY, name)
                # seed: None, derived from the job's --seed and the table's name (psflow.torch.table_seed)
                self.assertEqual(params[name].default, None if name == "seed" else default, name)
                self.assertIn(name, cls.__doc__)
        emb = psflow.torch.Embedding(None, 4, admit_after=2, storage="disk", sparse_optimizer="ftrl")
        self.assertEqual((emb.admit_after, emb.storage, emb.sparse_optimizer, emb.evict_every), (2, "disk", "ftrl", 100))
        spec = emb._spec("t")
        self.assertEqual(set(spec), {"name", "dim", "num_embeddings", *names})

    def test_a_bad_option_is_refused_at_construction_naming_it(self):
        cases = [({"partition_strategy": "hash"}, "partition_strategy=hash must be div or mod"),
                 ({"initializer": "gaussian"}, "initializer=gaussian must be one of zeros"),
                 ({"evict_every": 0}, "evict_every=0 must be an integer >= 1"),
                 ({"admit_after": 1.5}, "admit_after=1.5 must be an integer >= 0"),
                 ({"storage": "tape"}, "storage=tape must be memory or disk"),
                 ({"sparse_optimizer": "lbfgs"}, "sparse_optimizer=lbfgs must be one of sgd")]
        for options, says in cases:
            with self.assertRaises(psflow.InvalidArgumentError) as e:
                psflow.torch.EmbeddingBag(10, 4, **options)
            self.assertIn("psflow.torch.EmbeddingBag: " + says, str(e.exception))
        with self.assertRaises(TypeError) as e:
            psflow.torch.Embedding(10, 4, evict_evry=5)
        self.assertIn("evict_evry", str(e.exception))


class SessionMisuseTest(unittest.TestCase):
    def flags(self):
        return psflow.parse_flags(["--job_name=worker", "--task_index=0", *cluster_flags(1, 1)])

    def test_float64_cuda_and_noncontiguous_parameters_are_refused_naming_them(self):
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        model[1].double()
        with self.assertRaises(psflow.InvalidArgumentError) as e:
            psflow.WorkerSession(model, self.flags())
        self.assertIn("parameter '1.weight' is torch.float64", str(e.exception))
        model = torch.nn.Linear(4, 3)
        model.weight.data = model.weight.data.t().contiguous().t()
        with self.assertRaises(psflow.InvalidArgumentError) as e:
            psflow.WorkerSession(model, self.flags())
        self.assertIn("parameter 'weight' is not contiguous", str(e.exception))

    def test_a_parameter_off_the_cpu_is_refused_naming_it(self):
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, device="meta"))
        with self.assertRaises(psflow.InvalidArgumentError) as e:
            psflow.WorkerSession(model, self.flags())
        self.assertIn("parameter '1.weight' is on meta", str(e.exception))

    def test_step_before_open_is_refused(self):
        sess = psflow.WorkerSession(torch.nn.Linear(4, 3), self.flags())
        with self.assertRaises(psflow.FailedPreconditionError) as e:
            sess.step(1.0)
        self.assertIn("before the worker session is open", str(e.exception))

    def test_a_ps_task_cannot_open_a_worker_session(self):
        flags = psflow.parse_flags(["--job_name=ps", "--task_index=0", *cluster_flags(1, 1)])
        with self.assertRaises(psflow.InvalidArgumentError) as e:
            psflow.WorkerSession(torch.nn.Linear(4, 3), flags)
        self.assertIn("needs a worker task", str(e.exception))


SERVER_SCRIPT = """
import sys, psflow
flags = psflow.parse_flags()
cluster = psflow.ClusterSpec.from_flags(flags)
psflow.Server(cluster, job_name="ps", task_index=flags.task_index, flags=flags).join()
print("server returned")
"""


class TrainingTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psflow_binding_")

    def path(self, name):
        return os.path.join(self.dir, name)

    def logs(self):
        return "\n".join(f"--- {p}\n{read(p)}" for p in sorted(glob.glob(self.path("*.log"))))

    def test_two_pytorch_workers_async_on_a_python_server(self):
        flags = cluster_flags(1, 2)
        ckpt = self.path("ckpt")
        logdir = self.path("tb")
        common = ["--train_steps=400", "--log_every=50", f"--checkpoint_dir={ckpt}",
                  f"--metrics_json={self.path('summary.json')}", f"--logdir={logdir}", "--save_summaries_steps=100"]
        ps = start([PYTHON, "-c", SERVER_SCRIPT, "--job_name=ps", "--task_index=0", *flags], self.path("ps.log"))
        workers = [start(worker_cmd(flags, 1, *common, f"--dump={self.path('w1.pt')}"), self.path("w1.log"))]
        wait_for_line(self.path("w1.log"), "waiting for the chief", workers[0], self.logs)  # so both train
        workers.insert(0, start(worker_cmd(flags, 0, *common, f"--dump={self.path('w0.pt')}"), self.path("w0.log")))
        codes = wait_all(workers + [ps])
        self.assertEqual(codes, [0, 0, 0], self.logs())
        self.assertIn("server returned", read(self.path("ps.log")))
        chief_log = read(self.path("w0.log"))
        self.assertIn("variable placement:", chief_log)
        self.assertIn("fc1.weight", chief_log)
        self.assertIn("summary_json: ", chief_log)
        summary = json.loads(read(self.path("summary.json")))
        self.assertEqual((summary["mode"], summary["workers"], summary["ps"], summary["global_step"]),
                         ("async", 2, 1, 400))
        # Named after the script (torch_worker.py), not the module's class (issue 20.4).
        self.assertEqual(summary["model"], "torch_worker")
        self.assertEqual(len(summary["ps_traffic"]), 1)
        self.assertGreater(summary["ps_traffic"][0]["bytes_in"], 0)
        # The loss dropped: the initial model (same seed) is at chance, the trained one is not.
        sys.path.insert(0, HERE)
        import torch_worker
        initial = torch_worker.Mlp()
        test = psflow.load_mnist(DATA_DIR)["test"]
        with torch.no_grad():
            initial_ce = torch.nn.functional.cross_entropy(
                initial(torch.from_numpy(test["images"])), torch.from_numpy(test["labels"])).item()
        self.assertGreater(initial_ce, 2.0)
        self.assertLess(summary["test_cross_entropy"], 0.6 * initial_ce)
        self.assertGreater(summary["test_accuracy"], 0.85)
        # The chief's parameters after close are the values on the ps: its final checkpoint.
        step, tensors, meta = load_checkpoint(ckpt)
        self.assertEqual(step, 400)
        self.assertEqual(meta.get("model"), "torch_worker")
        chief = torch.load(self.path("w0.pt"))
        self.assertEqual(set(chief), {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"})
        for name, value in chief.items():
            np.testing.assert_array_equal(value.numpy(), tensors[name], err_msg=name)
            # ...and they moved from the initialization.
            self.assertFalse(np.array_equal(dict(initial.named_parameters())[name].detach().numpy(),
                                            tensors[name]), name)
        # The chief's TensorBoard curves (the C++ session's telemetry).
        events = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
        self.assertEqual(len(events), 1, os.listdir(logdir))
        with open(events[0], "rb") as f:
            blob = f.read()
        self.assertIn(b"loss", blob)
        self.assertIn(b"accuracy/test", blob)
        other = json.loads(read(self.path("w1.pt.json")))
        self.assertFalse(other["is_chief"])
        local_steps = int(re.search(r"worker 1: done after (\d+) local steps", read(self.path("w1.log"))).group(1))
        self.assertGreater(local_steps, 0)

    def test_a_worker_whose_module_differs_is_refused_naming_the_parameter(self):
        flags = cluster_flags(1, 3)
        common = ["--train_steps=100", "--log_every=50"]
        ps = start([BINARY, "train", "--job_name=ps", "--task_index=0", *flags], self.path("ps.log"))
        wide = start(worker_cmd(flags, 1, *common, "--variant=wide"), self.path("w1.log"))
        renamed = start(worker_cmd(flags, 2, *common, "--variant=renamed"), self.path("w2.log"))
        # The chief starts once both wait for it, so that they are refused rather than late.
        wait_for_line(self.path("w1.log"), "waiting for the chief", wide, self.logs)
        wait_for_line(self.path("w2.log"), "waiting for the chief", renamed, self.logs)
        chief = start(worker_cmd(flags, 0, *common), self.path("w0.log"))
        codes = wait_all([chief, wide, renamed, ps])
        self.assertEqual(codes[0], 0, self.logs())
        self.assertEqual(codes[3], 0, self.logs())
        self.assertEqual(codes[1:3], [1, 1], self.logs())
        wide_err = read(self.path("w1.log"))
        self.assertIn("fc1.weight", wide_err)
        self.assertIn("[48,784]", wide_err)
        renamed_err = read(self.path("w2.log"))
        self.assertRegex(renamed_err, r"hidden\.weight|fc1\.weight")
        self.assertIn("FailedPreconditionError", renamed_err)

    def test_row_sparse_push_updates_only_the_touched_rows(self):
        flags = cluster_flags(1, 1)
        ckpt = self.path("ckpt")
        ps = start([BINARY, "train", "--job_name=ps", "--task_index=0", *flags], self.path("ps.log"))
        w = start(worker_cmd(flags, 0, "--train_steps=60", "--log_every=20", "--variant=embedding",
                             f"--checkpoint_dir={ckpt}", f"--dump={self.path('w0.pt')}"), self.path("w0.log"))
        self.assertEqual(wait_all([w, ps]), [0, 0], self.logs())
        sys.path.insert(0, HERE)
        import torch_worker
        initial = torch_worker.EmbeddingBagModel().embed.weight.detach().numpy()
        _, tensors, _ = load_checkpoint(ckpt)
        final = tensors["embed.weight"]
        # Rows no training image ever selects (its 20 brightest pixels) were never pushed.
        images = torch.from_numpy(psflow.load_mnist(DATA_DIR)["train"]["images"])
        ever = set(torch.topk(images, 20, dim=1).indices.flatten().tolist())
        never = [r for r in range(784) if r not in ever]
        self.assertGreater(len(never), 50)
        for r in never:
            np.testing.assert_array_equal(final[r], initial[r], err_msg=f"row {r}")
        changed = [r for r in range(784) if not np.array_equal(final[r], initial[r])]
        self.assertGreater(len(changed), 50)
        self.assertTrue(set(changed) <= ever)
        # The pushes carried rows, not the whole [784,16] table: far fewer bytes than dense pushes.
        summary = json.loads(read(self.path("w0.pt.json")))["summary"]
        dense_bytes = 60 * 784 * 16 * 4
        self.assertLess(summary["ps_traffic"][0]["bytes_in"], dense_bytes)

    def test_ctrl_c_stops_a_python_server(self):
        flags = cluster_flags(1, 1)
        ps = start([PYTHON, "-c", SERVER_SCRIPT, "--job_name=ps", "--task_index=0", *flags], self.path("ps.log"))
        wait_for_line(self.path("ps.log"), "serving on", ps, self.logs)
        ps.send_signal(signal.SIGINT)
        code = ps.wait(timeout=30)
        self.assertNotEqual(code, 0)
        self.assertIn("KeyboardInterrupt", read(self.path("ps.log")))
        self.assertNotIn("server returned", read(self.path("ps.log")))

    def test_a_chief_that_raises_aborts_the_job(self):
        flags = cluster_flags(1, 2)
        common = ["--train_steps=100000", "--log_every=1000"]
        ps = start([BINARY, "train", "--job_name=ps", "--task_index=0", *flags], self.path("ps.log"))
        w1 = start(worker_cmd(flags, 1, *common), self.path("w1.log"))
        wait_for_line(self.path("w1.log"), "waiting for the chief", w1, self.logs)
        chief = start(worker_cmd(flags, 0, *common, "--variant=raise"), self.path("w0.log"))
        codes = wait_all([chief, w1, ps])
        self.assertNotEqual(codes[0], 0, self.logs())
        self.assertIn("boom at local step 20", read(self.path("w0.log")))
        # The ps task exits non-zero with the chief's reason; the other worker is told and stops.
        self.assertNotEqual(codes[2], 0, self.logs())
        self.assertIn("RuntimeError: boom at local step 20", read(self.path("ps.log")))
        self.assertNotEqual(codes[1], 0, self.logs())
        self.assertIn("AbortedError", read(self.path("w1.log")))


class OptimizerOnThePsTest(unittest.TestCase):
    def test_adam_on_the_ps_applies_the_design_formula_to_a_pytorch_gradient(self):
        flags_list = cluster_flags(1, 1)
        with tempfile.TemporaryDirectory() as d:
            ps = start([BINARY, "train", "--job_name=ps", "--task_index=0", *flags_list], os.path.join(d, "ps.log"))
            try:
                flags = psflow.parse_flags(["--job_name=worker", "--task_index=0", *flags_list, "--optimizer=adam",
                                            "--learning_rate=0.1", "--train_steps=3", "--lr_decay_steps=0"])
                torch.manual_seed(5)
                model = torch.nn.Linear(3, 2)
                w = [p.detach().numpy().astype(np.float64).copy() for p in model.parameters()]
                m = [np.zeros_like(x) for x in w]
                v = [np.zeros_like(x) for x in w]
                x = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0]])
                lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
                with psflow.WorkerSession(model, flags) as sess:
                    params = list(model.parameters())
                    for t in range(1, 4):
                        loss = (model(x) ** 2).sum() * (t + 0.5)
                        loss.backward()
                        grads = [p.grad.detach().numpy().astype(np.float64).copy() for p in params]
                        grad_memory = [p.grad.data_ptr() for p in params]
                        sess.step(loss)
                        self.assertEqual(sess.global_step, t)
                        alpha = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                        for i, p in enumerate(params):
                            m[i] += (grads[i] - m[i]) * (1 - b1)
                            v[i] += (grads[i] ** 2 - v[i]) * (1 - b2)
                            w[i] -= alpha * m[i] / (np.sqrt(v[i]) + eps)
                            np.testing.assert_allclose(p.detach().numpy(), w[i], rtol=1e-5, atol=1e-6,
                                                       err_msg=f"step {t} parameter {i}")
                            # The gradient memory is psflow's, zeroed after the push.
                            self.assertEqual(p.grad.data_ptr(), grad_memory[i])
                            self.assertTrue(bool((p.grad == 0).all()))
                    self.assertTrue(sess.should_stop())
                    with self.assertRaises(psflow.FailedPreconditionError):
                        sess.step(1.0)
                self.assertEqual(sess.summary["global_step"], 3)
                self.assertEqual(ps.wait(timeout=TIMEOUT), 0, read(os.path.join(d, "ps.log")))
            finally:
                if ps.poll() is None:
                    ps.kill()

    def test_a_parameter_that_does_not_require_grad_keeps_the_chiefs_value(self):
        flags_list = cluster_flags(1, 1)
        with tempfile.TemporaryDirectory() as d:
            ps = start([BINARY, "train", "--job_name=ps", "--task_index=0", *flags_list], os.path.join(d, "ps.log"))
            try:
                flags = psflow.parse_flags(["--job_name=worker", "--task_index=0", *flags_list, "--optimizer=sgd",
                                            "--learning_rate=0.1", "--train_steps=2"])
                torch.manual_seed(6)
                model = torch.nn.Linear(3, 2)
                model.bias.requires_grad_(False)
                bias, weight = model.bias.detach().clone(), model.weight.detach().clone()
                with psflow.WorkerSession(model, flags) as sess:
                    self.assertIsNone(model.bias.grad)
                    while not sess.should_stop():
                        model(torch.ones(1, 3)).sum().backward()
                        sess.step(1.0)
                torch.testing.assert_close(model.bias.detach(), bias, rtol=0, atol=0)
                # SGD with the gradient of sum(W x) for x = ones: W -= lr * 1 per step.
                torch.testing.assert_close(model.weight.detach(), weight - 0.2)
                self.assertEqual(ps.wait(timeout=TIMEOUT), 0, read(os.path.join(d, "ps.log")))
            finally:
                if ps.poll() is None:
                    ps.kill()

    def test_replacing_a_parameters_memory_is_refused_and_the_chief_aborts_the_job(self):
        flags_list = cluster_flags(1, 1)
        with tempfile.TemporaryDirectory() as d:
            ps = start([BINARY, "train", "--job_name=ps", "--task_index=0", *flags_list], os.path.join(d, "ps.log"))
            try:
                flags = psflow.parse_flags(["--job_name=worker", "--task_index=0", *flags_list, "--train_steps=5"])
                model = torch.nn.Linear(3, 2)
                with self.assertRaises(psflow.FailedPreconditionError) as e:
                    with psflow.WorkerSession(model, flags) as sess:
                        model(torch.ones(1, 3)).sum().backward()
                        sess.step(1.0)
                        model.weight.data = model.weight.data.clone()  # no longer psflow's memory
                        model(torch.ones(1, 3)).sum().backward()
                        sess.step(1.0)
                self.assertIn("parameter 'weight' no longer lives in the session's memory", str(e.exception))
                self.assertNotEqual(ps.wait(timeout=TIMEOUT), 0)
                self.assertIn("FailedPreconditionError: parameter 'weight'", read(os.path.join(d, "ps.log")))
            finally:
                if ps.poll() is None:
                    ps.kill()


if __name__ == "__main__":
    unittest.main()
