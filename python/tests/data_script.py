"""A PyTorch script for test_data.py: a linear regression on a TensorDataset whose first feature is
the example's index, read through DataLoader(batch_sampler=psflow.DistributedBatchSampler(...)),
epoch by epoch. Each worker writes one JSON line per step to --record.i (i its worker index): its
data step, the global step, the epoch and the example indices it trained on.

Own flags: --record=FILE, --examples=M, --crash_at_step=S (the chief exits with status 3 once the
global step reached S and a checkpoint is on disk: a killed job), --save_state=FILE (the chief's final state_dict),
--start_together=DIR (the workers wait for each other after open).
"""
import argparse
import glob
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import psflow
from start_together import start_together

parser = argparse.ArgumentParser()
parser.add_argument("--record", default="")
parser.add_argument("--examples", type=int, default=100)
parser.add_argument("--crash_at_step", type=int, default=0)
parser.add_argument("--save_state", default="")
parser.add_argument("--start_together", default="", help="a directory: every worker waits there for the others "
                    "after open (else a fast chief may finish before a slow-starting worker connects)")
flags = psflow.parse_flags(parser, defaults={"batch_size": 5, "train_steps": 20, "optimizer": "sgd",
                                             "learning_rate": 0.05, "log_every": 1000})
if flags.job_name == "ps":
    psflow.Server.from_flags(flags).join()
    sys.exit(0)

g = torch.Generator().manual_seed(1)
x = torch.cat([torch.arange(flags.examples, dtype=torch.float32)[:, None], torch.randn(flags.examples, 3, generator=g)], 1)
y = x[:, 1:] @ torch.tensor([[1.0], [-2.0], [0.5]])
dataset = TensorDataset(x, y)
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)

with psflow.WorkerSession(model, flags) as sess:
    record = open(f"{flags.record}.{sess.worker_index}", "a") if flags.record else None
    if flags.start_together:
        start_together(flags.start_together, sess)
    sampler = psflow.DistributedBatchSampler(dataset, sess)
    loader = DataLoader(dataset, batch_sampler=sampler)
    while not sess.should_stop():
        epoch, batches = sampler.epoch, len(sampler)
        for xb, yb in loader:
            data_step, step = sess.data_step, sess.global_step
            loss = torch.nn.functional.mse_loss(model(xb[:, 1:]), yb)
            loss.backward()
            sess.step(loss)
            if record:
                record.write(json.dumps({"data_step": data_step, "global_step": step, "epoch": epoch,
                                         "epoch_batches": batches, "indices": xb[:, 0].long().tolist()}) + "\n")
                record.flush()
            # Once a checkpoint is on disk: worker 1 may carry the global step past S before the
            # chief's first save (saves run beside training), and the test resumes from a save.
            if (flags.crash_at_step and sess.is_chief and sess.global_step >= flags.crash_at_step
                    and glob.glob(os.path.join(flags.checkpoint_dir, "model.ckpt-*.safetensors"))):
                os._exit(3)
if flags.save_state and sess.is_chief:
    torch.save(model.state_dict(), flags.save_state)
