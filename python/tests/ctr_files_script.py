"""A PyTorch script for test_ctr_files.py: a tiny CTR model (one psflow.torch.EmbeddingBag on the
first field, a linear layer on the dense features) trained on --train_files through
psflow.data.CtrFiles and sess.batches. Each worker writes one JSON line per step to --record.i (i
its worker index): the global step before the step, the batch's labels and its first field's ids.
At the end each worker prints "ctr_files_script: worker W read N examples in K slices".

Own flags: --record=FILE, --start_together=DIR (the workers wait for each other after open).
"""
import argparse
import json
import sys

import torch

import psflow
from start_together import start_together

parser = argparse.ArgumentParser()
parser.add_argument("--record", default="")
parser.add_argument("--start_together", default="")
flags = psflow.parse_flags(parser, defaults={"batch_size": 16, "optimizer": "sgd", "learning_rate": 0.05,
                                             "log_every": 1000, "ctr_fields": 4})
if flags.job_name == "ps":
    psflow.Server.from_flags(flags).join()
    sys.exit(0)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = psflow.torch.EmbeddingBag(None, 2, mode="sum", seed=flags.seed)
        self.linear = torch.nn.Linear(13 + 2, 1)

    def forward(self, ids, dense):
        rows = self.table(ids[:, 0], torch.arange(ids.shape[0], dtype=torch.int64))
        return self.linear(torch.cat([dense, rows], 1)).squeeze(1)


torch.manual_seed(0)
model = Tiny()
with psflow.WorkerSession(model, flags) as sess:
    record = open(f"{flags.record}.{sess.worker_index}", "a") if flags.record else None
    if flags.start_together:
        start_together(flags.start_together, sess)
    files = psflow.data.CtrFiles(flags.train_files, sess)
    for ids, dense, labels in sess.batches(files, lambda b: {model.table: b[0][:, 0]}):
        step = sess.global_step
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids, dense), labels)
        loss.backward()
        sess.step(loss)
        if record:
            record.write(json.dumps({"global_step": step, "labels": labels.long().tolist(),
                                     "ids": ids[:, 0].tolist()}) + "\n")
            record.flush()
    print(f"ctr_files_script: worker {sess.worker_index} read {files.examples_read} examples in "
          f"{files.slices_read} slices, {files.epochs_begun} epoch(s), {files.bad_lines} bad lines", flush=True)
