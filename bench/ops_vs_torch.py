#!/usr/bin/python3
"""psflow's ops beside PyTorch's same ops, at the same sizes, one thread: forward and backward.

psflow's figures come from the op-test harness's timing mode (src/core/op_test_harness.h): the
"Bench_" cases of core_ops_test run with PSFLOW_OP_TIMING=1 and print one "[op timing]" line each
(median over repetitions, at one intra-op thread, the op's backward closure alone from a given
output gradient). The same ops then run here in PyTorch on inputs of the printed shapes, timed the
same way (median of >= 5 repetitions and >= 0.2 s; backward is torch.autograd.backward from a
given output gradient). Prints a Markdown table; ratio > 1 means psflow is faster.

  bench/ops_vs_torch.py [--build build]
"""
import argparse
import os
import re
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
LINE = re.compile(r"^\[op timing\] Bench_(\w+) inputs=(\S+) forward_us=([\d.]+) backward_us=([\d.]+)$")

# Each op as PyTorch writes it, given float inputs of the harness's shapes (all requiring grad).
def _labels_binary(x):
    return (torch.rand_like(x) < 0.5).float()


TORCH_OPS = {
    "Add": lambda a, b: a + b,
    "AddRow": lambda a, b: a + b,
    "Subtract": lambda a, b: a - b,
    "Multiply": lambda a, b: a * b,
    "Relu": torch.relu,
    "Tanh": torch.tanh,
    "Sigmoid": torch.sigmoid,
    "Gelu": lambda x: F.gelu(x, approximate="tanh"),
    "RowDot": lambda a, b: (a * b).sum(-1, keepdim=True),
    "Concat": lambda a, b: torch.cat([a, b], 1),
    "Split": lambda x: torch.split(x, [x.shape[1] // 2, x.shape[1] // 2], 1)[0],
    "Reshape": lambda x: x.reshape(x.shape[1], x.shape[0]),
    "LayerNorm": lambda x, g, b: F.layer_norm(x, (x.shape[-1],), g, b, 1e-5),
}
# Losses take data (labels, targets) beside the input: made once per op, outside the timing.
LOSSES = {
    "SigmoidCrossEntropy": (_labels_binary, F.binary_cross_entropy_with_logits),
    "MeanSquaredError": (lambda x: torch.rand_like(x) * 2 - 1, F.mse_loss),
    "SoftmaxCrossEntropy": (lambda x: torch.randint(0, x.shape[1], (x.shape[0],)), F.cross_entropy),
}


def parse_shape(text):
    return [int(d) for d in text.strip("[]").split(",") if d]


def median_us(fn_forward, fn_backward):
    forward, backward, total = [], [], 0.0
    while len(forward) < 5 or total < 0.2:
        t0 = time.perf_counter()
        y = fn_forward()
        t1 = time.perf_counter()
        grad = fn_backward.weights(y)
        t2 = time.perf_counter()
        fn_backward(y, grad)
        t3 = time.perf_counter()
        forward.append(t1 - t0)
        backward.append(t3 - t2)
        total += forward[-1] + backward[-1]
    return statistics.median(forward) * 1e6, statistics.median(backward) * 1e6


def time_torch(name, shapes):
    inputs = [torch.rand(s) * 2 - 1 for s in shapes]
    for t in inputs:
        t.requires_grad_(True)
    if name in LOSSES:
        make_data, loss = LOSSES[name]
        data = make_data(inputs[0].detach())
        forward = lambda: loss(inputs[0], data)
    else:
        op = TORCH_OPS[name]
        forward = lambda: op(*inputs)

    def backward(y, grad):
        for t in inputs:
            t.grad = None
        torch.autograd.backward(y, grad)

    backward.weights = lambda y: torch.rand_like(y) * 2 - 1
    return median_us(forward, backward)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    binary = os.path.join(args.build, "src", "core", "core_ops_test")
    env = dict(os.environ, PSFLOW_OP_TIMING="1")
    out = subprocess.run([binary, "--gtest_filter=*Bench_*"], env=env, check=True, capture_output=True, text=True)
    rows = [LINE.match(line) for line in out.stdout.splitlines()]
    rows = [m for m in rows if m]
    if not rows:
        raise SystemExit(f"no [op timing] lines from {binary}")
    print(f"one thread; psflow {binary}, PyTorch {torch.__version__}; microseconds, median")
    print("| op | inputs | psflow fwd | torch fwd | fwd ratio | psflow bwd | torch bwd | bwd ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in rows:
        name, inputs = m.group(1), m.group(2)
        shapes = [parse_shape(s) for s in inputs.split(";")]
        ps_fwd, ps_bwd = float(m.group(3)), float(m.group(4))
        t_fwd, t_bwd = time_torch(name, shapes)
        # A backward that hands the gradient buffer on (Reshape) takes well under a microsecond.
        bwd_ratio = f"{t_bwd / ps_bwd:.2f}" if ps_bwd >= 1 else "—"
        print(f"| {name} | {inputs.replace(';', ' ')} | {ps_fwd:.0f} | {t_fwd:.0f} | {t_fwd / ps_fwd:.2f} | "
              f"{ps_bwd:.0f} | {t_bwd:.0f} | {bwd_ratio} |")


if __name__ == "__main__":
    main()
