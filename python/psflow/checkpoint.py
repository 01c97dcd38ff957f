"""psflow.read_checkpoint / load_checkpoint / read_table_rows: a psflow checkpoint back into PyTorch.

A checkpoint (--checkpoint_dir/model.ckpt-STEP.safetensors) holds every ps variable whole under its
module parameter name (whatever its partitioning on the ps tasks), the optimizer's slots as
"NAME/slot/SLOT", and metadata (global step, model, optimizer, a checksum). It also holds the
model's embedding tables (psflow.torch.Embedding / EmbeddingBag, docs/tables.md#semantics): a fixed
table NAME [N, dim] like a variable (slots NAME/slot/SLOT; NAME/count int64 under lazy adam), a
dynamic one as NAME/ids (int64, ascending), NAME [n, dim] (row i is id NAME/ids[i]'s), NAME/SLOT,
NAME/last_step and NAME/count (int64). Every function reads with psflow's C++ reader (structure and
checksum checked, as a restore does); a directory means its newest checkpoint that passes its checksum.

    state = psflow.read_checkpoint("/tmp/ckpt")          # {name: torch.Tensor}, a state_dict
    step = psflow.load_checkpoint(model, "/tmp/ckpt")     # into model's parameters, in place
    rows, found = psflow.read_table_rows("/tmp/ckpt", model.emb, ids, model)   # some rows, by id

Buffers (BatchNorm statistics) are not ps variables and are not in checkpoints; load_checkpoint
compares the module's named_parameters() with the checkpoint's variables, and its psflow.torch
tables with the checkpoint's tables (they hold no weight: nothing is copied into them).
"""
from . import _psflow

_SLOT = "/slot/"


def _read(path):
    import os

    return _psflow._read_checkpoint(os.fspath(path))


def _dynamic_tables(int64s):
    return {name[:-len("/ids")] for name in int64s if name.endswith("/ids")}


def _is_state(name, dynamic, is_int64):
    """A slot or a table's per-row state (last step, count), as opposed to a value or a table's ids."""
    if _SLOT in name:
        return True
    table, _, rest = name.rpartition("/")
    if table in dynamic:
        return rest != "ids"
    return is_int64 and rest == "count"  # a fixed table's per-row count (lazy adam)


def read_checkpoint(path, slots=False):
    """{name: torch.Tensor} of the checkpoint at `path` (a file, or a directory: its newest valid
    checkpoint): the variables (float32) and the tables (float32 [rows, dim]; a dynamic table's ids
    as NAME/ids, torch.int64). With slots=True also the optimizer's slots ("NAME/slot/SLOT"; a
    dynamic table's "NAME/SLOT") and the tables' per-row int64 state (NAME/last_step, NAME/count).
    The tensors share the reader's memory (no copy)."""
    import torch

    _, _, tensors, _, int64s = _read(path)
    dynamic = _dynamic_tables(int64s)
    out = {name: torch.from_numpy(a) for name, a in tensors.items() if slots or not _is_state(name, dynamic, False)}
    out.update((name, torch.from_numpy(a)) for name, a in int64s.items()
               if slots or not _is_state(name, dynamic, True))
    return out


def checkpoint_info(path):
    """(file, global_step, metadata) of the checkpoint at `path` (a file, or a directory's newest)."""
    file, step, _, metadata, _ = _read(path)
    return file, step, dict(metadata)


def _table_problems(tables, tensors, dynamic):
    """The psflow.torch tables of a module against a checkpoint's: (missing, mismatched), one
    phrase per table."""
    missing, problems = [], []
    for name, m in tables:
        kind = "dynamic" if m.num_embeddings is None else f"fixed [{m.num_embeddings}, {m.embedding_dim}]"
        values = tensors.get(name)
        if values is None or values.ndim != 2:
            missing.append(f"table '{name}' ({kind})")
            continue
        rows, dim = values.shape
        if dim != m.embedding_dim:
            problems.append(f"table '{name}' has dim {dim} in the checkpoint, {m.embedding_dim} in the module")
        elif m.num_embeddings is None and name not in dynamic:
            problems.append(f"table '{name}' is fixed [{rows}, {dim}] in the checkpoint, dynamic in the module")
        elif m.num_embeddings is not None and name in dynamic:
            problems.append(f"table '{name}' is dynamic in the checkpoint, {kind} in the module")
        elif m.num_embeddings is not None and rows != m.num_embeddings:
            problems.append(f"table '{name}' has {rows} rows in the checkpoint, {m.num_embeddings} in the module")
    return missing, problems


def _shape(s):
    return "[" + ", ".join(str(d) for d in s) + "]"


