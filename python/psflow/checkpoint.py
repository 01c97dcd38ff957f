"""psflow.read_checkpoint / psflow.load_checkpoint: a psflow checkpoint back into PyTorch.

A checkpoint (--checkpoint_dir/model.ckpt-STEP.safetensors) holds every ps variable whole under its
module parameter name (whatever its partitioning on the ps tasks), the optimizer's slots as
"NAME/slot/SLOT", and metadata (global step, model, optimizer, a checksum). Both functions read it
with psflow's C++ reader (structure and checksum checked, as a restore does); a directory means
its newest checkpoint that passes its checksum.

    state = psflow.read_checkpoint("/tmp/ckpt")          # {name: torch.Tensor}, a state_dict
    step = psflow.load_checkpoint(model, "/tmp/ckpt")     # into model's parameters, in place

Buffers (BatchNorm statistics) are not ps variables and are not in checkpoints; load_checkpoint
compares the module's named_parameters() with the checkpoint's variables.
"""
from . import _psflow

_SLOT = "/slot/"


def _read(path):
    import os

    return _psflow._read_checkpoint(os.fspath(path))


def read_checkpoint(path, slots=False):
    """{name: float32 torch.Tensor} of the checkpoint at `path` (a file, or a directory: its newest
    valid checkpoint). The optimizer's slot tensors ("NAME/slot/SLOT") only with slots=True.
    The tensors share the reader's memory (no copy)."""
    import torch

    _, _, tensors, _ = _read(path)
    return {name: torch.from_numpy(a) for name, a in tensors.items() if slots or _SLOT not in name}


def checkpoint_info(path):
    """(file, global_step, metadata) of the checkpoint at `path` (a file, or a directory's newest)."""
    file, step, _, metadata = _read(path)
    return file, step, dict(metadata)


def _shape(s):
    return "[" + ", ".join(str(d) for d in s) + "]"


def load_checkpoint(module, path, strict=True):
    """Copies the checkpoint's variables into `module`'s parameters of the same names, in place
    (a WorkerSession's parameters stay in the session's memory). Returns the checkpoint's global step.

    A mismatch is refused before anything is copied, with one line naming every problem: the
    module's parameters the checkpoint lacks (missing), the checkpoint's variables the module lacks
    (unexpected; ignored with strict=False, as missing ones are then), and shape differences
    (always refused)."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise _psflow.InvalidArgumentError(
            f"load_checkpoint needs a torch.nn.Module, got {type(module).__name__}")
    file, step, tensors, _ = _read(path)
    variables = {name: a for name, a in tensors.items() if _SLOT not in name}
    params = dict(module.named_parameters())
    missing = [n for n in params if n not in variables]
    unexpected = [n for n in variables if n not in params]
    shapes = [f"{n}: checkpoint {_shape(variables[n].shape)}, module {_shape(p.shape)}"
              for n, p in params.items() if n in variables and tuple(variables[n].shape) != tuple(p.shape)]
    problems = []
    if missing and strict:
        problems.append("missing in the checkpoint: " + ", ".join(missing))
    if unexpected and strict:
        problems.append("not in the module: " + ", ".join(unexpected))
    if shapes:
        problems.append("shapes differ: " + "; ".join(shapes))
    if problems:
        raise _psflow.InvalidArgumentError(
            f"checkpoint {file} does not fit {type(module).__name__}: " + "; ".join(problems) +
            ("; build the module the job trained" + (" (or pass strict=False to load the common names)"
                                                      if not shapes else "")))
    with torch.no_grad():
        for name, p in params.items():
            if name in variables:
                p.copy_(torch.from_numpy(variables[name]))
    return step
