#!/usr/bin/python3
"""The seeds' mlp (784-100 ReLU-10, Adam 0.01, batch 100, 10000 global steps) in PyTorch, trained
on psflow's parameter servers.

On one machine, the whole cluster with one command (--evaluator --checkpoint_dir=DIR: this script
also evaluates each checkpoint as the evaluator task):
    psflow local --ps=1 --workers=2 -- python3 examples/pytorch/mnist_mlp.py
By hand, the seeds' way (one command per task, the same flags everywhere):
    python3 examples/pytorch/mnist_mlp.py --job_name=ps --task_index=0 --ps_hosts=H:P --worker_hosts=H:P,H:P
    python3 examples/pytorch/mnist_mlp.py --job_name=worker --task_index=0 --ps_hosts=... --worker_hosts=...
Every `psflow train` flag works (--train_steps, --sync_replicas, --checkpoint_dir, ...); see
docs/pytorch.md.
"""
import sys

import torch
import torch.nn as nn

import psflow

# This script's defaults for psflow's flags: the seed mlp's. Flags given to `psflow local` before
# `--`, and this script's own command line, override them.
MODEL_NAME = "mlp"  # the summary's "model" and the checkpoints' metadata
DEFAULTS = {"batch_size": 100, "optimizer": "adam", "learning_rate": 0.01, "train_steps": 10000}


class Mlp(nn.Module):
    def __init__(self, hidden_units=100):
        super().__init__()
        self.hidden = nn.Linear(784, hidden_units)
        self.output = nn.Linear(hidden_units, 10)
        # The seeds' initialization: truncated normal (cut at 2 standard deviations), zero biases.
        with torch.no_grad():
            for layer, std in ((self.hidden, 1.0 / 28), (self.output, 1.0 / hidden_units ** 0.5)):
                nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
                layer.bias.zero_()

    def forward(self, x):
        return self.output(torch.relu(self.hidden(x)))


def evaluate_fn(model, mnist):
    """The evaluation the chief runs at the end, with the final parameters."""
    def evaluate():
        results = {}
        with torch.no_grad():
            for split in ("validation", "test"):
                x = torch.from_numpy(mnist[split]["images"])
                y = torch.from_numpy(mnist[split]["labels"])
                logits = model(x)
                results[f"{split}_accuracy"] = float((logits.argmax(1) == y).float().mean())
                results[f"{split}_cross_entropy"] = float(nn.functional.cross_entropy(logits, y))
        return results
    return evaluate


def main(argv):
    flags = psflow.parse_flags(argv, defaults=DEFAULTS)
    if flags.unparsed:  # this script has no flags of its own
        print(f"psflow: error: unknown flag {flags.unparsed[0]} (see psflow train --help)", file=sys.stderr)
        sys.exit(2)
    if flags.job_name == "ps":  # this task serves parameters; it returns when training has ended
        psflow.Server.from_flags(flags).join()
        return
    torch.manual_seed(flags.seed)
    mnist = psflow.load_mnist(flags.data_dir)
    images = torch.from_numpy(mnist["train"]["images"])
    labels = torch.from_numpy(mnist["train"]["labels"])
    model = Mlp(flags.hidden_units)
    if flags.job_name == "evaluator":  # psflow local --evaluator: each new checkpoint, until training ends
        psflow.evaluate_checkpoints(model, flags, evaluate_fn(model, mnist))
        return
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
    except psflow.Error as e:  # bad flags, an unreachable ps, ...: one line, as `psflow train` says it
        print(f"psflow: error: {e}", file=sys.stderr)
        sys.exit(2 if isinstance(e, psflow.InvalidArgumentError) else 1)
