"""A PyTorch worker for the binding tests: a small MLP (784-32-10, or a variant) trained on MNIST
through psflow.WorkerSession. Run as a worker task of a cluster (the seeds' flags, or TF_CONFIG).

Own flags: --variant=mlp|wide|renamed|float64|embedding|raise (the chief raises at step 20), --dump=FILE (after close, the final
parameters as a torch.save'd dict, and the summary as FILE.json).
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

import psflow


class Mlp(torch.nn.Module):
    def __init__(self, hidden=32, first="fc1"):
        super().__init__()
        torch.manual_seed(1)
        setattr(self, first, torch.nn.Linear(784, hidden))
        self.first = first
        self.fc2 = torch.nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(F.relu(getattr(self, self.first)(x)))


class EmbeddingBagModel(torch.nn.Module):
    """Classifies an MNIST image from the ids of its 'on' pixels: a sparse embedding of 784 rows."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.embed = torch.nn.Embedding(784, 16, sparse=True)
        self.out = torch.nn.Linear(16, 10)

    def forward(self, ids):
        return self.out(self.embed(ids).mean(dim=1))


def main():
    flags = psflow.parse_flags(defaults={"batch_size": 50, "optimizer": "adam", "learning_rate": 0.01})
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="mlp")
    parser.add_argument("--dump", default="")
    args = parser.parse_args(flags.unparsed)

    if args.variant == "embedding":
        model = EmbeddingBagModel()
    elif args.variant == "wide":
        model = Mlp(hidden=48)
    elif args.variant == "renamed":
        model = Mlp(first="hidden")
    else:
        model = Mlp()
    if args.variant == "float64":
        model = model.double()

    mnist = psflow.load_mnist(flags.data_dir)
    train_x = torch.from_numpy(mnist["train"]["images"])
    train_y = torch.from_numpy(mnist["train"]["labels"])
    test_x = torch.from_numpy(mnist["test"]["images"])
    test_y = torch.from_numpy(mnist["test"]["labels"])

    def inputs(x):
        if args.variant != "embedding":
            return x
        # The 20 brightest pixels' ids (fixed-size bags).
        return torch.topk(x, 20, dim=1).indices

    def evaluate():
        with torch.no_grad():
            logits = model(inputs(test_x))
            return {"test_accuracy": (logits.argmax(1) == test_y).float().mean().item(),
                    "test_cross_entropy": F.cross_entropy(logits, test_y).item()}

    with psflow.WorkerSession(model, flags, evaluate=evaluate) as sess:
        while not sess.should_stop():
            idx = torch.from_numpy(sess.batch_indices(train_x.shape[0]))
            logits = model(inputs(train_x[idx]))
            loss = F.cross_entropy(logits, train_y[idx])
            loss.backward()
            acc = (logits.argmax(1) == train_y[idx]).float().mean().item()
            sess.step(loss, acc)
            if args.variant == "raise" and sess.is_chief and sess.local_step == 20:
                raise RuntimeError("boom at local step 20")
    if args.dump:
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, args.dump)
        with open(args.dump + ".json", "w") as f:
            json.dump({"summary": sess.summary, "is_chief": sess.is_chief, "global_step": sess.global_step}, f)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except psflow.Error as e:
        print(f"torch_worker: error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
