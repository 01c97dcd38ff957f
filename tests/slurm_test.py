#!/usr/bin/env python3
"""psflow under a real Slurm (docs/cluster.md#slurm): this test starts munged, slurmctld and
slurmd itself in a temporary directory (one node named `localhost`, oversubscribed, 8 CPUs
declared), then runs through srun:

  1. `srun --overcommit -n3 psflow train --slurm_jobs=ps:1,worker:2 --model=mlp ...`: every task
     exits 0, the chief's summary names 2 workers and 1 ps, and the ps reports the target step;
  2. the same 3 tasks with --slurm_jobs=ps:1,worker:3: each task says in one line that the jobs
     need 4 tasks but the step has 3, and exits 2;
  3. `srun --overcommit -n3 python3 examples/pytorch/mnist_mlp.py` (psflow.parse_flags reads the
     step; no --slurm_jobs: the default 1 ps + 2 workers), every task exiting 0.

It prints the wall time of job 1 beside the same job under `psflow local --ps=1 --workers=2`.
The daemons are stopped on every path (success, failure, Ctrl-C). Exits 77 (CTest SKIP) only when
Slurm or munge is not installed (scripts/setup.sh installs slurm-wlm and munge).

    tests/slurm_test.py --build build --data_dir data/mnist
"""
import argparse
import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = ["munged", "slurmctld", "slurmd", "srun", "sinfo", "scancel", "squeue"]


def find_tool(name):
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(count):
    """A base port such that base .. base+count-1 are free on loopback now."""
    for _ in range(200):
        base = 20000 + int.from_bytes(os.urandom(2), "little") % 30000
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free run of ports")


