#!/usr/bin/python3
"""What a recommendation engineer porting their own DLRM tripped on (issue 27.8), each kept fixed,
with real processes and real PyTorch (Debian's /usr/bin/python3 and python3-torch):

- psflow.DistributedBatchSampler (through a DataLoader) and sess.batches together in async mode:
  the two workers' batches are disjoint (the read-ahead used to give worker 1 worker 0's next ones);

  /usr/bin/python3 tests/dlrm_port_test.py --build build [unittest args]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import unittest

PYTHON = "/usr/bin/python3"
ARGS = None
TIMEOUT = 240  # bound of every run here; reaching it is a hang

# A table model over a Dataset of example indices, drawn by DistributedBatchSampler through a
# DataLoader and wrapped by sess.batches; each worker prints the examples of each of its batches.
SAMPLER_SCRIPT = r'''
import os
import sys
import time
import torch
import torch.nn as nn
import psflow
flags = psflow.parse_flags(sys.argv[1:], defaults={"batch_size": 16, "optimizer": "sgd", "learning_rate": 0.1})
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = psflow.torch.EmbeddingBag(100, 4, mode="sum")
        self.out = nn.Linear(4, 1)
    def forward(self, x):
        return self.out(self.emb(x % 100, torch.arange(len(x)))).squeeze(1)
model = Model()
dataset = torch.utils.data.TensorDataset(torch.arange(4096))
opened = flags.unparsed[0].split("=", 1)[1] + "/worker1_opened"  # --opened_dir=DIR
with psflow.WorkerSession(model, flags) as sess:
    # Both workers start at global step 0: the chief waits until worker 1 has opened.
    if sess.worker_index == 1:
        open(opened, "w").close()
    while not os.path.exists(opened):
        time.sleep(0.01)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=psflow.DistributedBatchSampler(dataset, sess))
    for (x,) in sess.batches(loader, lambda b: {model.emb: b[0] % 100}):
        print(f"BATCH {sess.worker_index} " + " ".join(str(int(i)) for i in x), flush=True)
        loss = (model(x) - 1).pow(2).mean()
        loss.backward()
        sess.step(loss.item())
'''


class DlrmPortTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psflow_dlrm_port_test_")

    def script(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def local(self, script, *flags, workers=2, script_args=()):
        cmd = [os.path.join(ARGS.build, "psflow"), "local", "--ps=1", f"--workers={workers}"] + list(flags) + \
              ["--", PYTHON, script] + list(script_args)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 0, r.stdout[-5000:])
        return r.stdout

    def test_async_sampler_and_batches_give_disjoint_batches(self):
        out = self.local(self.script("sampler.py", SAMPLER_SCRIPT), "--train_steps=60",
                         script_args=[f"--opened_dir={self.dir}"])
        batches = {0: [], 1: []}
        for w, examples in re.findall(r"^\[worker\d\] BATCH (\d) (.*)$", out, re.M):
            batches[int(w)].append([int(i) for i in examples.split()])
        self.assertGreater(len(batches[0]), 0, out[-3000:])
        self.assertGreater(len(batches[1]), 0, out[-3000:])
        # 60 steps of 16 from one epoch of 4096: every example at most once over both workers.
        seen = [i for w in (0, 1) for b in batches[w] for i in b]
        self.assertEqual(len(seen), len(set(seen)), "a batch went to two workers")
        self.assertTrue(all(len(b) == 16 for w in (0, 1) for b in batches[w]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.build = os.path.abspath(ARGS.build)
    unittest.main(argv=[sys.argv[0]] + rest)
