#!/usr/bin/python3
"""PyTorch workers on psflow end to end: real processes, real MNIST, real PyTorch (Debian's
/usr/bin/python3 and python3-torch), the examples of examples/pytorch/ started by `psflow local
-- CMD` and by hand the seeds' way.

  /usr/bin/python3 tests/pytorch_e2e_test.py --build build --data_dir data/mnist [unittest args]

- sync, 2 workers x batch 100 through the launcher == 1 worker x batch 200 (SGD, 50 steps, the
  same examples through the data-order sampler): validation cross-entropy within 1e-4 relative;
- async mlp, 2 workers, 10000 global steps: test accuracy >= 97%;
- a script that raises mid-run (a worker, the chief): the other tasks stop, the launcher exits
  non-zero naming the task, nothing hangs;
- wrong flags: one line, non-zero, directly and through the launcher;
- the seeds' way by hand (the script as its own ps task); the cnn (sync, 2 ps, fixed:2); the
  sparse embedding; the training script of docs/pytorch.md as written.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"
EXAMPLES = os.path.join(ROOT, "examples/pytorch")
ARGS = None
TIMEOUT = 240  # bound of every run here; reaching it is a hang


def env():
    # The psflow package: the installed one, or this build's when $PYTHONPATH names it (as CTest does).
    return dict(os.environ)


def launch(launcher_flags, script, script_args=(), timeout=TIMEOUT):
    """`psflow local [launcher_flags] -- /usr/bin/python3 script [script_args]`."""
    cmd = [os.path.join(ARGS.build, "psflow"), "local", f"--data_dir={ARGS.data_dir}"] + list(launcher_flags) + \
          ["--", PYTHON, os.path.join(EXAMPLES, script) if "/" not in script else script] + list(script_args)
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env())


sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from localhost import free_ports  # noqa: E402  (tests/lib/localhost.py)


class PyTorchOnPsflowTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psflow_pytorch_e2e_")

    def summary(self, name):
        with open(os.path.join(self.dir, name)) as f:
            return json.load(f)

    def test_sync_two_workers_equal_one_worker_with_twice_the_batch(self):
        common = ["--ps=1", "--optimizer=sgd", "--learning_rate=0.1", "--train_steps=50", "--seed=3",
                  "--log_every=10"]
        two = launch(common + ["--workers=2", "--sync_replicas", "--batch_size=100",
                               f"--metrics_json={self.dir}/two.json"], "mnist_mlp.py")
        self.assertEqual(two.returncode, 0, two.stdout)
        one = launch(common + ["--workers=1", "--batch_size=200", f"--metrics_json={self.dir}/one.json"],
                     "mnist_mlp.py")
        self.assertEqual(one.returncode, 0, one.stdout)
        a, b = self.summary("two.json"), self.summary("one.json")
        self.assertEqual(a["mode"], "sync")
        self.assertEqual(a["workers"], 2)
        self.assertEqual(a["global_step"], 50)
        self.assertEqual(b["global_step"], 50)
        self.assertLess(abs(a["validation_cross_entropy"] - b["validation_cross_entropy"]),
                        1e-4 * b["validation_cross_entropy"], (a, b))
        # 50 SGD steps moved the model: the check compares trained models, not two initial ones.
        self.assertLess(b["validation_cross_entropy"], 1.0)

    def test_async_mlp_two_workers_reaches_97_percent(self):
        # The seeds' job, plus a learning-rate decay. With Adam at a constant 0.01 the seed job's
        # last iterate lands on both sides of 97%: over seeds 1-10, PyTorch workers on psflow
        # 96.99-97.18% (mean 97.07), C++ workers 96.92-97.23% (97.07), and plain PyTorch with the
        # same one-update staleness and no psflow 96.78-97.36% (97.11) — the job's spread, not
        # psflow's (docs/pytorch.md). Halving the rate every 2000 steps settles it, so this
        # check on one run does not fail by chance.
        r = launch(["--ps=1", "--workers=2", "--train_steps=10000", "--log_every=1000", "--lr_decay_steps=2000",
                    "--lr_decay_rate=0.5", f"--metrics_json={self.dir}/m.json"], "mnist_mlp.py", timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout[-5000:])
        m = self.summary("m.json")
        self.assertEqual(m["mode"], "async")
        self.assertGreaterEqual(m["global_step"], 10000)
        self.assertGreaterEqual(m["test_accuracy"], 0.97, m)
        self.assertEqual(len(m["ps_traffic"]), 1)
        self.assertEqual(m["ps_traffic"][0]["num_params"], 784 * 100 + 100 + 100 * 10 + 10)
        # What psflow local prints for C++ workers: the chief's placement listing, the merged
        # prefixed logs, the traffic table, the closing line.
        self.assertIn("[worker1] ", r.stdout)
        self.assertIn("hidden.weight", r.stdout)
        self.assertRegex(r.stdout, r"ps task +parameters +bytes in +bytes out +share")
        self.assertIn("psflow local: all tasks exited 0", r.stdout)

    def check_raise_mid_run(self, raising_worker):
        script = os.path.join(self.dir, "raises.py")
        with open(script, "w") as f:
            f.write(RAISING_SCRIPT)
        r = launch(["--ps=2", "--workers=2", "--train_steps=100000", "--log_every=10"], script,
                   [f"--raise_on_worker={raising_worker}"])
        self.assertNotEqual(r.returncode, 0, r.stdout[-5000:])
        self.assertIn(f"[worker{raising_worker}] RuntimeError: worker {raising_worker} fails at step 30", r.stdout)
        # The failing worker, or a ps task the chief's abort ended first, is named as the failure.
        self.assertRegex(r.stdout, r"psflow local: (worker\d|ps\d) exited with status [1-9]\d*; stopping the other tasks")
        self.assertIn("psflow local: worst exit status", r.stdout)

    def test_worker_raising_mid_run_stops_the_job(self):
        self.check_raise_mid_run(1)

    def test_chief_raising_mid_run_stops_the_job(self):
        self.check_raise_mid_run(0)

    def test_wrong_flags_are_one_line(self):
        for bad in ("--batch_size=0", "--optimizer=lbfgs", "--no_such_flag=1"):
            r = subprocess.run([PYTHON, os.path.join(EXAMPLES, "mnist_mlp.py"), bad], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, timeout=TIMEOUT, env=env())
            self.assertNotEqual(r.returncode, 0, bad)
            self.assertEqual(r.stdout, "", bad)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(bad.split("=")[0].lstrip("-"), r.stderr)  # names the flag
        # Through the launcher: its own flags are checked before anything starts ...
        r = launch(["--ps=1", "--workers=2", "--batch_size=0"], "mnist_mlp.py")
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stdout.strip().splitlines()), 1, r.stdout)
        self.assertIn("--batch_size", r.stdout)
        # ... and the script's are refused by each worker, which stops the job.
        r = launch(["--ps=1", "--workers=2"], "mnist_mlp.py", ["--optimizer=lbfgs"])
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertRegex(r.stdout, r"\[worker[01]\] psflow: error: .*lbfgs")

    def test_seeds_way_by_hand_with_the_script_as_ps(self):
        ports = free_ports(3)
        cluster = [f"--ps_hosts=127.0.0.1:{ports[0]}", f"--worker_hosts=127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}"]
        common = cluster + ["--train_steps=300", "--log_every=50", f"--data_dir={ARGS.data_dir}"]
        script = os.path.join(EXAMPLES, "mnist_mlp.py")
        tasks = [["--job_name=ps", "--task_index=0"], ["--job_name=worker", "--task_index=0",
                 f"--metrics_json={self.dir}/m.json"], ["--job_name=worker", "--task_index=1"]]
        procs = [subprocess.Popen([PYTHON, script] + t + common, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=env()) for t in tasks]
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=TIMEOUT)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
        for t, p, out in zip(tasks, procs, outs):
            self.assertEqual(p.returncode, 0, f"{t}:\n{out[-3000:]}")
        m = self.summary("m.json")
        self.assertEqual(m["workers"], 2)
        self.assertGreaterEqual(m["global_step"], 300)
        self.assertGreater(m["test_accuracy"], 0.9)

    def test_cnn_sync_partitioned_over_two_ps(self):
        r = launch(["--ps=2", "--workers=2", "--sync_replicas", "--partitioner=fixed:2", "--train_steps=40",
                    "--log_every=10", f"--metrics_json={self.dir}/m.json"], "mnist_cnn.py")
        self.assertEqual(r.returncode, 0, r.stdout[-5000:])
        m = self.summary("m.json")
        self.assertEqual(m["mode"], "sync")
        self.assertEqual(m["global_step"], 40)
        # fixed:2 splits every variable of more than one row in two: the ps tasks hold about equal
        # halves of the 3,274,634 parameters.
        held = [t["num_params"] for t in m["ps_traffic"]]
        self.assertEqual(sum(held), 3274634)
        self.assertLess(max(held) / min(held), 1.01)
        self.assertGreater(m["test_accuracy"], 0.5)

    def test_sparse_embedding(self):
        r = launch(["--ps=2", "--workers=2", "--train_steps=400", "--log_every=100",
                    f"--metrics_json={self.dir}/m.json"], "sparse_embedding.py")
        self.assertEqual(r.returncode, 0, r.stdout[-5000:])
        m = self.summary("m.json")
        self.assertGreaterEqual(m["global_step"], 400)
        self.assertGreater(m["test_accuracy"], 0.5)
        # Each step pushes only the looked-up rows (at most about 100 x 300 of the 2353 x 64
        # embedding, far fewer after the ids are deduplicated): the ps holding the embedding
        # receives far less than a dense push of it per step.
        dense_bytes = 400 * (1 + 784 * 3) * 64 * 4
        self.assertLess(sum(t["bytes_in"] for t in m["ps_traffic"]), dense_bytes)

    def test_the_script_of_docs_pytorch_md_runs_as_written(self):
        with open(os.path.join(ROOT, "docs/pytorch.md")) as f:
            doc = f.read()
        script = os.path.join(self.dir, "doc_script.py")
        with open(script, "w") as f:
            f.write(re.search(r"```python\n(.*?)```", doc, re.S).group(1))
        r = launch(["--ps=1", "--workers=2", "--train_steps=200", "--log_every=100",
                    f"--metrics_json={self.dir}/m.json"], script)
        self.assertEqual(r.returncode, 0, r.stdout[-5000:])
        m = self.summary("m.json")
        self.assertGreaterEqual(m["global_step"], 200)
        self.assertGreater(m["test_accuracy"], 0.8)


# A training script that raises mid-run on one worker (--raise_on_worker=I, at its local step 30).
RAISING_SCRIPT = r'''
import sys
sys.path.insert(0, %r)
import torch
import psflow
import mnist_mlp

flags = psflow.parse_flags(sys.argv[1:], defaults=mnist_mlp.DEFAULTS)
raising = int(flags.unparsed[0].split("=")[1])
mnist = psflow.load_mnist(flags.data_dir)
images, labels = torch.from_numpy(mnist["train"]["images"]), torch.from_numpy(mnist["train"]["labels"])
model = mnist_mlp.Mlp()
with psflow.WorkerSession(model, flags) as session:
    while not session.should_stop():
        if session.worker_index == raising and session.local_step == 30:
            raise RuntimeError(f"worker {raising} fails at step 30")
        batch = torch.from_numpy(session.batch_indices(len(images), flags.batch_size))
        loss = torch.nn.functional.cross_entropy(model(images[batch]), labels[batch])
        model.zero_grad()
        loss.backward()
        session.step(loss.item())
''' % EXAMPLES


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data_dir", default=os.path.join(ROOT, "data/mnist"))
    ARGS, rest = p.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
