"""A PyTorch training script as a user writes it, for test_loop.py: its own argparse flags merged
with psflow's (psflow.parse_flags(parser)), a regression MLP on synthetic data, an evaluate() with
names of its own, sess.log_scalar. Runs alone (standalone), under `psflow local --`, or as a task.

Own flags: --hidden, --evaluate_returns=dict|float|text (the wrong types are for the refusal
tests), --save_state=FILE (the chief's final state_dict, torch.save), --report=FILE (the chief's JSON; worker i's at FILE.i: the script's flags, its compute threads, every evaluation it returned).
"""
import argparse
import json
import sys

import torch

import psflow
from psflow.threads import openblas_threads

parser = argparse.ArgumentParser(description="regression MLP for the psflow loop tests")
parser.add_argument("--hidden", type=int, default=8)
parser.add_argument("--evaluate_returns", default="dict", choices=["dict", "float", "text"])
parser.add_argument("--report", default="")
parser.add_argument("--save_state", default="", help="torch.save(model.state_dict()) after the session (chief)")
flags = psflow.parse_flags(parser, defaults={"batch_size": 16, "train_steps": 40, "optimizer": "sgd",
                                             "learning_rate": 0.05, "log_every": 10})
if flags.job_name == "ps":
    psflow.Server.from_flags(flags).join()
    sys.exit(0)

torch.manual_seed(flags.seed)
x = torch.randn(512, 4)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
model = torch.nn.Sequential(torch.nn.Linear(4, flags.hidden), torch.nn.Tanh(), torch.nn.Linear(flags.hidden, 1))
evaluations = []


def evaluate():
    if flags.evaluate_returns == "float":
        return 0.5
    with torch.no_grad():
        mse = float(torch.nn.functional.mse_loss(model(x), y))
    if flags.evaluate_returns == "text":
        return {"validation_mse": "low"}
    result = {"validation_mse": mse, "eval/half_mse": torch.tensor(mse / 2), "validation_accuracy": 0.25}
    evaluations.append({"global_step": sess.global_step, "validation_mse": mse})
    return result


with torch.no_grad():
    initial_mse = float(torch.nn.functional.mse_loss(model(x), y))
with psflow.WorkerSession(model, flags, evaluate=evaluate) as sess:
    while not sess.should_stop():
        idx = torch.from_numpy(sess.batch_indices(len(x)))
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        sess.step(loss)
        sess.log_scalar("script/half_step", sess.global_step / 2)
if flags.save_state and sess.is_chief:
    torch.save(model.state_dict(), flags.save_state)
if flags.report:  # the chief's at FILE, worker i's at FILE.i
    with open(flags.report if sess.is_chief else f"{flags.report}.{sess.worker_index}", "w") as f:
        json.dump({"hidden": flags.hidden, "batch_size": flags.batch_size, "initial_mse": initial_mse,
                   "evaluations": evaluations, "summary": sess.summary, "is_chief": sess.is_chief,
                   "local_step": sess.local_step,
                   "torch_threads": torch.get_num_threads(),
                   "openblas_threads": sorted(set(openblas_threads().values()))}, f)
