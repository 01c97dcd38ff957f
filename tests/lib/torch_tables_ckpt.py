#!/usr/bin/python3
"""The PyTorch job of tests/pytorch_tables_checkpoint_test.py: a small ctr model with one table of
each kind on the ps tasks, checkpointed by the chief (--checkpoint_dir).

Model: a dynamic psflow.torch.EmbeddingBag "dyn" (mode sum, raw int64 ids), a fixed
psflow.torch.Embedding "fixed" [FIXED_ROWS, dim] (ids mod FIXED_ROWS, partition_strategy "mod"),
and a Linear over [dense, dyn, fixed] -> logit; BCE loss, adagrad on the tables, adam on the
Linear. Data: psflow.CtrGenerator (2 fields), global batch `global step` of stream 0 sliced by
worker index (sync: R workers x B equal one worker x R*B, and a resumed job sees the batches an
uninterrupted one would).

--check: trains nothing. Before opening the session it reads the newest checkpoint of
--checkpoint_dir with psflow.read_checkpoint (the file, through the C++ reader); after the open
(the chief restored that checkpoint onto however many ps tasks this job has) it looks every saved
row up through the modules (pulled from the ps tasks) and prints
"CHECK table NAME rows N max_abs_diff D" per table, then "UNSEEN id ROW" for dynamic ids the
checkpoint lacks (the ps's initial rows, as JSON lists). Exit 0; the test compares D with 0.

  psflow local --sync_replicas --checkpoint_dir=D -- python3 torch_tables_ckpt.py [--check] [--dyn_dim=4]
"""
import argparse
import json
import sys

import torch
import torch.nn as nn

import psflow

FIELDS, DENSE, FIXED_ROWS = 2, 5, 500
UNSEEN = [-12345, -1, 2**62 + 7]  # dynamic ids no batch has (the generator's are >= 0 and small)


class Model(nn.Module):
    def __init__(self, dyn_dim, fixed_dim):
        super().__init__()
        self.dyn = psflow.torch.EmbeddingBag(None, dyn_dim, mode="sum", name="dyn", seed=3,
                                             initializer="uniform:-0.1:0.1")
        self.fixed = psflow.torch.Embedding(FIXED_ROWS, fixed_dim, name="fixed", seed=4, partition_strategy="mod")
        self.linear = nn.Linear(DENSE + dyn_dim + fixed_dim, 1)

    def forward(self, ids, dense):
        offsets = torch.arange(ids.shape[0], dtype=torch.int64)
        d = self.dyn(ids[:, 0].contiguous(), offsets)
        f = self.fixed(ids[:, 1] % FIXED_ROWS)
        return self.linear(torch.cat([dense, d, f], dim=1)).squeeze(1)


def check(model, flags):
    saved = psflow.read_checkpoint(flags.checkpoint_dir)
    expected = {"dyn": (saved["dyn/ids"], saved["dyn"]),
                "fixed": (torch.arange(FIXED_ROWS, dtype=torch.int64), saved["fixed"])}
    with psflow.WorkerSession(model, flags) as sess:
        if not sess.is_chief:
            return
        with torch.no_grad():
            for name, (ids, rows) in expected.items():
                if name == "dyn":  # one id per bag: the bag sums are the rows
                    got = model.dyn(ids, torch.arange(ids.shape[0], dtype=torch.int64))
                else:
                    got = model.fixed(ids)
                diff = (got - rows).abs().max().item() if len(ids) else 0.0
                print(f"CHECK table {name} rows {len(ids)} max_abs_diff {diff}", flush=True)
            unseen = torch.tensor(UNSEEN, dtype=torch.int64)
            assert not torch.isin(unseen, saved["dyn/ids"]).any()
            for i, row in zip(UNSEEN, model.dyn(unseen, torch.arange(len(UNSEEN)))):
                print(f"UNSEEN {i} {json.dumps(row.tolist())}", flush=True)


def train(model, flags):
    gen = psflow.CtrGenerator(seed=7, num_fields=FIELDS, num_dense=DENSE)
    with psflow.WorkerSession(model, flags) as sess:
        while not sess.should_stop():
            r, w, b = sess.num_workers, sess.worker_index, flags.batch_size
            ids, dense, labels = (torch.from_numpy(a[w * b:(w + 1) * b]) for a in gen.batch(sess.data_step, b * r, 0))
            loss = nn.functional.binary_cross_entropy_with_logits(model(ids, dense), labels)
            loss.backward()
            sess.step(loss.item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--dyn_dim", type=int, default=4)
    ap.add_argument("--fixed_dim", type=int, default=3)
    flags = psflow.parse_flags(ap, defaults={"optimizer": "adam", "learning_rate": 0.01, "batch_size": 64,
                                             "sparse_optimizer": "adagrad", "sparse_learning_rate": 0.5})
    if flags.job_name == "ps":
        psflow.Server.from_flags(flags).join()
        return
    torch.manual_seed(1)
    model = Model(flags.dyn_dim, flags.fixed_dim)
    (check if flags.check else train)(model, flags)


if __name__ == "__main__":
    try:
        main()
    except psflow.Error as e:  # one line, as the scripts of examples/pytorch/ report them
        print(f"psflow: error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
