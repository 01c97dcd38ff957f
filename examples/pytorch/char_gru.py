#!/usr/bin/python3
"""A character-level GRU language model on psflow: Embedding -> GRU -> Linear with
the output weight tied to the embedding, trained on a corpus this script generates (a
deterministic grammar of English-like sentences, --corpus_chars characters from --corpus_seed),
read through psflow.DistributedBatchSampler; evaluate() reports the validation perplexity.

    python3 examples/pytorch/char_gru.py --train_steps=300               # alone (standalone)
    psflow local --ps=1 --workers=2 --train_steps=600 -- python3 examples/pytorch/char_gru.py
    python3 examples/pytorch/char_gru.py --plain --train_steps=300       # plain PyTorch, no psflow
Own flags: --seq_len, --embed, --hidden, --corpus_chars, --corpus_seed, --plain, --openblas_threads
(after the session opened, OpenBLAS's pool set to N: 0 keeps psflow's; the thread benchmark's
'before the fix' case).
"""
import argparse
import math
import random
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import psflow

SUBJECTS = ["the cat", "a dog", "my neighbour", "the old sailor", "every child", "the parameter server",
            "a quiet river", "the worker", "her brother", "the gradient"]
VERBS = ["sees", "follows", "remembers", "pushes", "pulls", "admires", "ignores", "carries", "writes", "finds"]
OBJECTS = ["the moon", "a red boat", "the last letter", "seven apples", "the checkpoint", "a small bird",
           "the global step", "an open door", "the map", "a warm loaf"]
ENDINGS = [".", ".", ".", "!", "?", " again.", " at dawn.", " by the sea.", " without a word."]


def make_corpus(chars, seed):
    rng = random.Random(seed)
    out, n = [], 0
    while n < chars:
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}"
        s = s[0].upper() + s[1:] + ("\n" if rng.random() < 0.2 else " ")
        out.append(s)
        n += len(s)
    return "".join(out)[:chars]


class Windows(Dataset):
    """Example i: characters [i, i + seq_len) and the next character of each."""

    def __init__(self, ids, seq_len):
        self.ids, self.seq_len = ids, seq_len

    def __len__(self):
        return len(self.ids) - self.seq_len - 1

    def __getitem__(self, i):
        return self.ids[i:i + self.seq_len], self.ids[i + 1:i + self.seq_len + 1]


class CharGru(torch.nn.Module):
    def __init__(self, vocab, embed, hidden):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, embed)
        self.gru = torch.nn.GRU(embed, hidden, batch_first=True)
        self.proj = torch.nn.Linear(hidden, embed)
        self.out_bias = torch.nn.Parameter(torch.zeros(vocab))

    def forward(self, x):
        h, _ = self.gru(self.embed(x))
        return self.proj(h) @ self.embed.weight.t() + self.out_bias  # tied output weight


def main():
    parser = argparse.ArgumentParser(description="character-level GRU language model")
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--embed", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--corpus_chars", type=int, default=200_000)
    parser.add_argument("--corpus_seed", type=int, default=1)
    parser.add_argument("--plain", action="store_true", help="plain PyTorch (torch.optim.Adam), no psflow")
    parser.add_argument("--openblas_threads", type=int, default=0)
    flags = psflow.parse_flags(parser, defaults={"batch_size": 32, "train_steps": 300, "optimizer": "adam",
                                                 "learning_rate": 3e-3, "log_every": 100})
    if flags.job_name == "ps":
        psflow.Server.from_flags(flags).join()
        return
    text = make_corpus(flags.corpus_chars, flags.corpus_seed)
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    cut = int(len(ids) * 0.95)
    train, valid = Windows(ids[:cut], flags.seq_len), ids[cut:]
    torch.manual_seed(flags.seed)
    model = CharGru(len(vocab), flags.embed, flags.hidden)
    loss_fn = torch.nn.CrossEntropyLoss()

    def evaluate():
        with torch.no_grad():
            n = (len(valid) - 1) // flags.seq_len * flags.seq_len
            x = valid[:n].view(-1, flags.seq_len)
            y = valid[1:n + 1].view(-1, flags.seq_len)
            ce = float(loss_fn(model(x).reshape(-1, len(vocab)), y.reshape(-1)))
        return {"validation_cross_entropy": ce, "validation_perplexity": math.exp(ce)}

    if flags.plain:  # the same model and data order, one process, torch.optim
        psflow.threads.set_compute_threads(flags.intra_op_threads)
        if flags.openblas_threads:
            _set_openblas(flags.openblas_threads)
        opt = torch.optim.Adam(model.parameters(), lr=flags.learning_rate)
        sampler = psflow.BatchSampler(len(train), flags.batch_size, 0, 1, flags.seed)
        start = time.monotonic()
        for step in range(flags.train_steps):
            x, y = _batch(train, sampler.batch(step))
            opt.zero_grad()
            loss = loss_fn(model(x).reshape(-1, len(vocab)), y.reshape(-1))
            loss.backward()
            opt.step()
        seconds = time.monotonic() - start
        print(f"plain: steps={flags.train_steps} train_seconds={seconds:.2f} steps_per_sec={flags.train_steps / seconds:.1f} "
              + " ".join(f"{k}={v:.4f}" for k, v in evaluate().items()))
        return
    with psflow.WorkerSession(model, flags, evaluate=evaluate, model_name="char_gru") as sess:
        if flags.openblas_threads:
            _set_openblas(flags.openblas_threads)
        loader = DataLoader(train, batch_sampler=psflow.DistributedBatchSampler(train, sess))
        while not sess.should_stop():
            for x, y in loader:
                loss = loss_fn(model(x).reshape(-1, len(vocab)), y.reshape(-1))
                loss.backward()
                sess.step(loss)


def _batch(ds, idx):
    xs, ys = zip(*(ds[int(i)] for i in idx))
    return torch.stack(xs), torch.stack(ys)


def _set_openblas(n):
    import ctypes
    from psflow.threads import _loaded_openblas
    for path in _loaded_openblas():
        ctypes.CDLL(path).openblas_set_num_threads(n)


if __name__ == "__main__":
    sys.exit(main())
