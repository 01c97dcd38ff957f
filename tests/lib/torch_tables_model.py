#!/usr/bin/python3
"""The small ctr model of tests/pytorch_tables_test.py, written twice: with psflow.torch.EmbeddingBag
on psflow (`--mode=psflow`, run by `psflow local -- ...`) and with torch.nn.EmbeddingBag(sparse=True)
+ torch.optim.Adagrad in one plain process (`--mode=plain`). 3 fields of fixed [N, 8] tables (ids mod
N), bag sum, [dense, embeddings] -> Linear -> logit, BCE; tables adagrad (TF's: accumulators from
0.1; torch's initial_accumulator_value=0.1 and eps=0 make it the same rule), dense layers SGD.
psflow mode saves the tables' initial rows (read through the modules before the first step) and the
final values (dense parameters and every row) to --out; plain mode starts from those initial rows
and saves its final values to --out.

  psflow local --sync_replicas -- python3 torch_tables_model.py --mode=psflow --out=a.npz [psflow flags]
  python3 torch_tables_model.py --mode=plain --init=a.npz --out=b.npz --steps=50 --batch=64
"""
import argparse
import sys

import numpy as np
import torch
import torch.nn as nn

import psflow

FIELDS, DENSE, DIM, VOCAB = 3, 13, 8, 1000
SPARSE_LR, DENSE_LR = 0.3, 0.1


class Model(nn.Module):
    def __init__(self, plain):
        super().__init__()
        self.linear = nn.Linear(DENSE + FIELDS * DIM, 1)  # first: nn.EmbeddingBag's init draws from the RNG
        if plain:
            self.tables = nn.ModuleList(nn.EmbeddingBag(VOCAB, DIM, mode="sum", sparse=True) for _ in range(FIELDS))
        else:
            self.tables = nn.ModuleList(psflow.torch.EmbeddingBag(VOCAB, DIM, mode="sum", seed=f,
                                                                  initializer="normal:0:0.1")
                                        for f in range(FIELDS))

    def forward(self, ids, dense):
        ids = ids % VOCAB
        offsets = torch.arange(ids.shape[0], dtype=torch.int64)
        e = [t(ids[:, f].contiguous(), offsets) for f, t in enumerate(self.tables)]
        return self.linear(torch.cat([dense] + e, dim=1)).squeeze(1)


def all_rows(model):
    with torch.no_grad():
        every = torch.arange(VOCAB, dtype=torch.int64)
        return [t(every, every).numpy().copy() for t in model.tables]  # one id per bag: the rows


def values(model):
    out = {f"dense_{n}": p.detach().numpy().copy() for n, p in model.linear.named_parameters()}
    for f, rows in enumerate(all_rows(model)):
        out[f"table_{f}"] = rows
    return out


def psflow_main(args, argv):
    flags = psflow.parse_flags(argv, defaults={"optimizer": "sgd", "learning_rate": DENSE_LR,
                                               "sparse_optimizer": "adagrad", "sparse_learning_rate": SPARSE_LR})
    if flags.job_name == "ps":
        psflow.Server.from_flags(flags).join()
        return
    torch.manual_seed(1)
    gen = psflow.CtrGenerator(seed=5, num_fields=FIELDS, num_dense=DENSE)
    model = Model(plain=False)
    saved = {}
    with psflow.WorkerSession(model, flags, evaluate=lambda: saved.update(values(model)) or {}) as sess:
        if sess.is_chief:
            init = {f"table_{f}": rows for f, rows in enumerate(all_rows(model))}
        while not sess.should_stop():
            r, w, b = sess.num_workers, sess.worker_index, flags.batch_size
            ids, dense, labels = (torch.from_numpy(a[w * b:(w + 1) * b]) for a in gen.batch(sess.data_step, b * r, 0))
            loss = nn.functional.binary_cross_entropy_with_logits(model(ids, dense), labels)
            loss.backward()
            sess.step(loss.item())
    if sess.is_chief:
        np.savez(args.out, **saved, **{f"init_{k}": v for k, v in init.items()})


def plain_main(args):
    torch.manual_seed(1)
    gen = psflow.CtrGenerator(seed=5, num_fields=FIELDS, num_dense=DENSE)
    model = Model(plain=True)
    init = np.load(args.init)
    with torch.no_grad():
        for f, t in enumerate(model.tables):
            t.weight.copy_(torch.from_numpy(init[f"init_table_{f}"]))
    opt_s = torch.optim.Adagrad(model.tables.parameters(), lr=SPARSE_LR, initial_accumulator_value=0.1, eps=0.0)
    opt_d = torch.optim.SGD(model.linear.parameters(), lr=DENSE_LR)
    for step in range(args.steps):
        ids, dense, labels = (torch.from_numpy(a) for a in gen.batch(step, args.batch, 0))
        loss = nn.functional.binary_cross_entropy_with_logits(model(ids, dense), labels)
        opt_s.zero_grad()
        opt_d.zero_grad()
        loss.backward()
        opt_s.step()
        opt_d.step()
    out = {f"dense_{n}": p.detach().numpy() for n, p in model.linear.named_parameters()}
    for f, t in enumerate(model.tables):
        out[f"table_{f}"] = t.weight.detach().numpy()
    np.savez(args.out, **out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("psflow", "plain"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--init")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64)
    args, rest = ap.parse_known_args()
    if args.mode == "plain":
        plain_main(args)
    else:
        psflow_main(args, rest)
    sys.exit(0)
