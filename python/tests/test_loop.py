"""The training loop around a PyTorch model: psflow.parse_flags(parser), standalone
training (no cluster flags, no TF_CONFIG: an in-process ps task), the same script under `psflow
local`, evaluate()'s own scalar names (summary line, --metrics_json, TensorBoard read back by the
independent decoder src/tboard/decode_events.py), --eval_every_steps, sess.log_scalar, refusals
of a wrong evaluate() result, and the compute threads set to --intra_op_threads. Real processes,
real PyTorch (loop_script.py).

Run: PYTHONPATH=build/python PSFLOW_BINARY=build/psflow /usr/bin/python3 -m unittest -v test_loop
"""
import argparse
import glob
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

import psflow

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BINARY = os.environ.get("PSFLOW_BINARY", os.path.join(ROOT, "build", "psflow"))
SCRIPT = os.path.join(HERE, "loop_script.py")
DECODE_EVENTS = os.path.join(ROOT, "src", "tboard", "decode_events.py")
PYTHON = "/usr/bin/python3"


def child_env(**extra):
    env = dict(os.environ)
    for name in ("TF_CONFIG", "PSFLOW_FLAGS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
    env.update(extra)
    return env


def run(args, timeout=180):
    return subprocess.run(args, capture_output=True, text=True, env=child_env(), timeout=timeout)


def scalars(logdir):
    """{tag: [(step, value)]} of the chief's event file, decoded independently of psflow."""
    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    assert len(files) == 1, os.listdir(logdir)
    out = subprocess.run([PYTHON, DECODE_EVENTS, files[0]], capture_output=True, text=True, check=True).stdout
    tags = {}
    for line in out.splitlines():
        kind, step, *rest = line.split("\t")
        if kind == "scalar":
            tags.setdefault(rest[0], []).append((int(step), float(rest[2])))
    return tags


class ParseFlagsTest(unittest.TestCase):
    def parser(self):
        p = argparse.ArgumentParser(description="a script of its own")
        p.add_argument("--seq_len", type=int, default=64)
        p.add_argument("--corpus", default="a.txt")
        return p

    def test_one_namespace_with_both(self):
        flags = psflow.parse_flags(self.parser(), argv=["--seq_len", "7", "--batch_size=3", "--sync_replicas"],
                                   defaults={"train_steps": 9})
        self.assertIsInstance(flags, psflow.Flags)
        self.assertEqual((flags.seq_len, flags.corpus), (7, "a.txt"))
        self.assertEqual((flags.batch_size, flags.train_steps, flags.sync_replicas), (3, 9, True))
        self.assertEqual(flags.unparsed, [])

    def test_a_script_flag_named_like_a_psflow_flag_is_refused(self):
        p = self.parser()
        p.add_argument("--batch_size", type=int)
        with self.assertRaisesRegex(psflow.InvalidArgumentError, r"'batch_size' has the name of a psflow flag"):
            psflow.parse_flags(p, argv=[])

    def test_unknown_argument_exits_2_with_argparse_message(self):
        with self.assertRaises(SystemExit) as e, redirect_stdout(io.StringIO()):
            import contextlib
            with contextlib.redirect_stderr(io.StringIO()) as err:
                psflow.parse_flags(self.parser(), argv=["--no_such_flag=1"])
        self.assertEqual(e.exception.code, 2)
        self.assertIn("unrecognized arguments: --no_such_flag=1", err.getvalue())

    def test_bad_psflow_value_is_psflows_one_line(self):
        with self.assertRaisesRegex(psflow.InvalidArgumentError, r"--batch_size=0 must be"):
            psflow.parse_flags(self.parser(), argv=["--batch_size=0"])

    def test_without_a_parser_unknown_flags_stay_unparsed(self):
        self.assertEqual(psflow.parse_flags(["--seq_len=3"]).unparsed, ["--seq_len=3"])

    def test_help_lists_both(self):
        r = run([PYTHON, SCRIPT, "--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--evaluate_returns", r.stdout)
        self.assertIn("--sync_replicas", r.stdout)
        self.assertIn("--eval_every_steps", r.stdout)


class StandaloneAndMetricsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psflow_loop_")

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_trains_alone_with_its_own_metrics(self):
        r = run([PYTHON, SCRIPT, "--hidden=6", f"--report={self.path('r.json')}", f"--logdir={self.path('logs')}",
                 "--eval_every_steps=10", f"--metrics_json={self.path('m.json')}", "--intra_op_threads=1"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("standalone: no cluster flags and no TF_CONFIG", r.stdout)
        with open(self.path("r.json")) as f:
            report = json.load(f)
        with open(self.path("m.json")) as f:
            metrics = json.load(f)
        self.assertEqual(report["hidden"], 6)  # the script's own flag reached it
        self.assertEqual(metrics["global_step"], 40)
        final = report["evaluations"][-1]
        self.assertLess(final["validation_mse"], report["initial_mse"] / 4)  # it trained
        # The script's names, as given: JSON, summary line, TensorBoard.
        self.assertAlmostEqual(metrics["validation_mse"], final["validation_mse"], places=6)
        self.assertAlmostEqual(metrics["eval/half_mse"], final["validation_mse"] / 2, places=6)
        self.assertEqual(metrics["validation_accuracy"], 0.25)
        self.assertEqual(report["summary"]["validation_mse"], metrics["validation_mse"])
        final_line = [l for l in r.stdout.splitlines() if l.startswith("final: ")][0]
        self.assertIn(f"validation_mse={final['validation_mse']:.6g}", final_line)
        # --eval_every_steps=10 of 40: at 10, 20, 30, 40 during training, then at the end.
        self.assertEqual([e["global_step"] for e in report["evaluations"]], [10, 20, 30, 40, 40])
        for step in (10, 20, 30, 40):
            self.assertIn(f"eval at global step {step}: validation_mse=", r.stdout)
        tags = scalars(self.path("logs"))
        mse = dict(tags["validation_mse"])
        for e in report["evaluations"]:
            self.assertAlmostEqual(mse[e["global_step"]], e["validation_mse"], places=5)
        self.assertEqual([s for s, _ in tags["validation_mse"]], [10, 20, 30, 40, 40])
        # log_scalar after every step, at the step it names.
        self.assertEqual(tags["script/half_step"], [(s, s / 2) for s in range(1, 41)])
        # --intra_op_threads=1: torch's pool and OpenBLAS's.
        self.assertEqual((report["torch_threads"], report["openblas_threads"]), (1, [1]))

    def test_threads_follow_the_flag(self):
        r = run([PYTHON, SCRIPT, f"--report={self.path('r.json')}", "--intra_op_threads=2", "--train_steps=3"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(self.path("r.json")) as f:
            report = json.load(f)
        self.assertEqual((report["torch_threads"], report["openblas_threads"]), (2, [2]))

    def test_wrong_evaluate_results_are_refused_with_one_line(self):
        for kind, line in (("float", "evaluate() returned float; return a dict of name -> number"),
                           ("text", "evaluate()'s 'validation_mse' is str; give a number")):
            r = run([PYTHON, SCRIPT, f"--evaluate_returns={kind}", "--eval_every_steps=5", "--train_steps=20"])
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(line, r.stderr)
            self.assertNotIn("TypeError", r.stderr)
            # Refused at the first evaluation (step 5), not after training.
            self.assertNotIn("step 10/20", r.stdout)

    def test_the_same_file_under_the_launcher(self):
        # Sync: the chief's steps wait for worker 1, so a worker that starts late under load still
        # takes part (in 30 async steps it could find the job over and its ps gone).
        r = run([BINARY, "local", "--ps=1", "--workers=2", "--train_steps=30", "--intra_op_threads=1",
                 "--sync_replicas", "--", PYTHON, SCRIPT, "--hidden=5", f"--report={self.path('r.json')}"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("standalone:", r.stdout)
        with open(self.path("r.json")) as f:  # the chief's
            report = json.load(f)
        self.assertEqual((report["hidden"], report["is_chief"]), (5, True))
        self.assertEqual((report["torch_threads"], report["openblas_threads"]), (1, [1]))
        # Named after the script; both workers pushed.
        self.assertIn("final: model=loop_script mode=sync workers=2 ps=1 global_step=30", r.stdout)
        # The worker's last line counts what the session counts.
        with open(self.path("r.json.1")) as f:
            other = json.load(f)
        self.assertFalse(other["is_chief"])
        self.assertIn(f"[worker1] worker 1: done after {other['local_step']} local steps", r.stdout)

    def test_a_restored_job_says_restored(self):
        ckpt = self.path("ckpt")
        first = run([PYTHON, SCRIPT, "--train_steps=20", f"--checkpoint_dir={ckpt}"])
        self.assertEqual(first.returncode, 0, first.stdout + first.stderr)
        self.assertIn("chief: initialized 4 variables at global step 0", first.stdout)
        again = run([PYTHON, SCRIPT, "--train_steps=30", f"--checkpoint_dir={ckpt}"])
        self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
        self.assertIn("chief: restored 4 variables at global step 20", again.stdout)
        self.assertNotIn("chief: initialized", again.stdout)


class ViewParameterTest(unittest.TestCase):
    def test_a_view_of_a_larger_tensor_is_refused_with_one_line(self):
        import torch

        class Sliced(torch.nn.Module):
            def __init__(self):
                super().__init__()
                base = torch.zeros(10)
                self.head = torch.nn.Parameter(base[2:6])  # shares base's storage

        flags = psflow.parse_flags(argv=[])
        with self.assertRaisesRegex(psflow.InvalidArgumentError,
                                    r"parameter 'head' is a view of a larger tensor \(10 elements, this one 4 at "
                                    r"offset 2\)"):
            psflow.WorkerSession(Sliced(), flags)
        whole = Sliced()
        whole.head = torch.nn.Parameter(whole.head.detach().clone())  # its own memory: accepted
        psflow.WorkerSession(whole, flags)


if __name__ == "__main__":
    unittest.main()
