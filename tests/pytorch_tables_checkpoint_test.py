#!/usr/bin/python3
"""Checkpoints with embedding tables from PyTorch: real processes (psflow local, 2 PyTorch workers,
sync), real PyTorch, the job of tests/lib/torch_tables_ckpt.py (a dynamic EmbeddingBag and a fixed
Embedding on the ps tasks, checkpointed by the chief).

  /usr/bin/python3 tests/pytorch_tables_checkpoint_test.py --build build [unittest args]

- written on 1 ps, resumed on 2 ps, then on 3: the checkpoints at steps 40 and 60 are byte-identical
  to an uninterrupted 1-ps run's (every dense variable, slot, table row, count and last step);
- the rows a resumed job's modules pull from the ps tasks equal the file's rows (read by
  psflow.read_checkpoint), and a dynamic id the file lacks gets the same row from the ps and from
  psflow.read_table_rows(path, module, ids, model);
- psflow.read_checkpoint returns the int64 tensors (ids ascending; last steps, counts with slots=True);
  psflow.load_checkpoint fills a model holding tables and refuses one whose table has another dim;
- a table whose dim changed against the checkpoint (dynamic, fixed): the job exits non-zero with one
  line naming the table, the checkpoint's shape and the new dim, as a psflow exception (no traceback).
About 20 s on 2 cores.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"
SCRIPT = os.path.join(ROOT, "tests/lib/torch_tables_ckpt.py")
ARGS = None
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from localhost import free_ports  # noqa: E402
TIMEOUT = 120  # far above a run (~2 s); reaching it is a hang


def launch(ps, steps, ckpt, script_args=(), workers=2):
    cmd = [os.path.join(ARGS.build, "psflow"), "local", f"--ps={ps}", f"--workers={workers}", "--sync_replicas",
           f"--train_steps={steps}", f"--checkpoint_dir={ckpt}", "--save_checkpoint_steps=20", "--log_every=1000",
           "--", PYTHON, SCRIPT] + list(script_args)
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT)


def by_hand(ckpt, script_args):
    """1 ps + 1 worker started one process per task (no launcher stopping the worker when the ps
    exits first): (worker's exit code, worker's output, ps's exit code)."""
    ps, worker = free_ports(2)
    flags = [f"--ps_hosts=127.0.0.1:{ps}", f"--worker_hosts=127.0.0.1:{worker}", f"--checkpoint_dir={ckpt}",
             "--train_steps=40", "--sync_replicas", "--ps_timeout_secs=30", "--init_timeout_secs=30"]
    ps_proc = subprocess.Popen([PYTHON, SCRIPT, "--job_name=ps", "--task_index=0"] + flags + list(script_args),
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        w = subprocess.run([PYTHON, SCRIPT, "--job_name=worker", "--task_index=0"] + flags + list(script_args),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT)
        return w.returncode, w.stdout, ps_proc.wait(timeout=TIMEOUT)
    finally:
        if ps_proc.poll() is None:
            ps_proc.kill()
            ps_proc.wait()


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


class TablesCheckpointTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="psflow_torch_tables_ckpt_")
        cls.resumed, cls.straight = f"{cls.dir}/resumed", f"{cls.dir}/straight"
        cls.runs = {}
        for name, ps, steps, ckpt in (("first", 1, 20, cls.resumed), ("on2", 2, 40, cls.resumed),
                                      ("on3", 3, 60, cls.resumed), ("straight", 1, 60, cls.straight)):
            cls.runs[name] = launch(ps, steps, ckpt)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def ok(self, name):
        run = self.runs[name]
        self.assertEqual(run.returncode, 0, f"{name}: {run.stdout[-3000:]}")
        return run.stdout

    def test_resumed_on_two_then_three_ps_equals_the_uninterrupted_run(self):
        self.ok("first")
        self.assertIn("chief: restored 2 variables and 2 tables at global step 20", self.ok("on2"))
        self.assertIn("chief: restored 2 variables and 2 tables at global step 40", self.ok("on3"))
        self.ok("straight")
        for step in (40, 60):
            a = file_bytes(f"{self.resumed}/model.ckpt-{step}.safetensors")
            b = file_bytes(f"{self.straight}/model.ckpt-{step}.safetensors")
            self.assertGreater(len(a), 10000)
            self.assertTrue(a == b, f"step {step}: the resumed job's checkpoint differs from the uninterrupted one's")

    def test_a_resumed_job_pulls_the_files_rows(self):
        import psflow
        import torch
        import torch_tables_ckpt as job
        self.ok("on3")
        # Restores step 60 on 3 ps and trains nothing, in a copy (its chief saves step 60 again).
        # One worker: a second one starting after such a job's end would wait for its gone ps tasks.
        copy = f"{self.dir}/check"
        shutil.copytree(self.resumed, copy)
        check = launch(3, 60, copy, ["--check"], workers=1)
        self.assertEqual(check.returncode, 0, check.stdout[-3000:])
        checked = dict((m[0], (int(m[1]), float(m[2]))) for m in
                       re.findall(r"CHECK table (\w+) rows (\d+) max_abs_diff (\S+)", check.stdout))
        self.assertEqual(sorted(checked), ["dyn", "fixed"], check.stdout[-3000:])
        self.assertGreater(checked["dyn"][0], 100)  # dynamic rows were created, saved and restored
        self.assertEqual(checked["fixed"][0], job.FIXED_ROWS)
        self.assertEqual(checked["dyn"][1], 0.0)
        self.assertEqual(checked["fixed"][1], 0.0)
        # An id the file lacks: the ps's initial row == read_table_rows's with the module.
        from_ps = {int(i): json.loads(row) for i, row in re.findall(r"UNSEEN (-?\d+) (\[.*\])", check.stdout)}
        self.assertEqual(sorted(from_ps), sorted(job.UNSEEN))
        model = job.Model(4, 3)
        rows, found = psflow.read_table_rows(self.resumed, model.dyn, torch.tensor(job.UNSEEN), model)
        self.assertFalse(found.any())
        for k, i in enumerate(job.UNSEEN):
            self.assertEqual(rows[k].tolist(), from_ps[i], i)
            self.assertNotEqual(from_ps[i], [0.0] * 4)

    def test_read_and_load_checkpoint_with_tables(self):
        import psflow
        import torch
        import torch_tables_ckpt as job
        self.ok("on3")
        state = psflow.read_checkpoint(self.resumed)
        ids, dyn, fixed = state["dyn/ids"], state["dyn"], state["fixed"]
        self.assertEqual(ids.dtype, torch.int64)
        self.assertTrue(bool((ids[1:] > ids[:-1]).all()), "dyn/ids not ascending")
        self.assertEqual((tuple(dyn.shape), tuple(fixed.shape)), ((len(ids), 4), (job.FIXED_ROWS, 3)))
        for name in ("dyn/accumulator", "dyn/last_step", "dyn/count", "fixed/slot/accumulator",
                     "linear.weight/slot/m"):
            self.assertNotIn(name, state)
        full = psflow.read_checkpoint(self.resumed, slots=True)
        self.assertEqual(full["dyn/last_step"].dtype, torch.int64)
        self.assertTrue(bool(((full["dyn/last_step"] >= 0) & (full["dyn/last_step"] <= 60)).all()))
        self.assertTrue(bool((full["dyn/count"] >= 1).all()))
        self.assertEqual(tuple(full["dyn/accumulator"].shape), (len(ids), 4))
        self.assertEqual(tuple(full["fixed/slot/accumulator"].shape), (job.FIXED_ROWS, 3))
        # Rows by id, in any order and with repeats, from the file: the read_checkpoint rows.
        pick = ids[[7, 0, 7, len(ids) - 1]]
        rows, found = psflow.read_table_rows(self.resumed, "dyn", pick)
        self.assertTrue(bool(found.all()))
        self.assertTrue(torch.equal(rows, dyn[[7, 0, 7, len(ids) - 1]]))
        rows, found = psflow.read_table_rows(self.resumed, "fixed", torch.tensor([[499, 0], [3, 3]]))
        self.assertEqual(tuple(rows.shape), (2, 2, 3))
        self.assertTrue(torch.equal(rows[0, 0], fixed[499]) and torch.equal(rows[1, 1], fixed[3]))
        with self.assertRaisesRegex(psflow.InvalidArgumentError, r"table 'fixed': id 500 is outside .*\[0, 500\)"):
            psflow.read_table_rows(self.resumed, "fixed", [500])
        with self.assertRaisesRegex(psflow.NotFoundError, r"has no table 'nope'; .*dyn, fixed"):
            psflow.read_table_rows(self.resumed, "nope", [1])
        # load_checkpoint: the dense layer copied, the tables checked (they hold no weight).
        model = job.Model(4, 3)
        self.assertEqual(psflow.load_checkpoint(model, self.resumed), 60)
        self.assertTrue(torch.equal(model.linear.weight.detach(), state["linear.weight"]))
        with self.assertRaisesRegex(psflow.InvalidArgumentError,
                                    r"table 'dyn' has dim 4 in the checkpoint, 8 in the module"):
            psflow.load_checkpoint(job.Model(8, 3), self.resumed, strict=False)

    def test_a_table_whose_dim_changed_is_one_line_naming_it(self):
        ckpt = f"{self.dir}/dim"
        first = launch(1, 20, ckpt)
        self.assertEqual(first.returncode, 0, first.stdout[-3000:])
        for flag, table, saved, new in (("--dyn_dim=8", "dyn", 4, 8), ("--fixed_dim=5", "fixed", 3, 5)):
            code, out, ps_code = by_hand(ckpt, [flag])
            self.assertEqual(code, 1, out[-3000:])  # the script's exit for a psflow.Error
            self.assertNotEqual(ps_code, 0)  # the chief aborted the job
            lines = [line for line in out.splitlines() if line.startswith("psflow: error:")]
            self.assertEqual(len(lines), 1, out[-3000:])
            self.assertRegex(lines[0], rf"FailedPreconditionError: .*model.ckpt-20.safetensors: table '{table}': "
                                       rf"'{table}' has shape \[\d+,{saved}\], the table's dim is {new}")
            self.assertNotIn("Traceback", out)
            print(lines[0], file=sys.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