class SlurmCluster:
    """munged + slurmctld + slurmd in `root`, each a child process of this one (foreground mode)."""

    def __init__(self, root):
        self.root = root
        self.procs = []
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for k in list(self.env):  # no cluster from the caller's environment
            if k.startswith("SLURM_") and k != "SLURM_CONF" or k in ("TF_CONFIG", "PSFLOW_FLAGS"):
                del self.env[k]

    def start(self):
        munge_dir = os.path.join(self.root, "munge")
        os.makedirs(munge_dir, mode=0o700)
        key = os.path.join(munge_dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self.socket = os.path.join(munge_dir, "munge.socket")
        self._spawn("munged", [find_tool("munged"), "--foreground", "--force", f"--socket={self.socket}",
                               f"--key-file={key}", f"--pid-file={munge_dir}/munged.pid",
                               f"--log-file={munge_dir}/munged.log", f"--seed-file={munge_dir}/munged.seed"])
        deadline = time.time() + 20
        while not os.path.exists(self.socket):
            if time.time() > deadline:
                raise RuntimeError("munged did not create its socket within 20 s")
            time.sleep(0.1)

        user = getpass.getuser()
        for d in ("state", "spool"):
            os.makedirs(os.path.join(self.root, d))
        host = socket.gethostname().split(".")[0]
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=psflowtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser={user}
SlurmdUser={user}
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd.pid
SlurmctldLogFile={self.root}/slurmctld.log
SlurmdLogFile={self.root}/slurmd.log
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=localhost NodeHostname={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""")
        self._spawn("slurmctld", [find_tool("slurmctld"), "-D", "-c", "-f", self.conf])
        self._spawn("slurmd", [find_tool("slurmd"), "-D", "-N", "localhost", "-f", self.conf])
        deadline = time.time() + 60
        state = ""
        while time.time() < deadline:
            r = subprocess.run([find_tool("sinfo"), "-h", "-N", "-o", "%T"], env=self.env,
                               capture_output=True, text=True)
            state = r.stdout.strip()
            if state == "idle":
                return
            for name, p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}; see {self.root}/{name}.log")
            time.sleep(0.5)
        raise RuntimeError(f"node localhost is '{state}', not idle, after 60 s; see {self.root}/slurmctld.log")

    def _spawn(self, name, argv):
        log = open(os.path.join(self.root, f"{name}.out"), "w")
        self.procs.append((name, subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                  start_new_session=True)))

    def srun(self, ntasks, argv, timeout=300):
        cmd = [find_tool("srun"), "--overcommit", f"-n{ntasks}", "--label", "--kill-on-bad-exit=1",
               "--time=10"] + argv
        print("$", " ".join(cmd), flush=True)
        start = time.monotonic()
        r = subprocess.run(cmd, env=self.env, cwd=SOURCE, capture_output=True, text=True, timeout=timeout)
        return r, time.monotonic() - start

    def stop(self):
        if self.procs and os.path.exists(self.conf):
            subprocess.run([find_tool("scancel"), "--full", "--partition=debug"], env=self.env,
                           capture_output=True, timeout=30)
            deadline = time.time() + 20
            while time.time() < deadline:
                r = subprocess.run([find_tool("squeue"), "-h"], env=self.env, capture_output=True, text=True,
                                   timeout=30)
                if r.returncode != 0 or not r.stdout.strip():
                    break
                time.sleep(0.5)
        # slurmd, then slurmctld, then munged: each by its own process id.
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []


def labeled(output, task):
    """The lines srun --label printed for one task (`N: line`)."""
    return [line.split(": ", 1)[1] for line in output.splitlines() if line.startswith(f"{task}: ")]


def check(cond, message, result=None):
    if not cond:
        if result is not None:
            print("--- stdout\n" + result.stdout[-4000:] + "\n--- stderr\n" + result.stderr[-4000:], flush=True)
        raise AssertionError(message)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"))
    ap.add_argument("--data_dir", default=os.path.join(SOURCE, "data", "mnist"))
    ap.add_argument("--train_steps", type=int, default=3000)
    args = ap.parse_args()
    missing = [t for t in TOOLS if not find_tool(t)]
    if missing:
        print(f"SKIP: {', '.join(missing)} not installed (apt-get install slurm-wlm munge)")
        return 77
    psflow = os.path.abspath(os.path.join(args.build, "psflow"))
    data_dir = os.path.abspath(args.data_dir)
    root = tempfile.mkdtemp(prefix="psflow_slurm_")
    cluster = SlurmCluster(root)
    ok = False
    try:
        cluster.start()
        port_base = free_port_run(4)
        common = [f"--data_dir={data_dir}", "--model=mlp", f"--train_steps={args.train_steps}",
                  f"--slurm_port_base={port_base}", "--log_every=1000"]

        # 1. psflow train, 1 ps + 2 workers.
        r, slurm_secs = cluster.srun(3, [psflow, "train", "--slurm_jobs=ps:1,worker:2"] + common)
        check(r.returncode == 0, f"srun psflow train exited {r.returncode}", r)
        chief = "\n".join(labeled(r.stdout, 1))
        check(re.search(rf"final: model=mlp mode=async workers=2 ps=1 global_step={args.train_steps}\b", chief),
              "the chief (rank 1) printed no final summary of 2 workers and 1 ps", r)
        check(f"ps task 0: training finished at step {args.train_steps}" in "\n".join(labeled(r.stdout + r.stderr, 0)),
              "rank 0 did not run ps task 0 to the end", r)
        print(f"srun -n3 psflow train: all tasks exited 0 in {slurm_secs:.1f} s", flush=True)

        # 2. a step with a task count the jobs do not match: one line per task, exit 2.
        r, _ = cluster.srun(3, [psflow, "train", "--slurm_jobs=ps:1,worker:3"] + common, timeout=120)
        want = ("psflow: error: --slurm_jobs=ps:1,worker:3 needs 4 tasks but this Slurm step has 3 "
                "(SLURM_STEP_TASKS_PER_NODE=3): start it with srun -n4, or change --slurm_jobs")
        check(r.returncode == 2, f"a mismatched step exited {r.returncode}, not 2", r)
        for task in range(3):
            # srun --kill-on-bad-exit may cancel the step before a slow task exits on its own; the
            # stepd's "*** STEP ... CANCELLED" line then carries that task's label, and is not psflow's.
            said = [line for line in labeled(r.stderr, task) if not line.startswith("slurmstepd")]
            check(said == [want], f"task {task} did not say exactly: {want}", r)

        # 3. PyTorch workers through psflow.parse_flags (the default jobs: 1 ps, 2 workers).
        cluster.env["PYTHONPATH"] = os.path.abspath(os.path.join(args.build, "python"))
        r, torch_secs = cluster.srun(3, ["/usr/bin/python3", "examples/pytorch/mnist_mlp.py", f"--data_dir={data_dir}",
                                         "--train_steps=300", f"--slurm_port_base={port_base}"])
        check(r.returncode == 0, f"srun python3 examples/pytorch/mnist_mlp.py exited {r.returncode}", r)
        check(re.search(r"workers=2 ps=1 global_step=300\b", "\n".join(labeled(r.stdout, 1))),
              "the PyTorch chief (rank 1) printed no final summary of 2 workers and 1 ps", r)
        print(f"srun -n3 python3 examples/pytorch/mnist_mlp.py: all tasks exited 0 in {torch_secs:.1f} s", flush=True)

        # The same job as 1. under psflow local, for the wall-time comparison (no assertion).
        start = time.monotonic()
        local = subprocess.run([psflow, "local", "--ps=1", "--workers=2"] + common[:3] + ["--log_every=1000"],
                               cwd=SOURCE, env=cluster.env, capture_output=True, text=True, timeout=300)
        local_secs = time.monotonic() - start
        check(local.returncode == 0, f"psflow local exited {local.returncode}", local)
        local_grpc_start = time.monotonic()
        local_grpc = subprocess.run([psflow, "local", "--ps=1", "--workers=2", "--transport=grpc"] + common[:3] +
                                    ["--log_every=1000"], cwd=SOURCE, env=cluster.env, capture_output=True,
                                    text=True, timeout=300)
        local_grpc_secs = time.monotonic() - local_grpc_start
        check(local_grpc.returncode == 0, f"psflow local --transport=grpc exited {local_grpc.returncode}", local_grpc)
        print(f"wall time, mlp {args.train_steps} steps, 1 ps + 2 workers: srun (gRPC) {slurm_secs:.1f} s; "
              f"psflow local (shm) {local_secs:.1f} s; psflow local --transport=grpc {local_grpc_secs:.1f} s",
              flush=True)
        ok = True
    finally:
        cluster.stop()
        if ok:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"daemon logs kept in {root}", flush=True)
    print("slurm_test: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
