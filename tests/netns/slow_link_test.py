#!/usr/bin/python3
"""A big model over a slow link: vgg19 (38.9M parameters, 156 MB) on two simulated
hosts, 1 ps + 1 worker (the chief), the ps link shaped with tc tbf both ways, every timeout flag at
its default. A call's deadline must follow its bytes, so the chief's 156 MB Initialize, the pulls,
pushes and the final checkpoint all get through: both tasks exit 0 at the target global step, and
the final checkpoint holds every variable with vgg19's 38.9M parameters.

  tests/netns/slow_link_test.py --build build SlowLinkTests.test_vgg19_40mbit   # ~5 min
  tests/netns/slow_link_test.py --build build SlowLinkTests.test_vgg19_1gbit    # ~1 min

Each prints a JSON line of figures: seconds to initialize (start of the tasks to the chief's
"initialized" line), to each global step, and in all. Registered in CTest with the label `slow`
and CONFIGURATIONS slow, so the default suite leaves them out: `ctest -C slow -L slow`.
Exits 77 (skip) where network namespaces cannot be made.
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
STEPS = 2
VGG19_PARAMS = 38_947_914  # 16 conv + 3 dense layers on 32x32x3 (docs/design.md#seed-models), weights and biases
HANG = 1200                # a run not over after this long is hung (killed, reported None)


class SlowLinkTests(unittest.TestCase):
    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix=f"psflow_netns_{self._testMethodName}_")
        self.net = hosts.Network()
        self.psflow = os.path.join(os.path.abspath(ARGS.build), "psflow")

    def tearDown(self):
        self.net.close()

    def vgg19_over(self, rate):
        flags = ["--model=vgg19", f"--train_steps={STEPS}", f"--data_dir={ARGS.data_dir}", "--log_every=1",
                 f"--checkpoint_dir={self.workdir}/ckpt"]
        job = cluster.Job(self.net, self.psflow, self.workdir, 1, 1, flags)
        self.net.shape(job.host("ps:0"), rate)
        start = time.time()
        job.start_all()
        seen = {}
        while time.time() < start + HANG and any(c is None for c in job.poll().values()):
            text = job.text("worker:0")
            if "init" not in seen and re.search(r"initialized \d+ variables", text):
                seen["init"] = time.time() - start
            for m in re.finditer(r"^step (\d+)/", text, re.M):
                seen.setdefault(f"step{m.group(1)}", time.time() - start)
            time.sleep(0.2)
        codes = job.wait_all(max(1, start + HANG - time.time()))
        why = f"exit statuses {codes}; logs in {self.workdir}\n{job.logs_tail()}"
        self.assertEqual(codes, {"ps:0": 0, "worker:0": 0}, why)
        summary = job.summary()
        self.assertEqual(summary["global_step"], STEPS, why)
        self.assertEqual(summary["ps_traffic"][0]["num_params"], VGG19_PARAMS, why)
        ckpt = cluster.read_safetensors(cluster.final_checkpoint(os.path.join(self.workdir, "ckpt")))
        weights = {n: v for n, v in ckpt.items() if "/slot/" not in n}
        params = sum(len(raw) // 4 for _, _, raw in weights.values())
        self.assertEqual(params, VGG19_PARAMS, "parameters in the final checkpoint")
        wall = max(job.exited.values()) - start
        steps = sorted((int(k[4:]), v) for k, v in seen.items() if k.startswith("step"))
        print(json.dumps({"test": self._testMethodName, "rate": rate, "exit_statuses": codes,
                          "global_step": summary["global_step"], "init_secs": round(seen.get("init", -1), 1),
                          "step_seen_at_secs": {s: round(t, 1) for s, t in steps},
                          "train_seconds": round(summary["train_seconds"], 1), "wall_secs": round(wall, 1),
                          "ps_bytes_in_out": [summary["ps_traffic"][0]["bytes_in"], summary["ps_traffic"][0]["bytes_out"]],
                          "loadavg": open("/proc/loadavg").read().split()[:3]}), flush=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def test_vgg19_40mbit(self):
        self.vgg19_over("40mbit")

    def test_vgg19_1gbit(self):
        self.vgg19_over("1gbit")


if __name__ == "__main__":
    cluster.run_tests(__doc__, ARGS)
