#!/usr/bin/python3
"""Stalls and partitions on simulated hosts: each ps and worker task runs in its own
network namespace (tests/netns/hosts.py), talks over a bridge on 10.231.0.0/24, and the test
downs links or freezes (SIGSTOP) tasks in the middle of training. Real psflow processes, real gRPC,
real MNIST. Every case asserts the exit status of every task, the final global step, and test
accuracy; the frozen-ps sync case also that the final parameters equal an undisturbed run's.

  tests/netns/stalls_test.py --build build [StallTests.test_ps_link_down_async ...]

One CTest entry per test method (tests/CMakeLists.txt). Exits 77 (CTest SKIP) with the reason
where network namespaces cannot be made. Each case prints one JSON line of figures (stall
length, exit statuses, steps lost, time from failure to the last task's exit); PSFLOW_NETNS_KEEP=1
keeps the work directories (logs, checkpoints) of passing runs too.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402
import hosts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = argparse.Namespace(build=os.path.join(ROOT, "build"), data_dir=os.path.join(ROOT, "data/mnist"))

RPC_TIMEOUT = 2      # --rpc_timeout_secs: a stall longer than this makes calls miss their deadline
PS_TIMEOUT = 30      # --ps_timeout_secs: stalls shorter than this must cost only time
STALL = 8            # seconds a link is down or a task frozen (RPC_TIMEOUT < STALL < PS_TIMEOUT)
HANG = 150           # a job not over this long after its start is hung (killed, reported None)
STEPS = 1200
MIN_ACCURACY = 0.94  # mlp, 1200 global steps of 100: undisturbed runs reach 0.96-0.97


def mlp_flags(workdir, sync, extra=(), steps=STEPS):
    flags = ["--model=mlp", f"--train_steps={steps}", "--batch_size=100", f"--data_dir={ARGS.data_dir}",
             "--log_every=10", f"--rpc_timeout_secs={RPC_TIMEOUT}", f"--ps_timeout_secs={PS_TIMEOUT}",
             "--init_timeout_secs=60", "--seed=7", f"--checkpoint_dir={workdir}/ckpt"]
    if sync:
        flags.append("--sync_replicas")
    return flags + list(extra)


def restored_steps(job):
    """Steps a rollback cost: (step reached) - (step restored to), summed over the chief's restores."""
    lost = 0
    text = job.text("worker:0")
    for m in re.finditer(r"restor\w* .*?step (\d+)", text):
        reached = max([int(s) for s in re.findall(r"step (\d+)/", text[:m.start()])] or [0])
        lost += max(0, reached - int(m.group(1)))
    return lost


def longest_silence(job):
    """The longest silence a worker reported ("answered again after S s of silence"), or None."""
    found = [float(m) for t in job.tasks if t.startswith("worker")
             for m in re.findall(r"answered again after ([\d.]+) s of silence", job.text(t))]
    return round(max(found), 1) if found else None


