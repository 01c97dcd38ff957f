#!/usr/bin/python3
"""The evaluator task (docs/evaluator.md) with real processes: `psflow local --evaluator` with C++
and with PyTorch workers and on a ctr job (embedding tables), `psflow eval --watch`, `--job_name=evaluator` and TF_CONFIG's evaluator
task on a finished job, a failed job, and the bounded wait.

  /usr/bin/python3 tests/evaluator_test.py --build build --data_dir data/mnist [unittest args]

The independent expectation: the chief evaluates the final parameters itself (its summary, written
by --metrics_json); the evaluator's metrics of the final checkpoint must be the same numbers, and
TensorBoard's eval/ events must hold them at the final step.
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
ARGS = None
TIMEOUT = 240  # bound of every run here; reaching it is a hang

EVAL_LINE = re.compile(r"^\[evaluator\] eval: global_step=(\d+) (.*) checkpoint=(\S+)$|^eval: global_step=(\d+) (.*) "
                       r"checkpoint=(\S+)$", re.M)

RAISING_SCRIPT = r'''
import sys
import torch
import psflow
flags = psflow.parse_flags(sys.argv[1:])
if flags.job_name == "ps":
    psflow.Server.from_flags(flags).join()
    sys.exit(0)
model = torch.nn.Linear(4, 2)
with psflow.WorkerSession(model, flags, model_name="linear") as s:
    while not s.should_stop():
        model(torch.ones(3, 4)).sum().backward()
        s.step(1.0)
        if s.global_step >= 30:
            raise RuntimeError("the chief fails at step 30")
'''


def psflow(*args, env=None, timeout=TIMEOUT):
    return subprocess.run([os.path.join(ARGS.build, "psflow")] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout, env=env)


def evals(text):
    """[(global_step, {metric: value}, checkpoint)] of the `eval:` lines, in order."""
    out = []
    for m in EVAL_LINE.finditer(text):
        step, metrics, path = (m.group(1), m.group(2), m.group(3)) if m.group(1) else (m.group(4), m.group(5),
                                                                                          m.group(6))
        values = dict((k, float(v)) for k, v in (kv.split("=") for kv in metrics.split()))
        out.append((int(step), values, path))
    return out


def eval_events(logdir):
    """{(step, tag): value} of the scalars under logdir/eval (psflow_events_dump)."""
    r = subprocess.run([os.path.join(ARGS.build, "psflow_events_dump"), os.path.join(logdir, "eval")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    scalars = {}
    for line in r.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0].isdigit() and parts[1] != "file_version":
            scalars[(int(parts[0]), parts[1])] = float(parts[2])
    return scalars


class EvaluatorTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psflow_evaluator_test_")
        self.ckpt = os.path.join(self.dir, "ckpt")
        self.logdir = os.path.join(self.dir, "logs")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def local(self, extra, command=()):
        args = ["local", "--ps=1", "--workers=2", "--evaluator", f"--data_dir={ARGS.data_dir}", "--train_steps=400",
                "--save_checkpoint_steps=100", f"--checkpoint_dir={self.ckpt}", f"--logdir={self.logdir}",
                "--log_every=100", f"--metrics_json={self.dir}/m.json"] + list(extra)
        if command:
            args += ["--"] + list(command)
        return psflow(*args)

    def check_job(self, r):
        self.assertEqual(r.returncode, 0, r.stdout[-5000:] + r.stderr)
        with open(os.path.join(self.dir, "m.json")) as f:
            summary = json.load(f)
        found = evals(r.stdout)
        self.assertGreaterEqual(len(found), 1, r.stdout)
        steps = [s for s, _, _ in found]
        self.assertEqual(steps, sorted(set(steps)), "each checkpoint evaluated once, in order")
        step, metrics, path = found[-1]
        # The final checkpoint, and the numbers the chief computed from the same parameters.
        self.assertEqual(step, summary["global_step"])
        self.assertTrue(path.endswith(f"model.ckpt-{step}.safetensors"), path)
        for name in ("validation_accuracy", "test_accuracy", "validation_cross_entropy", "test_cross_entropy"):
            self.assertAlmostEqual(metrics[name], summary[name], delta=1e-5 + 1e-5 * abs(summary[name]))
        self.assertIn(f"[evaluator] evaluator: training ended at global step {step}; evaluated {len(found)} "
                      "checkpoint(s)", r.stdout)
        self.assertIn("psflow local: all tasks exited 0", r.stdout)
        events = eval_events(self.logdir)
        self.assertAlmostEqual(events[(step, "accuracy/test")], summary["test_accuracy"], delta=1e-6)
        self.assertAlmostEqual(events[(step, "cross_entropy/validation")], summary["validation_cross_entropy"],
                               delta=1e-5)
        for s, _, _ in found:
            self.assertIn((s, "accuracy/validation"), events)
        with open(os.path.join(self.ckpt, "training_end.json")) as f:
            self.assertEqual(json.load(f), {"outcome": "done", "global_step": step})
        return step, metrics

    def test_cpp_job_with_evaluator(self):
        step, metrics = self.check_job(self.local([]))
        # The finished directory, evaluated again by every way of starting an evaluator: each
        # evaluates the final checkpoint once and exits 0.
        common = [f"--checkpoint_dir={self.ckpt}", f"--data_dir={ARGS.data_dir}"]
        tf_config = json.dumps({"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                                "task": {"type": "evaluator", "index": 0}})
        for args, env in ((["eval", "--watch"] + common, None),
                          (["train", "--job_name=evaluator"] + common, None),
                          (["train"] + common, dict(os.environ, TF_CONFIG=tf_config))):
            r = psflow(*args, env=env)
            self.assertEqual(r.returncode, 0, (args, r.stdout, r.stderr))
            found = evals(r.stdout)
            self.assertEqual([s for s, _, _ in found], [step], (args, r.stdout))
            self.assertEqual(found[0][1], metrics)
        # An explicit --train_steps beyond the marker's step: that marker is an earlier run's, so
        # the evaluator waits for more (bounded) instead of ending.
        r = psflow("eval", "--watch", "--train_steps=100000", "--eval_timeout_secs=1", *common)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual([s for s, _, _ in evals(r.stdout)], [step])
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("--eval_timeout_secs", r.stderr)

    def test_ctr_job_with_evaluator(self):
        # A job with embedding tables on the ps: the evaluator reads each checkpoint's dense layers
        # and, for the test set's ids only, its tables' rows; its figures of the final checkpoint
        # are the chief's (evaluated on the ps tasks' rows), and the Bayes figures the generator's.
        r = psflow("local", "--ps=1", "--workers=2", "--evaluator", "--model=ctr", "--train_steps=300",
                   "--save_checkpoint_steps=100", "--ctr_test_examples=8192", f"--checkpoint_dir={self.ckpt}",
                   f"--logdir={self.logdir}", "--log_every=100", f"--metrics_json={self.dir}/m.json")
        self.assertEqual(r.returncode, 0, r.stdout[-5000:] + r.stderr)
        with open(os.path.join(self.dir, "m.json")) as f:
            ctr = json.load(f)["ctr"]
        found = evals(r.stdout)
        steps = [s for s, _, _ in found]
        self.assertGreaterEqual(len(found), 1, r.stdout)
        self.assertEqual(steps, sorted(set(steps)), "each checkpoint evaluated once, in order")
        step, metrics, path = found[-1]
        self.assertEqual(step, 300)
        self.assertTrue(path.endswith("model.ckpt-300.safetensors"), path)
        for name in ("test_log_loss", "test_auc", "bayes_log_loss", "bayes_auc"):
            self.assertAlmostEqual(metrics[name], ctr[name], delta=1e-5 * max(1, abs(ctr[name])), msg=name)
        self.assertEqual(metrics["table_rows"], ctr["table_rows"])
        self.assertGreater(metrics["test_auc"], 0.55)  # it learnt (Bayes: about 0.77)
        self.assertIn("[evaluator] evaluator: training ended at global step 300; evaluated "
                      f"{len(found)} checkpoint(s)", r.stdout)
        events = eval_events(self.logdir)
        for s, m, _ in found:
            self.assertAlmostEqual(events[(s, "log_loss/test")], m["test_log_loss"], delta=1e-5)
            self.assertAlmostEqual(events[(s, "auc/test")], m["test_auc"], delta=1e-5)
        with open(os.path.join(self.ckpt, "training_end.json")) as f:
            self.assertEqual(json.load(f), {"outcome": "done", "global_step": 300})
        # The finished directory again, by hand: the watcher evaluates the final checkpoint once;
        # `psflow eval` (no --watch) gives the same figures.
        common = ["--model=ctr", "--ctr_test_examples=8192", f"--checkpoint_dir={self.ckpt}"]
        r = psflow("eval", "--watch", *common)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(evals(r.stdout), [(300, metrics, path)])
        r = psflow("eval", *common)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        once = re.search(r"test_log_loss=([0-9.]+) \(bayes [0-9.]+\) test_auc=([0-9.]+)", r.stdout)
        self.assertIsNotNone(once, r.stdout)
        self.assertAlmostEqual(float(once.group(1)), metrics["test_log_loss"], delta=2e-5)
        self.assertAlmostEqual(float(once.group(2)), metrics["test_auc"], delta=2e-5)

    def test_pytorch_job_with_pytorch_evaluator(self):
        self.check_job(self.local([], [PYTHON, os.path.join(ROOT, "examples/pytorch/mnist_mlp.py")]))

    def test_failed_job_ends_the_evaluator_with_its_reason(self):
        script = os.path.join(self.dir, "raises.py")
        with open(script, "w") as f:
            f.write(RAISING_SCRIPT)
        r = psflow("local", "--ps=1", "--workers=1", "--train_steps=100000", f"--checkpoint_dir={self.ckpt}", "--",
                   PYTHON, script)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        with open(os.path.join(self.ckpt, "training_end.json")) as f:
            self.assertEqual(json.load(f)["outcome"], "failed")
        r = psflow("eval", "--watch", f"--checkpoint_dir={self.ckpt}", "--model=mlp", f"--data_dir={ARGS.data_dir}",
                   "--eval_timeout_secs=30")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("the training job failed", r.stderr)
        self.assertIn("the chief fails at step 30", r.stderr)

    def test_bounded_wait_and_usage_errors(self):
        os.makedirs(self.ckpt)
        r = psflow("eval", "--watch", f"--checkpoint_dir={self.ckpt}", f"--data_dir={ARGS.data_dir}",
                   "--eval_timeout_secs=1")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn(f"no new checkpoint in {self.ckpt} for 1 s", r.stderr)
        r = psflow("local", "--ps=1", "--workers=1", "--evaluator", f"--data_dir={ARGS.data_dir}")
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stdout, "")
        self.assertIn("--evaluator needs --checkpoint_dir", r.stderr)
        r = psflow("train", "--job_name=evaluator", "--task_index=1", f"--checkpoint_dir={self.ckpt}")
        self.assertEqual(r.returncode, 2)
        self.assertIn("one evaluator", r.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--data_dir", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.build = os.path.abspath(ARGS.build)
    ARGS.data_dir = os.path.abspath(ARGS.data_dir)
    unittest.main(argv=[sys.argv[0]] + rest)
