#!/usr/bin/python3
"""`psflow local` as a launcher, with real processes: the worker command after `--` (TF_CONFIG and
PSFLOW_FLAGS reach it), a failing worker stops everything, Ctrl-C is reported as an interruption,
no task outlives a launcher killed with SIGKILL, and `psflow local --help` does not list the
cluster flags it refuses.

  /usr/bin/python3 tests/local_launcher_test.py --build build --data_dir data/mnist [unittest args]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = None  # set in __main__
TIMEOUT = 120  # bound of every launcher run here; reaching it is a hang


def psflow():
    return os.path.join(ARGS.build, "psflow")


def run(args, timeout=TIMEOUT):
    return subprocess.run([psflow()] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def start_time(pid):
    """The process's start time (clock ticks since boot), or None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def descendants(pid):
    """Every live process below `pid`, as {pid: start time}."""
    found, todo = {}, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except FileNotFoundError:
            continue
        for k in kids:
            t = start_time(k)
            if t is not None:
                found[k] = t
                todo.append(k)
    return found


def alive(procs):
    """The processes of {pid: start time} still running (same pid and same start time)."""
    return [p for p, t in procs.items() if start_time(p) == t]


class Launcher:
    """`psflow local` in its own session (as a shell runs a job), its output in a file."""

    def __init__(self, args, workdir):
        self.log_path = os.path.join(workdir, "launcher.log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([psflow()] + args, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def output(self):
        with open(self.log_path) as f:
            return f.read()

    def wait_for(self, pattern, timeout=TIMEOUT):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if re.search(pattern, self.output()):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"launcher exited {self.proc.returncode} before /{pattern}/:\n{self.output()}")
            time.sleep(0.05)
        raise AssertionError(f"no /{pattern}/ within {timeout} s:\n{self.output()}")

    def wait_tasks(self, count, timeout=TIMEOUT):
        """Waits until `count` live processes run below the launcher; returns them."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            procs = descendants(self.proc.pid)
            if len(procs) >= count:
                return procs
            time.sleep(0.05)
        raise AssertionError(f"fewer than {count} tasks under the launcher after {timeout} s")

    def finish(self, timeout=TIMEOUT):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"launcher still running after {timeout} s:\n{self.output()}")


def wait_gone(procs, timeout):
    deadline = time.time() + timeout
    while alive(procs) and time.time() < deadline:
        time.sleep(0.05)
    return alive(procs)


class LauncherTest(unittest.TestCase):
    def setUp(self):
        import tempfile
        self.workdir = tempfile.mkdtemp(prefix="psflow_launcher_test_")
        self.cpp_job = ["local", "--ps=1", "--workers=2", "--model=mlp", "--train_steps=1000000",
                        f"--data_dir={ARGS.data_dir}", "--log_every=50"]

    def test_help_does_not_list_the_refused_cluster_flags(self):
        r = run(["local", "--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--workers", r.stdout)
        self.assertIn("--train_steps", r.stdout)
        for flag in ("--job_name", "--task_index", "--ps_hosts", "--worker_hosts"):
            self.assertNotIn(flag, r.stdout)
        self.assertIn("--job_name", run(["train", "--help"]).stdout)  # where they belong

    def test_refused_cluster_flags_give_one_line(self):
        for flag in ("--job_name=ps", "--task_index=1", "--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2"):
            r = run(["local", flag])
            self.assertEqual(r.returncode, 2, flag)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(flag.split("=")[0], r.stderr)

    def test_nothing_after_dashdash_is_one_line(self):
        r = run(["local", "--ps=1", "--workers=1", "--"])
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("nothing after `--`", r.stderr)

    def test_a_command_without_dashdash_is_one_line_naming_it(self):
        r = run(["local", "--ps=1", "--workers=1", "python3", "train.py"])
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("train.py", r.stderr)
        self.assertIn("after `--`", r.stderr)

    def test_worker_command_gets_tf_config_and_psflow_flags(self):
        # Each worker prints its environment; then worker 0 fails (once worker 1 has printed): the
        # launcher stops the others and exits with the worker's status.
        ready = os.path.join(self.workdir, "worker1_ready")
        script = ('echo "TF_CONFIG=$TF_CONFIG"; echo "PSFLOW_FLAGS=$PSFLOW_FLAGS"; '
                  f'case "$TF_CONFIG" in *\'"index":1\'*) touch {ready}; sleep 100;; esac; '
                  f'for i in $(seq 600); do [ -e {ready} ] && exit 3; sleep 0.1; done; exit 4')
        r = run(["local", "--ps=2", "--workers=2", "--train_steps=77", "--sync_replicas", "--metrics_port=0",
                 "--", "sh", "-c", script])
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        configs = {}
        for index in (0, 1):
            line = re.search(rf"^\[worker{index}\] TF_CONFIG=(.*)$", r.stdout, re.M)
            self.assertIsNotNone(line, r.stdout)
            configs[index] = json.loads(line.group(1))
            flags = re.search(rf"^\[worker{index}\] PSFLOW_FLAGS=(.*)$", r.stdout, re.M)
            self.assertIsNotNone(flags, r.stdout)
            flags = json.loads(flags.group(1))
            self.assertIn("--train_steps=77", flags)
            self.assertIn("--sync_replicas", flags)
            self.assertFalse([f for f in flags if f.startswith(("--ps=", "--workers="))], flags)
        for index, config in configs.items():
            self.assertEqual(config["task"], {"type": "worker", "index": index})
            self.assertEqual(len(config["cluster"]["ps"]), 2)
            self.assertEqual(len(config["cluster"]["worker"]), 2)
            self.assertEqual(config["cluster"], configs[0]["cluster"])
        # The addresses are the ones the launcher announced and gave its ps tasks.
        announced = re.search(r"psflow local: ps (\S+); workers (\S+)", r.stdout)
        self.assertEqual(announced.group(1).split(","), configs[0]["cluster"]["ps"])
        self.assertEqual(announced.group(2).split(","), configs[0]["cluster"]["worker"])
        self.assertIn("psflow local: worker0 exited with status 3; stopping the other tasks", r.stdout)

    def test_missing_worker_command_is_named(self):
        r = run(["local", "--ps=1", "--workers=1", "--", "/nonexistent/train.py"])
        self.assertEqual(r.returncode, 127)
        self.assertIn("cannot start /nonexistent/train.py: No such file or directory", r.stdout)

    def test_ctrl_c_reports_an_interruption_and_stops_every_task(self):
        launcher = Launcher(self.cpp_job, self.workdir)
        launcher.wait_for(r"\[worker0\] step \d+/")
        tasks = launcher.wait_tasks(3)
        # A terminal's Ctrl-C: SIGINT to the launcher's whole foreground process group.
        os.killpg(launcher.proc.pid, signal.SIGINT)
        code = launcher.finish()
        out = launcher.output()
        self.assertEqual(code, 128 + signal.SIGINT, out)
        self.assertIn("psflow local: interrupted (Ctrl-C); stopping every task", out)
        self.assertIn("interrupted by the user", out)
        self.assertNotIn("killed by signal", out)
        self.assertNotIn("exited with status", out)
        self.assertEqual(alive(tasks), [])  # the launcher reaped them before exiting

    def check_kill9(self, args, pattern, tasks):
        launcher = Launcher(args, self.workdir)
        launcher.wait_for(pattern)
        procs = launcher.wait_tasks(tasks)
        os.kill(launcher.proc.pid, signal.SIGKILL)
        launcher.proc.wait()
        left = wait_gone(procs, 5)
        for p in left:  # clean up before failing
            os.kill(p, signal.SIGKILL)
        self.assertEqual(left, [], f"still running 5 s after kill -9 of the launcher:\n{launcher.output()}")

    def test_kill9_of_the_launcher_ends_every_cpp_task(self):
        self.check_kill9(self.cpp_job, r"\[worker1\] step \d+/", 3)

    def test_kill9_of_the_launcher_ends_every_worker_command(self):
        # Workers that would otherwise sleep for 10 minutes, and the ps task waiting for them.
        self.check_kill9(["local", "--ps=2", "--workers=2", "--", "/usr/bin/python3", "-c",
                          "import time; print('up', flush=True); time.sleep(600)"], r"\[worker1\] up", 4)

    def test_kill9_of_the_launcher_ends_every_pytorch_task(self):
        example = os.path.join(ROOT, "examples/pytorch/mnist_mlp.py")
        if not pytorch_workers_available():
            self.skipTest("the psflow Python package or torch is not importable by /usr/bin/python3")
        self.check_kill9(["local", "--ps=1", "--workers=2", "--train_steps=1000000", "--log_every=20",
                          f"--data_dir={ARGS.data_dir}", "--", "/usr/bin/python3", example],
                         r"\[worker1\] .*step \d+/", 3)


def pytorch_workers_available():
    r = subprocess.run(["/usr/bin/python3", "-c", "import psflow, torch"], capture_output=True)
    return r.returncode == 0 and os.path.exists(os.path.join(ROOT, "examples/pytorch/mnist_mlp.py"))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data_dir", default=os.path.join(ROOT, "data/mnist"))
    ARGS, rest = p.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