class StallTests(unittest.TestCase):
    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix=f"psflow_netns_{self._testMethodName}_")
        self.net = hosts.Network()
        self.psflow = os.path.join(os.path.abspath(ARGS.build), "psflow")

    def tearDown(self):
        self.net.close()

    def run(self, result=None):
        # Keeps the work directory (logs, checkpoints) of a failed case, or of all with PSFLOW_NETNS_KEEP=1.
        result = result if result is not None else self.defaultTestResult()
        before = len(result.failures) + len(result.errors)
        super().run(result)
        if os.environ.get("PSFLOW_NETNS_KEEP") or len(result.failures) + len(result.errors) > before:
            print(f"logs kept in {self.workdir}", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return result

    def job(self, num_ps, num_workers, flags, **kw):
        return cluster.Job(self.net, self.psflow, self.workdir, num_ps, num_workers, flags, **kw)

    def report(self, job=None, **figures):
        if job is not None:
            figures["longest_silence_secs"] = longest_silence(job)
        print(json.dumps({"test": self._testMethodName, **figures}), flush=True)

    def assert_finished(self, job, codes, steps=STEPS, min_accuracy=MIN_ACCURACY):
        why = f"exit statuses {codes}\n{job.logs_tail()}"
        self.assertEqual(codes, {t: 0 for t in job.tasks}, why)
        summary = job.summary()
        self.assertEqual(summary["global_step"], steps, why)
        self.assertGreaterEqual(summary["test_accuracy"], min_accuracy, why)
        return summary

    # --- a link down for longer than --rpc_timeout_secs, shorter than --ps_timeout_secs ---

    def ps_link_down(self, sync):
        job = self.job(1, 2, mlp_flags(self.workdir, sync, ["--sync_timeout_secs=5"]))
        job.start_all()
        self.assertTrue(job.wait_for_step(200), job.logs_tail())
        down_at_step = job.latest_step()
        self.net.link_down(job.host("ps:0"))
        time.sleep(STALL)
        self.net.link_up(job.host("ps:0"))
        codes = job.wait_all(HANG)
        summary = self.assert_finished(job, codes)
        self.report(job, mode="sync" if sync else "async", stall_secs=STALL, stalled="ps:0 link", down_at_step=down_at_step,
                    exit_statuses=codes, global_step=summary["global_step"], steps_lost=restored_steps(job),
                    test_accuracy=summary["test_accuracy"], stale_gradients_dropped=summary["stale_gradients_dropped"])

    def test_ps_link_down_async(self):
        self.ps_link_down(sync=False)

    def test_ps_link_down_sync(self):
        self.ps_link_down(sync=True)

    # --- a ps frozen past the RPC deadline, then resumed; 2 ps, variables split across both ---

    def ps_frozen(self, sync, workdir=None, freeze=True):
        # The quorum timeout is above the stall: an undisturbed sync run and a frozen one must then
        # apply exactly the same gradients, so a push counted twice (or lost) changes the parameters.
        workdir = workdir or self.workdir
        flags = mlp_flags(workdir, sync, ["--partitioner=fixed:2", "--placement=greedy", "--sync_timeout_secs=60"])
        job = cluster.Job(self.net, self.psflow, workdir, 2, 2, flags)
        job.start_all()
        self.assertTrue(job.wait_for_step(200), job.logs_tail())
        frozen_at_step = job.latest_step()
        if freeze:
            hosts.freeze(job.procs["ps:0"])
            time.sleep(STALL)
            hosts.thaw(job.procs["ps:0"])
        codes = job.wait_all(HANG)
        summary = self.assert_finished(job, codes)
        if freeze:
            self.report(job, mode="sync" if sync else "async", stall_secs=STALL, stalled="ps:0 SIGSTOP",
                        frozen_at_step=frozen_at_step, exit_statuses=codes, global_step=summary["global_step"],
                        steps_lost=restored_steps(job), test_accuracy=summary["test_accuracy"],
                        stale_gradients_dropped=summary["stale_gradients_dropped"])
        return summary

    def test_ps_frozen_async(self):
        self.ps_frozen(sync=False)

    def test_ps_frozen_sync(self):
        frozen = self.ps_frozen(sync=True)
        undisturbed_dir = os.path.join(self.workdir, "undisturbed")
        os.makedirs(undisturbed_dir)
        undisturbed = self.ps_frozen(sync=True, workdir=undisturbed_dir, freeze=False)
        a = cluster.read_safetensors(cluster.final_checkpoint(os.path.join(self.workdir, "ckpt")))
        b = cluster.read_safetensors(cluster.final_checkpoint(os.path.join(undisturbed_dir, "ckpt")))
        self.assertEqual(sorted(a), sorted(b))
        differ = [name for name in a if a[name] != b[name]]
        self.assertEqual(differ, [], "variables that differ from the undisturbed sync run's")
        self.assertEqual(frozen["test_accuracy"], undisturbed["test_accuracy"])

    # --- a worker cut off in sync mode: out of the quorum after --sync_timeout_secs, then back ---

    def test_worker_cut_off_sync(self):
        sync_timeout = 3
        job = self.job(1, 2, mlp_flags(self.workdir, True, [f"--sync_timeout_secs={sync_timeout}"]))
        job.start_all()
        self.assertTrue(job.wait_for_step(200), job.logs_tail())
        cut_at_step = job.latest_step()
        # Worker 0 trains on alone meanwhile; its link is slowed to 8 Mbit/s (~3 steps/s) until
        # worker 1 is back, so that the job is still running then however fast this machine is.
        self.net.shape(job.host("worker:0"), "8mbit")
        self.net.link_down(job.host("worker:1"))
        time.sleep(STALL)
        ps_log_at_return = len(job.text("ps:0"))
        w1_log_at_return = len(job.text("worker:1"))
        self.net.link_up(job.host("worker:1"))
        deadline = time.time() + HANG
        while (time.time() < deadline and not re.search(r"step \d+/", job.text("worker:1")[w1_log_at_return:])
               and all(c is None for c in job.poll().values())):
            time.sleep(0.1)
        self.net.unshape(job.host("worker:0"))
        codes = job.wait_all(max(1, deadline - time.time()))
        summary = self.assert_finished(job, codes)
        ps_log, w1_log = job.text("ps:0"), job.text("worker:1")
        # Dropped from the quorum while cut off (the ps says so, naming worker 1) ...
        dropped = re.findall(r"missing worker\(s\) 1\b", ps_log[:ps_log_at_return])
        self.assertTrue(dropped, f"the ps never left worker 1 out of the quorum\n{job.logs_tail()}")
        # ... and back: worker 1 trains again after its link returns (it logs steps after it).
        self.assertRegex(w1_log[w1_log_at_return:], r"step \d+/", f"worker 1 did not train after its link returned\n{job.logs_tail()}")
        later_drops = re.findall(r"missing worker\(s\) 1\b", ps_log[ps_log_at_return:])
        self.report(job, mode="sync", stall_secs=STALL, stalled="worker:1 link", cut_at_step=cut_at_step,
                    sync_timeout_secs=sync_timeout, quorum_timeouts_while_cut=len(dropped),
                    quorum_timeouts_after_return=len(later_drops), exit_statuses=codes,
                    global_step=summary["global_step"], steps_lost=restored_steps(job),
                    test_accuracy=summary["test_accuracy"], stale_gradients_dropped=summary["stale_gradients_dropped"],
                    worker1_local_steps=int((re.findall(r"done after (\d+) local steps", w1_log) or ["-1"])[-1]))

    # --- a link down for longer than --ps_timeout_secs: the job fails, every task, in bounded time ---

    def test_ps_link_down_past_bound(self):
        ps_timeout, worker_timeout = 10, 40
        flags = mlp_flags(self.workdir, False, ["--ps_timeout_secs=%d" % ps_timeout,
                                                "--worker_timeout_secs=%d" % worker_timeout])
        flags = [f for f in flags if not f.startswith(f"--ps_timeout_secs={PS_TIMEOUT}")]
        job = self.job(1, 2, flags)
        job.start_all()
        self.assertTrue(job.wait_for_step(200), job.logs_tail())
        self.net.link_down(job.host("ps:0"))
        down = time.time()
        # Down for 1.5 bounds, then back: the workers give up after --ps_timeout_secs; the chief
        # retries its abort for up to the same bound, and the ps takes it once the link returns
        # (docs/failures.md): gRPC keepalive replaces the dead connection, whose TCP retransmission
        # back-off used to hide the returned link (then the ps took the abort in 2 runs of 4 and
        # lingered until --worker_timeout_secs). 40 s here only bounds a regression.
        while time.time() < down + 1.5 * ps_timeout:
            time.sleep(0.1)
            job.poll()
        self.net.link_up(job.host("ps:0"))
        up = time.time()
        codes = job.wait_all(HANG)
        exit_after = {t: round(job.exited[t] - down, 1) for t in job.exited}
        ps_log = job.text("ps:0")
        self.report(job, stalled="ps:0 link", stall_secs=round(up - down, 1), ps_timeout_secs=ps_timeout,
                    rpc_timeout_secs=RPC_TIMEOUT, worker_timeout_secs=worker_timeout, exit_statuses=codes,
                    ps_took_the_abort="aborted the job" in ps_log, secs_from_link_down_to_exit=exit_after,
                    secs_to_last_exit=max(exit_after.values()) if exit_after else None,
                    secs_from_first_to_last_exit=round(max(exit_after.values()) - min(exit_after.values()), 1)
                    if exit_after else None)
        why = f"exit statuses {codes}\n{job.logs_tail()}"
        self.assertNotIn(None, codes.values(), "hung tasks (killed after %d s)\n%s" % (HANG, why))
        for t, c in codes.items():
            self.assertNotEqual(c, 0, f"{t} exited 0 though the job failed\n{why}")
        self.assertIn("aborted the job", ps_log, f"the ps did not take the chief's abort\n{why}")
        for t in ("worker:0", "worker:1"):
            self.assertRegex(job.text(t), r"ps task 0 \(10\.231\.0\.\d+:\d+\)", f"{t} does not name the silent ps\n{why}")


class AuthTests(unittest.TestCase):
    """The non-loopback rules on simulated hosts: a ps refuses to listen on 10.231... without a
    secret or --insecure; with either, a short job trains."""

    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix="psflow_netns_auth_")
        self.net = hosts.Network()
        self.psflow = os.path.join(os.path.abspath(ARGS.build), "psflow")

    def tearDown(self):
        self.net.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def flags(self):
        return ["--model=mlp", "--train_steps=300", "--batch_size=100", f"--data_dir={ARGS.data_dir}",
                "--log_every=50", "--rpc_timeout_secs=5", "--init_timeout_secs=60"]

    def test_no_secret_refused(self):
        job = cluster.Job(self.net, self.psflow, self.workdir, 1, 1, self.flags(), auth="none")
        job.start("ps:0")
        codes = job.wait_all(30)
        self.assertNotIn(codes["ps:0"], (0, None), job.logs_tail())
        lines = job.text("ps:0").strip().splitlines()
        self.assertEqual(len(lines), 1, job.text("ps:0"))
        self.assertRegex(lines[0], r"^psflow: error: refusing to listen on non-loopback address 10\.231\.0\.\d+:2222 "
                                   r"without authentication: pass --cluster_secret_file=FILE .*or --insecure")

    def trains(self, auth):
        job = cluster.Job(self.net, self.psflow, self.workdir, 1, 2, self.flags(), auth=auth)
        job.start_all()
        codes = job.wait_all(HANG)
        self.assertEqual(codes, {t: 0 for t in job.tasks}, job.logs_tail())
        summary = job.summary()
        self.assertEqual(summary["global_step"], 300)
        self.assertGreaterEqual(summary["test_accuracy"], 0.88)  # mlp after 300 steps of 100: ~0.93

    def test_secret_trains(self):
        self.trains("secret")

    def test_insecure_trains(self):
        self.trains("insecure")


if __name__ == "__main__":
    cluster.run_tests(__doc__, ARGS)