def load_checkpoint(module, path, strict=True):
    """Copies the checkpoint's variables into `module`'s parameters of the same names, in place
    (a WorkerSession's parameters stay in the session's memory). Returns the checkpoint's global step.

    The module's psflow.torch tables (Embedding / EmbeddingBag) hold no weight, so nothing is copied
    into them: each is checked against the checkpoint's table of its name (present, the same dim,
    fixed or dynamic alike, a fixed one with as many rows), and its rows stay in the file; read
    those a computation needs with psflow.read_table_rows(path, table, ids, module). To train on
    from the checkpoint, start the job with its --checkpoint_dir: the chief restores the tables
    onto the ps tasks.

    A mismatch is refused before anything is copied, with one line naming every problem: the
    module's parameters and tables the checkpoint lacks (missing), the checkpoint's variables the
    module lacks (unexpected; ignored with strict=False, as missing ones are then), and shape,
    dim or kind differences (always refused)."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise _psflow.InvalidArgumentError(
            f"load_checkpoint needs a torch.nn.Module, got {type(module).__name__}")
    from .torch import tables_of

    file, step, tensors, _, int64s = _read(path)
    dynamic = _dynamic_tables(int64s)
    tables = tables_of(module)
    missing_tables, table_problems = _table_problems(tables, tensors, dynamic)
    owned = {name for name, _ in tables}
    # Not variables: the module's tables, and the slots (of variables, and of dynamic tables).
    variables = {name: a for name, a in tensors.items()
                 if not _is_state(name, dynamic, False) and name not in owned}
    params = dict(module.named_parameters())
    missing = [n for n in params if n not in variables] + missing_tables
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
    problems += table_problems
    if problems:
        refused = shapes or table_problems  # not excused by strict=False
        raise _psflow.InvalidArgumentError(
            f"checkpoint {file} does not fit {type(module).__name__}: " + "; ".join(problems) +
            ("; build the module the job trained" + (" (or pass strict=False to load the common names)"
                                                      if not refused else "")))
    with torch.no_grad():
        for name, p in params.items():
            if name in variables:
                p.copy_(torch.from_numpy(variables[name]))
    return step


def read_table_rows(path, table, ids, model=None):
    """(rows, found) of embedding table `table` for `ids`, read from the checkpoint at `path` (a
    file, or a directory: its newest valid checkpoint) without holding the table in memory (one
    streamed checksum pass over the file, then the ids column and the wanted rows): rows
    float32 [*ids.shape, dim], found bool [*ids.shape] (the file holds that id's row).

    table: the table's name in the checkpoint, or a psflow.torch.Embedding / EmbeddingBag (its
    name: its `name=`, else its name in `model`, which must then be given). With a module, an id
    the file lacks (a dynamic id never admitted, or evicted) gets the row the ps would give it
    (the module's initializer and seed) and the dim must be the module's; with a name, zeros.
    ids: any integer tensor or sequence; a fixed table's ids must lie in [0, N)."""
    import numpy as np
    import torch

    from .torch import _Table, tables_of

    initializer, seed, dim = "", 0, None
    if isinstance(table, _Table):
        module = table
        name = module.table_name
        if name is None:
            if model is None:
                raise _psflow.InvalidArgumentError(
                    "read_table_rows: the table has no name= of its own; pass the model it belongs to "
                    "(read_table_rows(path, model.emb, ids, model)) or the table's name")
            name = next((n for n, m in tables_of(model) if m is module), None)
            if name is None:
                raise _psflow.InvalidArgumentError(
                    f"read_table_rows: the table is not one of {type(model).__name__}'s psflow.torch tables")
        initializer, seed, dim = module.initializer, module.seed, module.embedding_dim
        if seed is None:
            raise _psflow.FailedPreconditionError(
                f"read_table_rows: table '{name}' was declared without seed=, so its seed is derived from the "
                "job's --seed when a session declares it; read with a module that was in the job's session, "
                f"or give the module seed=psflow.torch.table_seed(SEED, '{name}') (SEED: the job's --seed)")
    elif isinstance(table, str):
        name = table
    else:
        raise _psflow.InvalidArgumentError(
            f"read_table_rows: table is {type(table).__name__}; give a table's name or a psflow.torch module")
    if not isinstance(ids, torch.Tensor):
        ids = torch.as_tensor(ids)
    if ids.dtype not in (torch.int64, torch.int32):
        raise _psflow.InvalidArgumentError(
            f"table '{name}': ids are {ids.dtype}; pass an int64 (or int32) tensor of ids")
    import os

    flat = ids.reshape(-1).to(torch.int64).contiguous().numpy()
    file, _, rows, found = _psflow._read_table_rows(os.fspath(path), name, np.ascontiguousarray(flat),
                                                    initializer, seed)
    if dim is not None and rows.shape[1] != dim:
        raise _psflow.InvalidArgumentError(
            f"table '{name}' has dim {rows.shape[1]} in {file}, {dim} in the module")
    return (torch.from_numpy(rows).view(*ids.shape, rows.shape[1]),
            torch.from_numpy(found).view(ids.shape))
