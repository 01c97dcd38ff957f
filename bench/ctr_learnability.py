#!/usr/bin/python3
"""How far below the Bayes AUC a model of the synthetic CTR data (psflow.CtrGenerator) must stay
after a given number of examples, independently of psflow (docs/tables.md, "The ctr model against
Bayes"):

  oracle   the AUC of the teacher's own logit when only the embeddings of ids of rank <= R are known
           (the others replaced by their mean, 0): what a model that learned the R most frequent ids
           of every field perfectly, and nothing of the rest, would score;
  fm       a factorization machine (the teacher's own form: w.x + sum_{f<g} <E_f, E_g>, dim 16) in
           plain PyTorch, Adam, one dense embedding per field, trained on the generator's stream:
           the test AUC after 1/4, 1/2, 3/4 and all of --steps batches of 1024.

  bench/ctr_learnability.py oracle [--vocab_cap N] [--test 20000]
  bench/ctr_learnability.py fm --vocab_cap 1000 [--steps 4000] [--lr 3e-3] [--init_std 0.15]
--vocab_cap caps the default (Criteo) vocabulary sizes; the fm needs a cap (it holds every id).
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "build", "python"))
import psflow  # noqa: E402

CRITEO = [1460, 583, 10**6, 10**6, 305, 24, 12517, 633, 3, 93145, 5683, 10**6, 3194, 27, 14992, 10**6, 10, 5652,
          2173, 4, 10**6, 18, 15, 286181, 105, 142572]


def auc(score, labels):
    order = np.argsort(score, kind="stable")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    pos = labels > 0.5
    return (ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum())


def oracle(gen, n):
    test = gen.test_set(n)
    ids, dense, labels = test["ids"], test["dense"], test["labels"]
    fields = ids.shape[1]
    emb = np.stack([np.stack([gen.teacher_embedding(f, int(i)) for f, i in enumerate(row)]) for row in ids])

    def logits(known):
        e = emb * known[:, :, None]
        s = e.sum(1)
        return gen.bias + dense @ np.asarray(gen.dense_weights) + 0.5 * ((s * s).sum(1) - (e * e).sum((1, 2)))

    print(f"all ids known (Bayes): AUC {auc(logits(np.ones(ids.shape)), labels):.4f}")
    for cutoff in (100, 1000, 10000, 100000):
        known = np.zeros(ids.shape)
        for f in range(fields):
            head = {gen.id_of_rank(f, r) for r in range(1, min(cutoff, gen.vocab_sizes[f]) + 1)}
            known[:, f] = [int(i) in head for i in ids[:, f]]
        print(f"ranks <= {cutoff:>6} known ({known.mean():.1%} of test ids): AUC {auc(logits(known), labels):.4f}")


def fm(gen, args):
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    fields, dim = gen.num_fields, 16
    rank_of = [{gen.id_of_rank(f, r): r - 1 for r in range(1, gen.vocab_sizes[f] + 1)} for f in range(fields)]

    def index(ids):
        return torch.from_numpy(np.array([[rank_of[f][int(i)] for f, i in enumerate(row)] for row in ids]))

    tables = torch.nn.ModuleList(torch.nn.Embedding(v, dim) for v in gen.vocab_sizes)
    for t in tables:
        torch.nn.init.normal_(t.weight, 0, args.init_std)
    linear = torch.nn.Linear(gen.num_dense, 1)

    def forward(ix, x):
        e = torch.stack([tables[f](ix[:, f]) for f in range(fields)], 1)
        s = e.sum(1)
        return linear(x).squeeze(1) + 0.5 * ((s * s).sum(1) - (e * e).sum((1, 2)))

    opt = torch.optim.Adam(list(tables.parameters()) + list(linear.parameters()), lr=args.lr)
    test = gen.test_set(65536)
    test_ix, test_x = index(test["ids"]), torch.from_numpy(test["dense"])
    bayes = gen.bayes_metrics(65536)["auc"]
    start = time.time()
    for step in range(args.steps):
        ids, dense, labels = gen.batch(step, 1024)[:3]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            forward(index(ids), torch.as_tensor(dense)), torch.as_tensor(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % max(1, args.steps // 4) == 0:
            with torch.no_grad():
                score = forward(test_ix, test_x).numpy()
            print(f"step {step + 1}: test AUC {auc(score, test['labels']):.4f} (Bayes {bayes:.4f}), "
                  f"{time.time() - start:.0f} s", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["oracle", "fm"])
    p.add_argument("--vocab_cap", type=int, default=0, help="cap every field's vocabulary (0: Criteo's as is)")
    p.add_argument("--interaction_std", type=float, default=1.0)
    p.add_argument("--test", type=int, default=20000, help="oracle: test examples")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--init_std", type=float, default=0.15)
    args = p.parse_args()
    vocab = [min(v, args.vocab_cap) for v in CRITEO] if args.vocab_cap else CRITEO
    gen = psflow.CtrGenerator(seed=0, vocab_sizes=vocab, interaction_std=args.interaction_std)
    if args.what == "oracle":
        oracle(gen, args.test)
    elif not args.vocab_cap or args.vocab_cap > 100000:
        raise SystemExit("ctr_learnability.py: fm holds every id: give --vocab_cap of at most 100000")
    else:
        fm(gen, args)


if __name__ == "__main__":
    main()
