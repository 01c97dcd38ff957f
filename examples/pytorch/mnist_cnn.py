#!/usr/bin/python3
"""Seed 002's program in PyTorch on psflow: the MNIST cnn (conv 5x5x32, max-pool, conv 5x5x64,
max-pool, dense 1024, dropout 0.5, dense 10), RMSProp 1e-3 decayed by 0.5 every 1000 steps,
batch 128, 2000 global steps; async by default, --sync_replicas for SyncReplicasOptimizer
semantics, --partitioner to split the big variables over the ps tasks.

    psflow local --ps=2 --workers=2 --partitioner=fixed:2 -- python3 examples/pytorch/mnist_cnn.py
    python3 examples/pytorch/mnist_cnn.py --job_name=worker --task_index=0 --ps_hosts=... --worker_hosts=... \\
        --sync_replicas --partitioner=fixed:2
"""
import sys

import torch
import torch.nn as nn

import psflow

MODEL_NAME = "cnn"  # the summary's "model" and the checkpoints' metadata
DEFAULTS = {"batch_size": 128, "optimizer": "rmsprop", "learning_rate": 1e-3, "lr_decay_steps": 1000,
            "lr_decay_rate": 0.5, "train_steps": 2000}


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.dense = nn.Linear(7 * 7 * 64, 1024)
        self.dropout = nn.Dropout(0.5)
        self.logits = nn.Linear(1024, 10)
        # Seed 002's initialization: truncated normal with stddev 0.1, biases 0.1.
        with torch.no_grad():
            for layer in (self.conv1, self.conv2, self.dense, self.logits):
                nn.init.trunc_normal_(layer.weight, std=0.1, a=-0.2, b=0.2)
                layer.bias.fill_(0.1)

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = self.dropout(torch.relu(self.dense(x.flatten(1))))
        return self.logits(x)


def evaluate_fn(model, mnist):
    def evaluate():
        model.eval()  # no dropout
        results = {}
        with torch.no_grad():
            for split in ("validation", "test"):
                x = torch.from_numpy(mnist[split]["images"])
                y = torch.from_numpy(mnist[split]["labels"])
                logits = torch.cat([model(x[i:i + 1000]) for i in range(0, len(x), 1000)])
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
    images = torch.from_numpy(mnist["train"]["images"])
    labels = torch.from_numpy(mnist["train"]["labels"])
    model = Cnn()
    loss_fn = nn.CrossEntropyLoss()
    with psflow.WorkerSession(model, flags, evaluate=evaluate_fn(model, mnist),
                              model_name=MODEL_NAME) as session:
        while not session.should_stop():
            batch = torch.from_numpy(session.batch_indices(len(images), flags.batch_size))
            x, y = images[batch], labels[batch]
            logits = model(x)
            loss = loss_fn(logits, y)
            model.zero_grad()
            loss.backward()
            session.step(loss.item(), accuracy=(logits.argmax(1) == y).float().mean().item())


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except psflow.Error as e:
        print(f"psflow: error: {e}", file=sys.stderr)
        sys.exit(2 if isinstance(e, psflow.InvalidArgumentError) else 1)
