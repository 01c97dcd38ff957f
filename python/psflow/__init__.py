"""psflow: parameter-server training for PyTorch models, on psflow's C++ runtime.

    import psflow
    flags = psflow.parse_flags(defaults={"batch_size": 100})        # psflow train's flags
    if flags.job_name == "ps":                                       # cluster: ClusterSpec.from_flags
        psflow.Server.from_flags(flags).join()
    else:
        with psflow.WorkerSession(model, flags) as sess:             # chief initializes / restores
            while not sess.should_stop():
                idx = sess.batch_indices(num_examples, flags.batch_size)
                loss = loss_fn(model(x[idx]), y[idx]); loss.backward()
                sess.step(loss)                                      # push grads, pull values

Every behaviour (cluster parsing, flags, placement, sync, checkpoints, recovery, telemetry,
summary) is psflow's C++; this package is a thin binding (docs/pytorch.md). Embedding tables on
the ps tasks: psflow.torch.Embedding / EmbeddingBag (docs/recommendation.md).
"""
from ._psflow import (  # noqa: F401  (the C++ extension)
    __version__,
    Error,
    CancelledError,
    UnknownError,
    InvalidArgumentError,
    DeadlineExceededError,
    NotFoundError,
    AlreadyExistsError,
    PermissionDeniedError,
    ResourceExhaustedError,
    FailedPreconditionError,
    AbortedError,
    OutOfRangeError,
    UnimplementedError,
    InternalError,
    UnavailableError,
    DataLossError,
    UnauthenticatedError,
    ClusterSpec,
    Flags,
    BatchSampler,
    load_mnist,
    CtrGenerator,
    log_loss,
    auc,
)
from .checkpoint import checkpoint_info, load_checkpoint, read_checkpoint, read_table_rows  # noqa: F401
from .data import DistributedBatchSampler  # noqa: F401
from .flags import parse_flags  # noqa: F401
from .server import Server  # noqa: F401
from .session import WorkerSession  # noqa: F401
from . import optim  # noqa: F401
from .evaluator import Evaluator, evaluate_checkpoints  # noqa: F401

__all__ = [
    "__version__", "Error", "InvalidArgumentError", "NotFoundError", "FailedPreconditionError",
    "UnavailableError", "DeadlineExceededError", "AbortedError", "OutOfRangeError", "CancelledError",
    "ClusterSpec", "Flags", "parse_flags", "Server", "WorkerSession", "BatchSampler", "load_mnist",
    "CtrGenerator", "log_loss", "auc", "optim", "read_checkpoint", "load_checkpoint", "checkpoint_info",
    "read_table_rows",
    "DistributedBatchSampler", "Evaluator", "evaluate_checkpoints",
]


def __getattr__(name):
    # psflow.torch (the tables' modules) imports torch: loaded on first use, so that a ps task's
    # `import psflow` does not pay for torch.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'psflow' has no attribute '{name}'")
