"""psflow.WorkerSession: a torch.nn.Module trained by psflow's ps tasks (MonitoredTrainingSession's role).

The module's named_parameters() become the ps variables (their names are the variable names in
the placement listing and in the checkpoints). Everything else — connecting, placement, the chief's
initialization or restore, waiting for the chief, push/pull, sync step tags, ps-restart recovery,
checkpoints, --logdir, --metrics_port, the progress line, the final summary — is the C++ worker
session of psflow/train/session.h, the one `psflow train` workers use.

Memory: each parameter's .data (and .grad) is moved, once, into memory the C++ session owns, so
that each step pulls the new values straight into the parameters and pushes the gradients straight
from where autograd accumulated them: no copy per step beyond the wire decode.

Parameters:
  * must be float32, on the CPU, contiguous (else psflow.InvalidArgumentError naming them);
  * requires_grad=False: still a ps variable (initialized by the chief, restored, checkpointed,
    pulled every step), never pushed, so it keeps the chief's value;
  * weights of nn.Embedding / nn.EmbeddingBag with sparse=True: their sparse gradient is pushed
    row-sparse (coalesced: indices and values), so the ps updates only the touched rows;
  * a parameter that once had a gradient is pushed every step; step() zeroes the gradients after
    pushing them (you need not call zero_grad(); calling it is harmless). As with PyTorch 1.13's
    default zero_grad(set_to_none=False), a parameter unused by a later step then pushes zeros.
Buffers (BatchNorm running statistics and the like) are not ps variables: each worker keeps its
own, and psflow's checkpoints do not hold them (save them with torch.save if you need them).
"""
import sys

from . import _psflow

_SPARSE_MODULES = ("Embedding", "EmbeddingBag")


def _sparse_parameter_names(module):
    names = set()
    for prefix, m in module.named_modules():
        if type(m).__name__ in _SPARSE_MODULES and getattr(m, "sparse", False):
            names.add(f"{prefix}.weight" if prefix else "weight")
    return names


def _check_parameter(name, p):
    import torch

    if p.dtype != torch.float32:
        raise _psflow.InvalidArgumentError(
            f"parameter '{name}' is {p.dtype}; psflow trains float32 parameters: convert the module "
            "with module.float()")
    if p.device.type != "cpu":
        raise _psflow.InvalidArgumentError(
            f"parameter '{name}' is on {p.device}; psflow workers compute on the CPU: move the module "
            "with module.cpu()")
    if not p.is_contiguous():
        raise _psflow.InvalidArgumentError(
            f"parameter '{name}' is not contiguous; make it so (p.data = p.data.contiguous()) before "
            "the session")


def _script_model_name():
    """The running script's name without .py ("mnist_mlp"), or None (an interactive session): a
    module's class name says little ("Sequential")."""
    import os

    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not script or script in ("-c", "-m") or script.startswith("<"):
        return None
    return script[:-3] if script.endswith(".py") else script


