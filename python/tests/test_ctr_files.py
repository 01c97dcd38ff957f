"""psflow.data.CtrFiles, real processes on files `psflow data ctr-files` wrote (ctr_files_script.py,
examples/pytorch/ctr_dlrm.py, `psflow local` for the clusters): sync 2 workers x B read, step by
step, exactly what one process reads with 2·B; async workers share the work queue's slices (every
slice once, every example once) and end cleanly at the end of the data; a job stopped by
--train_steps resumes from its checkpoint where the queue stood; a bad line fails naming file and
line; examples/pytorch/ctr_dlrm.py trains from the files, also files of 5 integers and 7
categoricals (--ctr_dense, --ctr_fields), and a job whose counts differ from the files' is refused.

Run: PYTHONPATH=build/python PSFLOW_BINARY=build/psflow /usr/bin/python3 -m unittest -v test_ctr_files
"""
import json
import os
import re
import subprocess
import tempfile
import unittest

import psflow

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BINARY = os.environ.get("PSFLOW_BINARY", os.path.join(ROOT, "build", "psflow"))
SCRIPT = os.path.join(HERE, "ctr_files_script.py")
DLRM = os.path.join(ROOT, "examples", "pytorch", "ctr_dlrm.py")
PYTHON = "/usr/bin/python3"
FILES, PER_FILE = 3, 400


