#!/usr/bin/python3
"""The seed models in PyTorch (Debian's python3-torch): the peer psflow is compared against.

Trains mlp or cnn on real MNIST for a number of steps with the same batch size, optimizer,
learning rate and thread count as the psflow run, and prints one JSON line with the training
loop's examples/s (data loading and start-up excluded, as psflow's train_seconds excludes them).
"""
import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn as nn


def read_idx(path):
    with open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def build(model, hidden_units=100):
    if model == "mlp":
        return nn.Sequential(nn.Linear(784, hidden_units), nn.ReLU(), nn.Linear(hidden_units, 10))
    if model == "vgg19":
        # psflow's vgg19 (src/nn/model.cc): 32x32x3 inputs, 16 3x3 convs in five blocks each
        # ending in a 2x2 max-pool, then dense 512 -> 4096 -> 4096 -> 10.
        layers, channels = [], 3
        for width, convs in ((64, 2), (128, 2), (256, 4), (512, 4), (512, 4)):
            for _ in range(convs):
                layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU()]
                channels = width
            layers.append(nn.MaxPool2d(2))
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(512, 4096), nn.ReLU(),
                             nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))
    if model == "cnn":
        # NCHW here (PyTorch's native layout); psflow is NHWC like TensorFlow.
        return nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(7 * 7 * 64, 1024), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(1024, 10))
    raise SystemExit(f"unknown model {model}")


def optimizer_for(name, params, lr):
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, eps=1e-8)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, alpha=0.9, eps=1e-10)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise SystemExit(f"unknown optimizer {name}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp")
    p.add_argument("--data_dir", default="data/mnist")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch_size", type=int, default=100)
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--learning_rate", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    images = read_idx(os.path.join(a.data_dir, "train-images-idx3-ubyte"))[:55000].astype(np.float32) / 255.0
    labels = read_idx(os.path.join(a.data_dir, "train-labels-idx1-ubyte"))[:55000].astype(np.int64)
    x_all = torch.from_numpy(images.reshape(-1, 784) if a.model == "mlp" else images.reshape(-1, 1, 28, 28))
    y_all = torch.from_numpy(labels)
    model = build(a.model)
    opt = optimizer_for(a.optimizer, model.parameters(), a.learning_rate)
    loss_fn = nn.CrossEntropyLoss()
    perm = torch.randperm(x_all.shape[0])
    n = x_all.shape[0]
    # Warm-up steps (allocator, oneDNN primitive creation) are excluded, as in psflow's own timing
    # of steady-state steps.
    start = None
    for step in range(a.steps + 5):
        if step == 5:
            start = time.perf_counter()
        idx = perm[(step * a.batch_size) % (n - a.batch_size):][:a.batch_size]
        x, y = x_all[idx], y_all[idx]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - start
    print(json.dumps({"framework": "pytorch", "version": torch.__version__, "model": a.model,
                      "steps": a.steps, "batch_size": a.batch_size, "threads": a.threads,
                      "train_seconds": seconds, "examples_per_sec": a.steps * a.batch_size / seconds,
                      "final_loss": float(loss)}))


if __name__ == "__main__":
    main()
