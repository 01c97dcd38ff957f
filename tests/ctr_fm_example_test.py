#!/usr/bin/python3
"""examples/cpp_session/ctr_fm.cc (a user's own model with embedding tables, docs/cpp-session.md)
trained on a local cluster of 2 ps + 2 workers, real processes:

  /usr/bin/python3 tests/ctr_fm_example_test.py --psflow build/psflow --binary build/examples/ctr_fm

- with --fm_max_rows small enough that eviction must run: the model learnt (test AUC well
  above chance, test log-loss below the base rate's entropy and not below Bayes's by more than
  the test set's noise), the fixed `mod` table's parts are spread over both ps tasks and together
  hold every bucket, and the dynamic table's rows per ps stay near ⌈max_rows / P⌉ (without the
  bound each ps holds three times as many) with rows admitted and evicted on each ps, and each worker
  had the rows of every batch but its first prefetched;
- sync on 2 ps with checkpoints, then resumed from the checkpoint (which holds both tables) on 3 ps
  to a later step: the resumed job restores the tables, ends at its step and learnt more;
- alone, without a cluster (no psflow local, no cluster flags, no TF_CONFIG): the program trains
  with an in-process ps task (src/train/in_process_ps.h), checkpoints, resumes from its checkpoint
  and learns.
Both run sync (see test_learns_with_eviction). The independent expectations are the generator's:
the base rate's entropy from the test set's click rate and the Bayes figures from its true
probabilities (the summary prints both).
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ARGS = None
TIMEOUT = 240  # bound of every run here; reaching it is a hang
MAX_ROWS = 20000
BUCKETS = 1 << 18  # the program's --wide_buckets default


def run_cluster(*flags, program_args=(), ps=2):
    r = subprocess.run([ARGS.psflow, "local", f"--ps={ps}", "--workers=2"] + list(flags) + ["--", ARGS.binary] +
                       list(program_args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=TIMEOUT)
    return r


def summary_of(text):
    m = re.search(r"^\[worker0\] summary_json: (\{.*\})$", text, re.M)
    assert m, text[-3000:]
    return json.loads(m.group(1))


class CtrFmExampleTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psflow_ctr_fm_test_")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def check_learnt(self, s):
        self.assertEqual(s["model"], "ctr_fm")
        # The base rate's log-loss (the entropy of the test set's click rate, near 25 %: H = 0.56).
        self.assertGreater(s["base_rate_log_loss"], 0.5)
        self.assertLess(s["base_rate_log_loss"], 0.6)
        self.assertGreater(s["test_auc"], 0.65, s)
        self.assertLess(s["test_auc"], s["bayes_auc"] + 0.01, s)
        self.assertLess(s["test_log_loss"], s["base_rate_log_loss"] - 0.02, s)
        self.assertGreater(s["test_log_loss"], s["bayes_log_loss"] - 0.01, s)

    def test_learns_with_eviction(self):
        # Sync, as every run here: the chief's steps wait for worker 1, so a worker that starts late
        # on a loaded machine still takes part (async, it could find a job this short over and its
        # ps tasks gone, and wait out --ps_timeout_secs); and a sync run gives the same bits each time.
        r = run_cluster("--sync_replicas", "--train_steps=1500", program_args=[f"--fm_max_rows={MAX_ROWS}"])
        self.assertEqual(r.returncode, 0, r.stdout[-5000:] + r.stderr)
        s = summary_of(r.stdout)
        self.assertEqual((s["mode"], s["ps"], s["global_step"]), ("sync", 2, 1500))
        self.check_learnt(s)
        wide_rows, share = 0, math.ceil(MAX_ROWS / 2)
        for task in s["ps_traffic"]:
            tables = {t["table"]: t for t in task["tables"]}
            parts = [t for name, t in tables.items() if name.startswith("wide/part_")]
            self.assertGreaterEqual(len(parts), 1, f"ps {task['task']} holds no part of the fixed table")
            wide_rows += sum(t["rows"] for t in parts)
            fm = tables["fm"]
            self.assertGreater(fm["admissions"], 0, fm)
            self.assertGreater(fm["evictions"], 0, fm)
            # Passes run every --evict_every steps, so a share may pass ⌈M/P⌉ in between.
            self.assertLessEqual(fm["rows"], 1.5 * share, fm)
        self.assertEqual(wide_rows, BUCKETS)
        # In sync mode the next batch is known: every batch but the first had its rows prefetched.
        for w in (0, 1):
            self.assertRegex(r.stdout, rf"ctr_fm: worker {w}: 1499 of 1500 batches had their rows prefetched")

    def test_runs_alone(self):
        ckpt = os.path.join(self.dir, "alone")
        env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "PSFLOW_FLAGS")}

        def alone(steps):
            return subprocess.run([ARGS.binary, f"--train_steps={steps}", f"--checkpoint_dir={ckpt}",
                                   "--save_checkpoint_steps=400"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, timeout=TIMEOUT, env=env)

        r = alone(400)
        self.assertEqual(r.returncode, 0, r.stdout[-5000:] + r.stderr)
        self.assertRegex(r.stdout, r"standalone: no cluster flags and no TF_CONFIG: training in this process, "
                                   r"with an in-process ps task on 127\.0\.0\.1:\d+")
        m = re.search(r"^summary_json: (\{.*\})$", r.stdout, re.M)
        self.assertTrue(m, r.stdout[-3000:])
        first = json.loads(m.group(1))
        self.assertEqual((first["workers"], first["ps"], first["global_step"]), (1, 1, 400))
        r = alone(1200)
        self.assertEqual(r.returncode, 0, r.stdout[-5000:] + r.stderr)
        self.assertRegex(r.stdout, r"restored .*model\.ckpt-400.* at global step 400")
        s = json.loads(re.search(r"^summary_json: (\{.*\})$", r.stdout, re.M).group(1))
        self.assertEqual(s["global_step"], 1200)
        self.check_learnt(s)

    def test_sync_checkpoints_and_resumes_with_tables(self):
        ckpt = os.path.join(self.dir, "ckpt")
        r = run_cluster("--sync_replicas", "--train_steps=600", f"--checkpoint_dir={ckpt}",
                        "--save_checkpoint_steps=300")
        self.assertEqual(r.returncode, 0, r.stdout[-5000:] + r.stderr)
        first = summary_of(r.stdout)
        self.assertEqual((first["mode"], first["global_step"]), ("sync", 600))
        # Resumed onto 3 ps tasks: the dynamic table's rows re-routed to Mix64(id) % 3, the fixed
        # table's 8 shards placed again.
        r = run_cluster("--sync_replicas", "--train_steps=1200", f"--checkpoint_dir={ckpt}",
                        "--save_checkpoint_steps=300", ps=3)
        self.assertEqual(r.returncode, 0, r.stdout[-5000:] + r.stderr)
        self.assertRegex(r.stdout, r"restored .*model\.ckpt-600.* at global step 600")
        self.assertIn("chief: restored 2 variables and 2 tables at global step 600", r.stdout)
        s = summary_of(r.stdout)
        self.assertEqual((s["mode"], s["ps"], s["global_step"]), ("sync", 3, 1200))
        # The tables' shares on the 3 ps tasks hold every row of the fixed table.
        self.assertEqual(sum(t["rows"] for task in s["ps_traffic"] for t in task["tables"]
                             if t["table"].startswith("wide/")), BUCKETS)
        self.check_learnt(s)
        self.assertLess(s["test_log_loss"], first["test_log_loss"], "600 more steps did not improve the log-loss")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--psflow", required=True)
    parser.add_argument("--binary", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.psflow = os.path.abspath(ARGS.psflow)
    ARGS.binary = os.path.abspath(ARGS.binary)
    unittest.main(argv=[sys.argv[0]] + rest)
