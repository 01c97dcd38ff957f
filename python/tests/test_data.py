"""psflow.DistributedBatchSampler with a DataLoader, real processes (data_script.py,
`psflow local` for the clusters): sync 2 workers × B take, step by step, exactly the examples one
process takes with 2·B and train to the same parameters; async workers' streams are disjoint;
epochs cover every example once; a killed async job, restarted from its checkpoint, continues its
workers' streams instead of replaying the first batches.

Run: PYTHONPATH=build/python PSFLOW_BINARY=build/psflow /usr/bin/python3 -m unittest -v test_data
"""
import json
import os
import subprocess
import tempfile
import unittest

import torch

import psflow

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BINARY = os.environ.get("PSFLOW_BINARY", os.path.join(ROOT, "build", "psflow"))
SCRIPT = os.path.join(HERE, "data_script.py")
PYTHON = "/usr/bin/python3"


def run(args, timeout=240):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "PSFLOW_FLAGS")}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def cluster(workers, flags, script_flags):
    together = tempfile.mkdtemp(prefix="psflow_data_start_")  # the workers start stepping together
    return [BINARY, "local", "--ps=1", f"--workers={workers}", "--intra_op_threads=1", *flags, "--",
            PYTHON, SCRIPT, f"--start_together={together}", *script_flags]


class DataTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psflow_data_")

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_sync_two_workers_equal_one_process_with_twice_the_batch(self):
        steps, m, b = 13, 50, 4  # 8 examples per global batch: epochs end mid-batch
        one = run([PYTHON, SCRIPT, f"--batch_size={2 * b}", f"--train_steps={steps}", f"--examples={m}",
                   f"--record={self.path('one')}", f"--save_state={self.path('one.pt')}", "--intra_op_threads=1"])
        self.assertEqual(one.returncode, 0, one.stdout + one.stderr)
        two = run(cluster(2, ["--sync_replicas", f"--batch_size={b}", f"--train_steps={steps}"],
                          [f"--examples={m}", f"--record={self.path('two')}", f"--save_state={self.path('two.pt')}"]))
        self.assertEqual(two.returncode, 0, two.stdout + two.stderr)
        single = {r["global_step"]: r for r in records(self.path("one.0"))}
        w0 = {r["global_step"]: r for r in records(self.path("two.0"))}
        w1 = {r["global_step"]: r for r in records(self.path("two.1"))}
        self.assertEqual(sorted(single), list(range(steps)))
        self.assertEqual(sorted(w0), list(range(steps)))
        self.assertEqual(sorted(w1), list(range(steps)))
        for g in range(steps):
            self.assertEqual(w0[g]["indices"] + w1[g]["indices"], single[g]["indices"], f"global step {g}")
            self.assertEqual(len(w0[g]["indices"]), b)
        # Epochs: the stream's first m positions are a permutation of the m examples, and so are the next m.
        stream = [i for g in range(steps) for i in single[g]["indices"]]
        self.assertEqual(sorted(stream[:m]), list(range(m)))
        self.assertEqual(sorted(stream[m:2 * m]), list(range(m)))
        self.assertNotEqual(stream[:m], stream[m:2 * m])
        # The loader's epochs: global batches starting in epoch e (8 per batch over 50: 7, 6, ...).
        self.assertEqual([(single[g]["epoch"], single[g]["epoch_batches"]) for g in (0, 6, 7, 12)],
                         [(0, 7), (0, 7), (1, 6), (1, 6)])
        # The same examples, the same mean gradients: the same parameters.
        a, c = torch.load(self.path("one.pt")), torch.load(self.path("two.pt"))
        for name in a:
            torch.testing.assert_close(c[name], a[name], rtol=1e-5, atol=1e-6)

    def test_async_workers_streams_are_disjoint(self):
        m, b = 60, 3
        r = run(cluster(2, [f"--batch_size={b}", "--train_steps=40"], [f"--examples={m}", f"--record={self.path('a')}"]))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        w = [records(self.path("a.0")), records(self.path("a.1"))]
        # Both opened at global step 0 (they wait for each other before stepping): worker i's first
        # batch is batch i; each batch after is the step its push claimed + 1 (N - 1).
        for i in range(2):
            self.assertTrue(w[i])
            self.assertEqual(w[i][0]["data_step"], i)
        steps = [x["data_step"] for ws in w for x in ws]
        self.assertEqual(len(steps), len(set(steps)), "no batch taken twice")
        self.assertLessEqual(max(steps), 40 + 1)
        # Batch k is stream positions [k·b, (k+1)·b): the one-worker order, checked against the
        # one-worker sampler; in the first epoch (20 batches of 3 over 60) no example is taken twice.
        whole = psflow.BatchSampler(m, b, 0, 1, 0)
        for x in (x for ws in w for x in ws):
            self.assertEqual(x["indices"], whole.batch(x["data_step"]).tolist())
        first_epoch = [i for ws in w for x in ws if x["data_step"] < m // b for i in x["indices"]]
        self.assertEqual(len(first_epoch), len(set(first_epoch)))

    def test_a_killed_async_job_resumes_its_streams(self):
        ckpt = self.path("ckpt")
        common = ["--batch_size=3", "--save_checkpoint_steps=10", f"--checkpoint_dir={ckpt}"]
        # The first run's end is far (on a loaded machine worker 1 may step far ahead of the chief,
        # which must still reach step 45 and crash); the second trains 60 steps past the restore.
        first = run(cluster(2, common + ["--train_steps=100000"],
                            ["--examples=500", f"--record={self.path('first')}", "--crash_at_step=45"]))
        self.assertNotEqual(first.returncode, 0, "the chief was killed")
        restored = psflow.checkpoint_info(ckpt)[1]
        self.assertGreaterEqual(restored, 10)
        before = [records(self.path("first.0")), records(self.path("first.1"))]
        again = run(cluster(2, common + [f"--train_steps={restored + 60}"],
                            ["--examples=500", f"--record={self.path('again')}"]))
        self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
        self.assertIn(f"chief: restored 2 variables at global step {restored}", again.stdout)
        after = [records(self.path("again.0")), records(self.path("again.1"))]
        self.assertTrue(after[0] or after[1])
        for i in range(2):
            if not after[i]:
                continue  # the other worker finished the job before this one's first step
            # Both opened at the restored step (they wait for each other before stepping).
            self.assertEqual(after[i][0]["data_step"], restored + i, f"worker {i}")
        taken_after = {x["data_step"] for ws in after for x in ws}
        taken_before = {x["data_step"] for ws in before for x in ws}
        self.assertEqual(len(taken_after), sum(len(ws) for ws in after), "no batch twice after the restart")
        # Not replayed: every batch below the restored step stays untaken (only batches G..G+N-2,
        # pushed just before step G was reached, may be taken again); the restart continues at G.
        early = {k for k in taken_before if k < restored}
        self.assertTrue(early)
        self.assertFalse(early & taken_after)
        self.assertEqual(min(taken_after), restored)


if __name__ == "__main__":
    unittest.main()
