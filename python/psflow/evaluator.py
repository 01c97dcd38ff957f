"""psflow.Evaluator: a PyTorch script as the job's evaluator task (TF's Evaluator replica).

The evaluator reads the chief's checkpoints in --checkpoint_dir and talks to no other task, so it
cannot slow training down. `psflow local --evaluator -- python3 script.py` starts the script once
more with TF_CONFIG's task type "evaluator" (flags.job_name == "evaluator" after parse_flags):

    if flags.job_name == "evaluator":
        psflow.evaluate_checkpoints(model, flags, evaluate)   # returns when training ended
        return

Each new checkpoint is loaded into the module's parameters (by their names, as the workers'
WorkerSession saved them) and evaluated once; the metrics evaluate() returns (e.g.
validation_accuracy, test_cross_entropy, test_log_loss, test_auc) are printed as an `eval:` line
and written as TensorBoard scalars under --logdir/eval/, beside the chief's curves. It ends when
the chief has saved its final checkpoint, and raises psflow.AbortedError with the chief's reason
when the job failed, psflow.DeadlineExceededError after --eval_timeout_secs with nothing new
(docs/evaluator.md).
"""
from . import _psflow


class Evaluator:
    """Evaluator(module, flags): iterate to get each new checkpoint's global step, its values
    already in the module's parameters; call report(metrics) for it."""

    def __init__(self, module, flags):
        self._module = module
        self._watcher = _psflow._CheckpointWatcher(flags)
        self._step = None
        self._path = None

    def __iter__(self):
        import torch

        params = dict(self._module.named_parameters())
        while True:
            got = self._watcher.next()
            if got is None:
                self._watcher.finish()
                return
            self._step, self._path, variables = got
            with torch.no_grad():
                for name, p in params.items():
                    value = variables.get(name)
                    if value is None:
                        raise _psflow.InvalidArgumentError(
                            f"{self._path} has no variable '{name}': is this the model the workers train?")
                    if tuple(value.shape) != tuple(p.shape):
                        raise _psflow.InvalidArgumentError(
                            f"{self._path}: variable '{name}' has shape {list(value.shape)}, the module's "
                            f"parameter {list(p.shape)}")
                    p.copy_(torch.from_numpy(value))
            yield self._step

    def report(self, metrics):
        """Prints `eval: global_step=N name=value ...` and writes the scalars under --logdir/eval/."""
        if self._step is None:
            raise _psflow.FailedPreconditionError("report() before the first checkpoint")
        self._watcher.report(self._step, self._path, dict(metrics))


def evaluate_checkpoints(module, flags, evaluate):
    """Evaluates each new checkpoint with evaluate() (no arguments, the checkpoint's values in the
    module; returns {metric name: number}) until training ends. Returns the number evaluated."""
    evaluator = Evaluator(module, flags)
    count = 0
    module.eval()
    for _ in evaluator:
        evaluator.report(evaluate())
        count += 1
    return count