def run(args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "PSFLOW_FLAGS")}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def last_checkpoint_metadata(ckpt):
    """The newest checkpoint's safetensors metadata (its header's __metadata__)."""
    steps = [int(m.group(1)) for m in (re.fullmatch(r"model\.ckpt-(\d+)\.safetensors", n) for n in os.listdir(ckpt)) if m]
    with open(os.path.join(ckpt, f"model.ckpt-{max(steps)}.safetensors"), "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size)).get("__metadata__", {})


class CtrFilesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psflow_ctr_files_")
        r = run([BINARY, "data", "ctr-files", f"--out={self.path('data')}", f"--files={FILES}",
                 f"--examples_per_file={PER_FILE}", "--seed=4", "--ctr_fields=4", "--ctr_test_examples=256",
                 "--gzip"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.train = self.path("data") + "/train-*"

    def path(self, name):
        return os.path.join(self.dir, name)

    def cluster(self, workers, flags, script_flags, script=SCRIPT):
        together = tempfile.mkdtemp(prefix="psflow_ctr_files_start_")
        return [BINARY, "local", "--ps=1", f"--workers={workers}", "--intra_op_threads=1", *flags, "--",
                PYTHON, script, *([f"--start_together={together}"] if script == SCRIPT else []), *script_flags]

    def test_sync_two_workers_read_what_one_process_reads_with_twice_the_batch(self):
        b = 16
        one = run([PYTHON, SCRIPT, f"--train_files={self.train}", f"--batch_size={2 * b}",
                   f"--record={self.path('one')}", "--intra_op_threads=1"])
        self.assertEqual(one.returncode, 0, one.stdout + one.stderr)
        two = run(self.cluster(2, ["--sync_replicas", f"--batch_size={b}"],
                               [f"--train_files={self.train}", f"--record={self.path('two')}"]))
        self.assertEqual(two.returncode, 0, two.stdout + two.stderr)
        single = {r["global_step"]: r for r in records(self.path("one.0"))}
        w0 = {r["global_step"]: r for r in records(self.path("two.0"))}
        w1 = {r["global_step"]: r for r in records(self.path("two.1"))}
        steps = FILES * PER_FILE // (2 * b)  # the end of the files ends training: 37 whole global batches
        self.assertEqual(sorted(single), list(range(steps)))
        self.assertEqual(sorted(w0), list(range(steps)))
        self.assertEqual(sorted(w1), list(range(steps)))
        for g in range(steps):
            self.assertEqual(w0[g]["ids"] + w1[g]["ids"], single[g]["ids"], f"global step {g}")
            self.assertEqual(w0[g]["labels"] + w1[g]["labels"], single[g]["labels"], f"global step {g}")

    def test_async_workers_share_the_queue_and_resume_where_it_stood(self):
        ckpt = self.path("ckpt")
        first = run(self.cluster(2, ["--train_steps=20", f"--checkpoint_dir={ckpt}"],
                                 [f"--train_files={self.train}", f"--record={self.path('a')}", "--file_slices=3"]))
        self.assertEqual(first.returncode, 0, first.stdout + first.stderr)
        # Training ended by steps inside the chief's slice: it gave the slice back as its loop ended
        # (before the final checkpoint), so the saved queue has it back in line, not held by worker 0.
        queue = json.loads(last_checkpoint_metadata(ckpt)["work_queue"])
        self.assertNotIn(0, [held[0] for held in queue["held"]], queue)
        self.assertGreaterEqual(queue["returned_count"], 1, queue)
        second = run(self.cluster(2, [f"--checkpoint_dir={ckpt}"],
                                  [f"--train_files={self.train}", f"--record={self.path('a')}", "--file_slices=3"]))
        out = second.stdout + second.stderr
        self.assertEqual(second.returncode, 0, out)
        self.assertIn("chief: restored the work queue at ", out)
        # Both runs: every example read at least once; the slices held at the first run's last
        # checkpoint were read again (at-least-once per slice), nothing else twice.
        labels = [r for w in (0, 1) for r in records(self.path(f"a.{w}"))]
        trained = sum(len(r["ids"]) for r in labels)
        self.assertGreaterEqual(trained, FILES * PER_FILE - 4 * 16)
        self.assertLessEqual(trained, FILES * PER_FILE + 2 * PER_FILE)
        read = [int(m) for m in re.findall(r"worker \d read (\d+) examples in \d+ slices", out)]
        self.assertEqual(len(read), 2, out)

    def test_a_bad_line_fails_naming_file_and_line(self):
        bad = self.path("bad")
        os.makedirs(bad)
        with open(os.path.join(bad, "train-0"), "w") as f:
            f.write("1\t2\t3\n")
        r = run([PYTHON, SCRIPT, f"--train_files={bad}/train-*", "--intra_op_threads=1"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"data file {bad}/train-0 line 1: 3 tab-separated fields; expected 18", r.stdout + r.stderr)
        nothing = run([PYTHON, SCRIPT, f"--train_files={bad}/absent-*", "--intra_op_threads=1"])
        self.assertNotEqual(nothing.returncode, 0)
        self.assertIn("absent-*' match no file", nothing.stdout + nothing.stderr)

    def test_dlrm_example_trains_from_the_files(self):
        r = run(self.cluster(2, [], [f"--train_files={self.train}", f"--test_files={self.path('data')}/test.gz",
                                     "--ctr_fields=4", "--ctr_dim=4", "--batch_size=64", "--ctr_test_examples=256"],
                             script=DLRM))
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        slices = [int(m) for m in re.findall(r"training files: \d+ examples read \((\d+) slices", out)]
        self.assertEqual(sorted(slices) and sum(slices), 20, out)  # --file_slices=10 x 2 workers
        self.assertRegex(out, r"ctr_dlrm: test log-loss [0-9.]+ \(Bayes nan\), test AUC [0-9.]+ \(Bayes nan\) "
                              r"on 256 examples")

    def test_other_field_counts_train_and_a_mismatch_is_refused(self):
        other = self.path("other")
        r = run([BINARY, "data", "ctr-files", f"--out={other}", "--files=2", "--examples_per_file=300", "--seed=4",
                 "--ctr_fields=7", "--ctr_dense=5", "--ctr_test_examples=128"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        test = psflow.data.read_ctr_files(f"{other}/test", 7, 100, num_dense=5)
        self.assertEqual((test["ids"].shape, test["dense"].shape, test["labels"].shape), ((100, 7), (100, 5), (100,)))
        flags = [f"--train_files={other}/train-*", f"--test_files={other}/test", "--ctr_fields=7", "--ctr_dim=4",
                 "--batch_size=32", "--ctr_test_examples=128"]
        r = run(self.cluster(2, [], [*flags, "--ctr_dense=5"], script=DLRM))
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        self.assertRegex(out, r"ctr_dlrm: test log-loss [0-9.]+ \(Bayes nan\), test AUC [0-9.]+ \(Bayes nan\) "
                              r"on 128 examples")
        r = run(self.cluster(2, [], flags, script=DLRM))  # --ctr_dense=13 by default
        out = r.stdout + r.stderr
        self.assertNotEqual(r.returncode, 0, out)
        self.assertRegex(out, rf"data file {re.escape(other)}/(train-0000[01]|test) line 1: 13 tab-separated fields; "
                              r"expected 21 \(label, 13 integers and 7 categoricals\): set --ctr_dense and "
                              r"--ctr_fields to the files' counts")
        with self.assertRaisesRegex(psflow.InvalidArgumentError, r"expected 21 .*--ctr_dense"):
            psflow.data.read_ctr_files(f"{other}/test", 7, 100)  # num_dense=13 by default


if __name__ == "__main__":
    unittest.main()
