#!/usr/bin/python3
"""A sparse model on psflow: nn.Embedding(sparse=True), whose gradient touches only the rows a
batch looked up — psflow pushes just those rows (row-sparse) and the ps updates just those.

The model is a bag of pixel features: each lit pixel of an MNIST image becomes the feature
(pixel position, brightness level) — 784 x 3 ids, plus id 0 for padding — each with a learned
64-dimensional embedding; an image is the mean of its features' embeddings, followed by ReLU and
a linear layer to the 10 classes. Adagrad 1.0, batch 100, 3000 global steps.

    psflow local --ps=2 --workers=2 -- python3 examples/pytorch/sparse_embedding.py
"""
import sys

import torch
import torch.nn as nn

import psflow

MODEL_NAME = "sparse_embedding"  # the summary's "model" and the checkpoints' metadata
DEFAULTS = {"batch_size": 100, "optimizer": "adagrad", "learning_rate": 1.0, "train_steps": 3000}
LEVELS = 3  # brightness levels of a lit pixel: (0.25, 0.5], (0.5, 0.75], (0.75, 1]


def features(images):
    """[n, 784] floats in [0, 1] -> [n, k] feature ids of the lit pixels (1 + 3 * pixel + level),
    padded with 0; k is the most lit pixels of any image (about 300 of the 784)."""
    level = torch.clamp((images * 4).ceil().long() - 2, min=-1, max=LEVELS - 1)  # -1 when <= 0.25
    ids = torch.where(level >= 0, 1 + torch.arange(784) * LEVELS + level, torch.zeros_like(level))
    ids = ids.sort(dim=1, descending=True).values
    return ids[:, :int((ids > 0).sum(1).max())].contiguous()


class BagOfPixels(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.embedding = nn.Embedding(1 + 784 * LEVELS, dim, padding_idx=0, sparse=True)
        self.output = nn.Linear(dim, 10)
        with torch.no_grad():
            nn.init.trunc_normal_(self.embedding.weight, std=0.1, a=-0.2, b=0.2)
            self.embedding.weight[0].zero_()
            nn.init.trunc_normal_(self.output.weight, std=1 / dim ** 0.5, a=-2 / dim ** 0.5, b=2 / dim ** 0.5)
            self.output.bias.zero_()

    def forward(self, ids):
        lit = (ids > 0).float().sum(1, keepdim=True).clamp(min=1)
        bag = self.embedding(ids).sum(1) / lit
        return self.output(torch.relu(bag))


def evaluate_fn(model, mnist):
    def evaluate():
        results = {}
        with torch.no_grad():
            for split in ("validation", "test"):
                ids = features(torch.from_numpy(mnist[split]["images"]))
                y = torch.from_numpy(mnist[split]["labels"])
                logits = torch.cat([model(ids[i:i + 1000]) for i in range(0, len(ids), 1000)])
                results[f"{split}_accuracy"] = float((logits.argmax(1) == y).float().mean())
                results[f"{split}_cross_entropy"] = float(nn.functional.cross_entropy(logits, y))
        return results
    return evaluate


def main(argv):
    flags = psflow.parse_flags(argv, defaults=DEFAULTS)
    if flags.unparsed:  # this script has no flags of its own
        print(f"psflow: error: unknown flag {flags.unparsed[0]} (see psflow train --help)", file=sys.stderr)
        sys.exit(2)
    if flags.job_name == "ps":
        psflow.Server.from_flags(flags).join()
        return
    torch.manual_seed(flags.seed)
    mnist = psflow.load_mnist(flags.data_dir)
    ids = features(torch.from_numpy(mnist["train"]["images"]))
    labels = torch.from_numpy(mnist["train"]["labels"])
    model = BagOfPixels()
    loss_fn = nn.CrossEntropyLoss()
    with psflow.WorkerSession(model, flags, evaluate=evaluate_fn(model, mnist),
                              model_name=MODEL_NAME) as session:
        while not session.should_stop():
            batch = torch.from_numpy(session.batch_indices(len(ids), flags.batch_size))
            x, y = ids[batch], labels[batch]
            logits = model(x)
            loss = loss_fn(logits, y)
            model.zero_grad()
            loss.backward()  # embedding.weight.grad is a sparse tensor of the looked-up rows
            session.step(loss.item(), accuracy=(logits.argmax(1) == y).float().mean().item())


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except psflow.Error as e:
        print(f"psflow: error: {e}", file=sys.stderr)
        sys.exit(2 if isinstance(e, psflow.InvalidArgumentError) else 1)
