#!/usr/bin/python3
"""What a newcomer tripped on (issue 20.4), each kept fixed, with real processes:

- a metric the script's evaluate() did not measure is absent from the summary line and the JSON
  (never 0), and a PyTorch script's summary is named after the script, not `Sequential`;
- a job started with only worker 0 of two: the chief names the worker that never pushed and the
  summary counts 1 worker;
- the chief's /metrics `psflow_connected_workers` counts the workers training;
- every worker, the chief too, prints `done after N local steps`; the ps's last line carries the
  chief's table's figures and nothing after them; the launcher's header lines are apart;
- JSON figures without float32 noise (at most 7 significant digits);
- a missing relative --data_dir names the absolute path tried;
and of issue 29.7: --optimizer=adamw on a model without tables; --placement and --partitioner
checked before anything trains or starts; psflow eval without --model; a missing --checkpoint_dir;
ctr in --help, table flags' defaults, a suggestion for a mistyped flag; every worker's gauge.

  /usr/bin/python3 tests/newcomer_test.py --build build --data_dir data/mnist [unittest args]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"
ARGS = None
TIMEOUT = 240

sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from localhost import free_ports  # noqa: E402

# The docs' PyTorch script's shape (docs/pytorch.md): an nn.Sequential and an evaluate() that
# measures the test set only.
TEST_ONLY_SCRIPT = r'''
import sys
import torch
import torch.nn as nn
import psflow
flags = psflow.parse_flags(sys.argv[1:], defaults={"batch_size": 100, "optimizer": "adam", "learning_rate": 0.01})
if flags.job_name == "ps":
    psflow.Server.from_flags(flags).join()
    sys.exit(0)
mnist = psflow.load_mnist(flags.data_dir)
x, y = torch.from_numpy(mnist["train"]["images"]), torch.from_numpy(mnist["train"]["labels"])
model = nn.Sequential(nn.Linear(784, 100), nn.ReLU(), nn.Linear(100, 10))
def evaluate():
    with torch.no_grad():
        logits = model(torch.from_numpy(mnist["test"]["images"]))
        return {"test_accuracy": float((logits.argmax(1) == torch.from_numpy(mnist["test"]["labels"])).float().mean())}
with psflow.WorkerSession(model, flags, evaluate=evaluate) as s:
    while not s.should_stop():
        idx = torch.from_numpy(s.batch_indices(len(x)))
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        s.step(loss.item())
'''


def psflow(*args, timeout=TIMEOUT, cwd=None):
    return subprocess.run([os.path.join(ARGS.build, "psflow")] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout, cwd=cwd)


def significant_digits(number_text):
    """"0.1604213" -> 7, "0.9696000218391418" -> 16."""
    return len(re.sub(r"[eE].*$", "", number_text).replace("-", "").replace(".", "").lstrip("0"))


class NewcomerTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psflow_newcomer_test_")

    def check_json_has_no_float32_noise(self, text):
        for number in re.findall(r"-?\d+\.\d+(?:[eE]-?\d+)?", text):
            self.assertLessEqual(significant_digits(number), 7, f"{number} in {text}")

    def test_pytorch_summary_leaves_out_what_was_not_measured_and_is_named_after_the_script(self):
        script = os.path.join(self.dir, "my_mnist.py")
        with open(script, "w") as f:
            f.write(TEST_ONLY_SCRIPT)
        r = psflow("local", "--ps=1", "--workers=2", f"--data_dir={ARGS.data_dir}", "--train_steps=200",
                   f"--metrics_json={self.dir}/m.json", "--", PYTHON, script)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(self.dir, "m.json")) as f:
            text = f.read()
        m = json.loads(text)
        self.assertEqual(m["model"], "my_mnist")
        self.assertIn("test_accuracy", m)
        for absent in ("validation_accuracy", "validation_cross_entropy", "test_cross_entropy"):
            self.assertNotIn(absent, m)
        final = re.search(r"^\[worker0\] final: .*$", r.stdout, re.M).group(0)
        self.assertIn("model=my_mnist ", final)
        self.assertRegex(final, r" test_accuracy=0\.\d{4} ")
        self.assertNotIn("validation_", final)
        self.check_json_has_no_float32_noise(text)
        # The launcher's header: the cluster, then the command, on lines of their own.
        lines = r.stdout.splitlines()
        self.assertRegex(lines[0], r"^psflow local: ps 127\.0\.0\.1:\d+; workers 127\.0\.0\.1:\d+,127\.0\.0\.1:\d+$")
        self.assertEqual(lines[1], f"psflow local: the workers run: {PYTHON} {script}")

    def test_cpp_job_lines_and_json(self):
        r = psflow("local", "--ps=1", "--workers=2", f"--data_dir={ARGS.data_dir}", "--train_steps=2000",
                   "--log_every=500", f"--metrics_json={self.dir}/m.json")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(self.dir, "m.json")) as f:
            text = f.read()
        m = json.loads(text)
        self.check_json_has_no_float32_noise(text)
        for name in ("validation_accuracy", "validation_cross_entropy", "test_accuracy", "test_cross_entropy"):
            self.assertIn(name, m)
        self.assertRegex(r.stdout, r"\[worker0\] worker 0: done after \d+ local steps")
        self.assertRegex(r.stdout, r"\[worker1\] worker 1: done after \d+ local steps")
        t = m["ps_traffic"][0]
        self.assertRegex(r.stdout, rf"\[ps0\] ps task 0 done at global step {m['global_step']}: 79510 params, "
                                   rf"{t['bytes_in']} bytes in, {t['bytes_out']} bytes out\n")

    def test_missing_worker_is_named_and_not_counted(self):
        ports = free_ports(3)
        cluster = [f"--ps_hosts=127.0.0.1:{ports[0]}", f"--worker_hosts=127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}"]
        ps = subprocess.Popen([os.path.join(ARGS.build, "psflow"), "train", "--job_name=ps", "--task_index=0"] +
                              cluster, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            r = psflow("train", "--job_name=worker", "--task_index=0", *cluster, f"--data_dir={ARGS.data_dir}",
                       "--train_steps=300", f"--metrics_json={self.dir}/m.json")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("chief: worker 1 never pushed a gradient; the summary counts the 1 worker(s) that did",
                          r.stdout)
            self.assertRegex(r.stdout, r"final: model=mlp mode=async workers=1 ps=1 ")
            with open(os.path.join(self.dir, "m.json")) as f:
                self.assertEqual(json.load(f)["workers"], 1)
        finally:
            ps.communicate(timeout=TIMEOUT)

    def test_chief_metrics_count_the_connected_workers(self):
        base = free_ports(1)[0]
        if base > 60000:
            base -= 5000
        launcher = subprocess.Popen([os.path.join(ARGS.build, "psflow"), "local", "--ps=1", "--workers=2",
                                     f"--data_dir={ARGS.data_dir}", "--train_steps=100000000", "--log_every=100000",
                                     f"--metrics_port={base}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
        # Tasks in order: ps 0, then worker 0 (the chief), then worker 1. Issue 29: worker 1 read 0.
        urls = {"chief": f"http://127.0.0.1:{base + 1}/metrics", "worker 1": f"http://127.0.0.1:{base + 2}/metrics"}
        seen = {who: None for who in urls}
        try:
            deadline = time.time() + 90
            while time.time() < deadline and any(v != "2" for v in seen.values()):
                for who, url in urls.items():
                    try:
                        body = urllib.request.urlopen(url, timeout=5).read().decode()
                        found = re.search(r"^psflow_connected_workers (\S+)$", body, re.M)
                        seen[who] = found.group(1) if found else None
                    except OSError:
                        pass
                time.sleep(0.2)
        finally:
            os.killpg(launcher.pid, signal.SIGTERM)
            out = launcher.communicate(timeout=TIMEOUT)[0]
        self.assertEqual(seen, {"chief": "2", "worker 1": "2"}, out[-3000:])

    # Issue 29.7: what the second newcomer tripped on.
    def test_adamw_trains_a_model_without_tables_and_is_named_for_one_with_tables(self):
        r = psflow("train", "--model=mlp", "--optimizer=adamw", "--train_steps=20", f"--data_dir={ARGS.data_dir}")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = psflow("train", "--model=ctr", "--optimizer=adamw", "--sparse_optimizer=adamw", "--train_steps=2")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("--sparse_optimizer=adamw must be one of sgd, momentum, adagrad, ftrl, adam, rmsprop", r.stderr)
        help_text = psflow("train", "--help").stdout
        self.assertRegex(help_text, r"--optimizer TEXT +sgd \| momentum \| adagrad \| adam \| adamw \| rmsprop")

    def test_bad_placement_and_partitioner_are_refused_before_training_or_starting_tasks(self):
        for flag, message in (("--placement=greedyy", "--placement=greedyy is not a placement strategy"),
                              ("--partitioner=fixed:0", "--partitioner=fixed:0")):
            r = psflow("train", "--model=mlp", "--train_steps=50", f"--data_dir={ARGS.data_dir}", flag)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn(message, r.stderr)
            self.assertNotIn("step", r.stdout)
            r = psflow("local", "--ps=1", "--workers=2", "--train_steps=50", f"--data_dir={ARGS.data_dir}", flag)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn(message, r.stderr)
            self.assertNotIn("[ps0]", r.stdout)  # no task was started

    def test_eval_takes_the_model_from_the_checkpoint_and_names_a_missing_directory(self):
        ckpt = os.path.join(self.dir, "ckpt")
        r = psflow("train", "--model=softmax", "--train_steps=30", f"--data_dir={ARGS.data_dir}",
                   f"--checkpoint_dir={ckpt}")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = psflow("eval", f"--checkpoint_dir={ckpt}", f"--data_dir={ARGS.data_dir}")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"eval: .* global_step=30 test_accuracy=0\.\d+")
        missing = os.path.join(self.dir, "no_such_dir")
        r = psflow("eval", f"--checkpoint_dir={missing}", f"--data_dir={ARGS.data_dir}")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.strip(), f"psflow: error: --checkpoint_dir={missing} does not exist or is not a "
                         "directory (give the directory the chief saved its checkpoints to)")

    def test_help_lists_ctr_and_a_mistyped_flag_gets_a_suggestion(self):
        help_text = psflow("train", "--help").stdout
        self.assertRegex(help_text, r"--model TEXT.*softmax \| mlp \| cnn \| vgg19 \| ctr")
        self.assertNotIn("softmax ,", help_text)
        self.assertRegex(help_text, r"--sparse_optimizer TEXT .*\(default: --optimizer's rule; the model's: ctr \w+\)")
        r = psflow("train", "--modle=ctr")
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr.strip(),
                         "psflow: error: unknown flag --modle; did you mean --model? (see psflow train --help)")

    def test_relative_data_dir_names_the_absolute_path(self):
        r = psflow("train", "--model=mlp", "--train_steps=10", "--data_dir=no/such/mnist", cwd=self.dir)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.strip(),
                         f"psflow: error: data directory 'no/such/mnist' ({os.path.realpath(self.dir)}/no/such/mnist) "
                         "not found; run scripts/setup.sh (it downloads MNIST) or pass --data_dir")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--data_dir", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.build = os.path.abspath(ARGS.build)
    ARGS.data_dir = os.path.abspath(ARGS.data_dir)
    unittest.main(argv=[sys.argv[0]] + rest)
