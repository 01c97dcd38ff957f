"""A psflow job on simulated hosts (tests/netns/hosts.py): every ps and worker task in its own
network namespace, started as `ip netns exec NS psflow train --job_name=... --ps_hosts=10.231...`.

    with hosts.Network() as net:
        job = cluster.Job(net, psflow, workdir, num_ps=2, num_workers=2, flags=[...])
        job.start_all()
        job.wait_for_step(100)                 # a worker logged global step >= 100
        net.link_down(job.host("ps:0")) ...
        codes = job.wait_all(timeout=120)      # {"ps:0": 0, ..., "worker:1": None (hung, killed)}
        job.summary()                          # the chief's --metrics_json

Auth: `auth="secret"` (default) writes a cluster secret file and passes --cluster_secret_file to
every task; `auth="insecure"` passes --insecure; `auth="none"` passes neither (a ps must refuse).
Every task listens on port 2222 of its own address: namespaces do not share ports.
Logs: WORKDIR/<job><index>.log (appended across restarts). Not thread-safe.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import unittest

PORT = 2222


class Job:
    def __init__(self, net, psflow, workdir, num_ps, num_workers, flags, auth="secret", chief_json=True):
        self.net, self.psflow, self.workdir = net, psflow, workdir
        self.tasks = [f"ps:{i}" for i in range(num_ps)] + [f"worker:{i}" for i in range(num_workers)]
        self.hosts = {t: net.add_host(t.replace(":", "")) for t in self.tasks}
        self.ps_hosts = ",".join(f"{self.hosts[f'ps:{i}'].addr}:{PORT}" for i in range(num_ps))
        self.worker_hosts = ",".join(f"{self.hosts[f'worker:{i}'].addr}:{PORT}" for i in range(num_workers))
        self.flags = list(flags)
        if auth == "secret":
            secret = os.path.join(workdir, "secret")
            with open(secret, "w") as f:
                f.write(os.urandom(32).hex() + "\n")
            os.chmod(secret, 0o600)
            self.flags.append(f"--cluster_secret_file={secret}")
        elif auth == "insecure":
            self.flags.append("--insecure")
        elif auth != "none":
            raise ValueError(f"auth must be secret, insecure or none, not {auth}")
        self.metrics_json = os.path.join(workdir, "summary.json") if chief_json else None
        self.procs, self.started, self.exited = {}, {}, {}

    def host(self, task):
        return self.hosts[task]

    def log_path(self, task):
        return os.path.join(self.workdir, task.replace(":", "") + ".log")

    def argv(self, task, extra=()):
        job, index = task.split(":")
        argv = [self.psflow, "train", f"--job_name={job}", f"--task_index={index}", f"--ps_hosts={self.ps_hosts}",
                f"--worker_hosts={self.worker_hosts}", *self.flags, *extra]
        if task == "worker:0" and self.metrics_json:
            argv.append(f"--metrics_json={self.metrics_json}")
        return argv

    def start(self, task, extra=()):
        self.procs[task] = self.net.popen(self.hosts[task], self.argv(task, extra), self.log_path(task))
        self.started[task] = time.time()
        self.exited.pop(task, None)
        return self.procs[task]

    def start_all(self):
        for t in self.tasks:
            self.start(t)

    def poll(self):
        """Records exit times of tasks that ended; returns {task: code or None}."""
        now = time.time()
        for t, p in self.procs.items():
            if t not in self.exited and p.poll() is not None:
                self.exited[t] = now
        return {t: p.poll() for t, p in self.procs.items()}

    def wait_all(self, timeout):
        """Waits (polling every 0.1 s, recording exit times) up to timeout seconds; a task still
        running then is killed and reported None (a hang)."""
        deadline = time.time() + timeout
        while time.time() < deadline and any(c is None for c in self.poll().values()):
            time.sleep(0.1)
        codes = self.poll()
        for t, p in self.procs.items():
            if codes[t] is None:
                p.send_signal(18)  # SIGCONT, in case it is frozen
                p.kill()
                p.wait()
        return codes

    def text(self, task):
        try:
            with open(self.log_path(task), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def latest_step(self):
        """The highest global step any worker has logged so far."""
        steps = []
        for t in self.tasks:
            if t.startswith("worker"):
                steps += [int(m) for m in re.findall(r"step (\d+)/", self.text(t))]
        return max(steps) if steps else 0

    def wait_for_step(self, step, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.latest_step() >= step:
                return True
            if any(c is not None for c in self.poll().values()):
                return False
            time.sleep(0.05)
        return False

    def summary(self):
        with open(self.metrics_json) as f:
            return json.load(f)

    def logs_tail(self, lines=15):
        out = []
        for t in self.tasks:
            tail = self.text(t).splitlines()[-lines:]
            out.append(f"--- {t} ({self.log_path(t)})\n" + "\n".join(tail))
        return "\n".join(out)


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} of a .safetensors file (standard library only)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        out[name] = (meta["dtype"], tuple(meta["shape"]), data[begin:end])
    return out


def final_checkpoint(ckpt_dir):
    """Path of the checkpoint with the highest step number in ckpt_dir."""
    files = [f for f in os.listdir(ckpt_dir) if f.endswith(".safetensors")]
    if not files:
        raise FileNotFoundError(f"no .safetensors checkpoint in {ckpt_dir}")
    return os.path.join(ckpt_dir, max(files, key=lambda f: [int(x) for x in re.findall(r"\d+", f)] or [0]))


def evaluate(psflow, ckpt_dir, model, data_dir):
    """`psflow eval` of a checkpoint directory: its stdout."""
    return subprocess.run([psflow, "eval", f"--checkpoint_dir={ckpt_dir}", f"--model={model}",
                           f"--data_dir={data_dir}"], capture_output=True, text=True, timeout=120).stdout


def run_tests(doc, args):
    """A netns test script's entry point: --build and --data_dir (absolute paths written into
    `args`), then its unittest cases in the caller's __main__; exits hosts.SKIP with one line
    where simulated hosts cannot be made."""
    import hosts  # noqa: E402 (beside this file, as for the test scripts)
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--build", default=args.build)
    p.add_argument("--data_dir", default=args.data_dir)
    parsed, rest = p.parse_known_args()
    args.build, args.data_dir = os.path.abspath(parsed.build), os.path.abspath(parsed.data_dir)
    reason = hosts.unavailable()
    if reason:
        print(f"SKIPPED: simulated hosts unavailable: {reason}", flush=True)
        sys.exit(hosts.SKIP)
    unittest.main(module="__main__", argv=[sys.argv[0]] + rest, verbosity=2)