class WorkerSession:
    """WorkerSession(module, flags, evaluate=None, model_name=None): a context manager.

    Entering it (or open()) connects; the chief (worker 0) initializes the ps variables from the
    module's values, or restores the newest checkpoint of --checkpoint_dir; the other workers wait
    for the chief. The parameters then hold the current values.

        with psflow.WorkerSession(model, flags, evaluate=evaluate) as sess:
            while not sess.should_stop():
                idx = sess.batch_indices(num_examples, flags.batch_size)
                ...forward, loss.backward()...
                sess.step(loss, accuracy)

    evaluate: called by the chief at close() with the final values in the parameters; returns a
      dict with any of validation_accuracy, validation_cross_entropy, test_accuracy,
      test_cross_entropy (for the summary, --metrics_json, TensorBoard).
    model_name: the summary's "model" and the checkpoints' metadata (default: the script's name
      without .py, e.g. "mnist_mlp"; the module's class name when there is no script); a
      checkpoint of another model name is refused at restore.
    An exception inside the `with` block aborts the job when raised on the chief (the ps tasks exit
    non-zero with its message); other workers just leave.
    """

    def __init__(self, module, flags, evaluate=None, model_name=None):
        import torch

        if not isinstance(module, torch.nn.Module):
            raise _psflow.InvalidArgumentError(
                f"WorkerSession needs a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(flags, _psflow.Flags):
            raise _psflow.InvalidArgumentError(
                "WorkerSession needs the flags of psflow.parse_flags()")
        self._module = module
        self._flags = flags
        self._evaluate = evaluate
        self._params = list(module.named_parameters())
        if not self._params:
            raise _psflow.InvalidArgumentError("the module has no parameters to train")
        for name, p in self._params:
            _check_parameter(name, p)
        sparse_names = _sparse_parameter_names(module)
        self._sparse = [name in sparse_names for name, _ in self._params]
        self._trainable = [p.requires_grad for _, p in self._params]
        self._session = _psflow._Session(
            flags, [n for n, _ in self._params], [list(p.shape) for _, p in self._params],
            self._trainable, model_name or _script_model_name() or type(module).__name__)
        self._values = []
        self._grads = []
        self._samplers = {}
        self.summary = None
        self._opened = False

    # --- life cycle -----------------------------------------------------------------------------

    def open(self):
        """Connects, initializes (chief) or waits for the chief; the parameters then hold the
        current values. Called by `with`."""
        import torch

        if self._opened:
            raise _psflow.FailedPreconditionError("the worker session is already open")
        with torch.no_grad():
            for i, (name, p) in enumerate(self._params):
                value = torch.from_numpy(self._session.value(i))
                value.copy_(p.data)  # the chief's values at open are the job's initial values
                p.data = value
                if self._trainable[i]:
                    grad = torch.from_numpy(self._session.grad(i))
                    self._grads.append(grad)
                    if not self._sparse[i]:
                        p.grad = grad
                else:
                    self._grads.append(None)
                self._values.append(value)
        self._grad_ptrs = [g.data_ptr() if g is not None else None for g in self._grads]
        self._value_ptrs = [v.data_ptr() for v in self._values]
        self._opened = True
        sys.stdout.flush()  # the script's own lines before the session's (C++ stdout)
        self._session.open()
        return self

    def close(self):
        """Chief: pulls the final values, saves the final checkpoint, calls evaluate(), prints
        the summary, writes --metrics_json and ends the job. Others: leave. Returns the summary."""
        if not self._opened:
            raise _psflow.FailedPreconditionError("close() before the worker session is open")
        sys.stdout.flush()
        self.summary = self._session.close(self._evaluate)
        return self.summary

    def abort(self, reason):
        """After a failure: the chief aborts the job (the ps tasks exit non-zero with `reason`)."""
        self._session.abort(str(reason), False)

    def __enter__(self):
        try:
            return self.open()
        except BaseException as e:  # __exit__ is not called for a failed __enter__
            if self._opened:
                self._session.abort(f"{type(e).__name__}: {e}", isinstance(e, _psflow.AbortedError))
            raise

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                self.close()
            except BaseException as e:  # a close that failed before the end aborts the job
                self._session.abort(f"{type(e).__name__}: {e}", isinstance(e, _psflow.AbortedError))
                raise
            return False
        if self._opened:
            aborted = isinstance(exc, _psflow.AbortedError)
            self._session.abort(f"{exc_type.__name__}: {exc}" if not aborted else str(exc), aborted)
        return False

    # --- training -----------------------------------------------------------------------------

    def should_stop(self):
        """True once the global step reached --train_steps (or training ended elsewhere)."""
        return self._session.should_stop()

    def step(self, loss, accuracy=float("nan")):
        """Pushes the parameters' gradients and pulls the new values into the parameters (one call
        per ps task), advancing the global step; logs progress, feeds telemetry, and the chief
        checkpoints on schedule. The gradients are zeroed afterwards."""
        if not self._opened:
            raise _psflow.FailedPreconditionError(
                "step() before the worker session is open: use `with psflow.WorkerSession(...) as sess:` "
                "or call open() first")
        dense_ready = []
        sparse = []
        for i, (name, p) in enumerate(self._params):
            if p.data_ptr() != self._value_ptrs[i]:
                raise _psflow.FailedPreconditionError(
                    f"parameter '{name}' no longer lives in the session's memory (its .data was replaced, "
                    "e.g. by module.to() or module.float() after the session opened); copy values in place "
                    "instead (p.data.copy_(...), load_state_dict)")
            g = p.grad
            ready = False
            if g is not None and self._trainable[i]:
                if g.is_sparse:
                    g = g.coalesce()
                    sparse.append((i, g.indices()[0].numpy(), g.values().numpy()))
                    p.grad = None
                elif g.data_ptr() == self._grad_ptrs[i]:
                    ready = True
                else:  # autograd made a new tensor (e.g. after zero_grad(set_to_none=True))
                    self._grads[i].copy_(g)
                    p.grad = self._grads[i]
                    ready = True
            dense_ready.append(ready)
        loss = float(loss)
        accuracy = float(accuracy)
        self._session.step(loss, accuracy, dense_ready, sparse)

    def batch_indices(self, num_examples, batch_size=None):
        """This worker's slice of the current global batch (docs/design.md#data-order: sync mode
        slices global batch `global_step`, async mode walks its own batches by local step), as
        psflow train's workers take it: numpy int64 indices into the training examples."""
        if batch_size is None:
            batch_size = self._flags.batch_size
        key = (int(num_examples), int(batch_size))
        sampler = self._samplers.get(key)
        if sampler is None:
            sampler = _psflow.BatchSampler(key[0], key[1], self.worker_index, self.num_workers, self._flags.seed)
            self._samplers[key] = sampler
        return sampler.batch(self._session.data_step)

    # --- state --------------------------------------------------------------------------------

    @property
    def global_step(self):
        return self._session.global_step

    @property
    def local_step(self):
        return self._session.local_step

    @property
    def is_chief(self):
        return self._session.is_chief

    @property
    def worker_index(self):
        return self._session.worker_index

    @property
    def num_workers(self):
        return self._session.num_workers

    @property
    def num_ps(self):
        return self._session.num_ps

    @property
    def sync(self):
        return self._session.sync

    @property
    def placement(self):
        """The placement listing of the parameters (which ps holds which variable or shard)."""
        return self._session.placement

