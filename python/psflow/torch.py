"""psflow.torch: embedding tables on the ps tasks for PyTorch models (docs/recommendation.md).

    emb = psflow.torch.EmbeddingBag(100000, 16, mode="sum")     # was nn.EmbeddingBag(..., sparse=True)
    emb = psflow.torch.Embedding(None, 16)                       # a dynamic table: any int64 id

The modules take torch.nn.Embedding's and EmbeddingBag's arguments and forward signatures but hold
no weight (`emb.weight` takes nn.init.* calls, which set the table's initializer, and refuses the rest;
docs/recommendation.md lists every difference from nn.EmbeddingBag): the table lives on the ps tasks (docs/tables.md#semantics), declared there by psflow.WorkerSession,
which finds the modules among the model's. A forward hands its ids to the C++ worker session
(python/ext/table_binding.cc: dedup, routing, the pull or the prefetched rows), gets the batch's
unique rows [U, dim] as a leaf tensor and gathers them by the inverse index; backward leaves the
unique rows' gradients (summed per id) on that leaf, which sess.step() pushes with the dense
gradients in the same call per ps, where the table's rule (--sparse_optimizer) runs. Python does no
routing, dedup, update or checkpointing of its own.

Ids: an integer tensor (int64 or int32); a fixed table's ids must lie in [0, num_embeddings)
(the session refuses others, naming the table). padding_idx: those ids give zero rows (Embedding)
or are left out of their bag (EmbeddingBag), are never pulled nor pushed.
"""
import builtins

import torch
import torch.nn.functional as F

from . import _psflow

_MODES = ("sum", "mean")

# The table's keyword arguments, their defaults and help, from the one table of fields the C++
# side declares (include/psflow/dist/table_spec.h's TableFields, which also gives the ctr model's
# --table_* flags): [(name, default, help)]. A field added there is a keyword argument here.
_FIELDS = [tuple(f) for f in _psflow._table_fields()]
_DEFAULTS = {name: default for name, default, _ in _FIELDS}
# seed's default here: None, the table's seed derived from the job's --seed and the table's name
# (table_seed), so that tables of one model do not start with the same rows for the same id.
_SEED_HELP = ("the initializer's seed: row `id`'s initial value is a function of (seed, id) only; None: "
              "table_seed(--seed, the table's name), set when the session declares the table")
_FIELDS = [(name, None, _SEED_HELP) if name == "seed" else (name, default, help) for name, default, help in _FIELDS]


def table_seed(job_seed, name):
    """The seed of a table declared without seed=: a 63-bit mix of the job's --seed and the table's
    name (FNV-1a of the UTF-8 name, through splitmix64's finalizer), so every table of a model starts
    from rows of its own and a job started again with the same --seed draws the same rows."""
    mask = (1 << 64) - 1
    h = 0xcbf29ce484222325
    for byte in name.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001b3) & mask
    x = (h ^ ((int(job_seed) * 0x9E3779B97F4A7C15) & mask)) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


def _with_table_options(cls):
    """Writes the table's keyword arguments into cls's signature and docstring (they arrive as
    **table_options: the names and defaults are _FIELDS's)."""
    import inspect

    sig = inspect.signature(cls.__init__)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
               for name, default, _ in _FIELDS]
    cls.__init__.__signature__ = sig.replace(parameters=params)
    cls.__doc__ += "\n    Table options (keyword only):\n" + "".join(
        f"      {name}={default!r}: {help}\n" for name, default, help in _FIELDS)
    return cls


_INIT_FUNCTIONS = ("normal_", "uniform_", "constant_", "zeros_", "ones_")


class _TableWeight:
    """`table.weight` of a psflow.torch table: its rows live on the ps tasks (a table may hold 10⁹ rows),
    so this holds no values. What it takes is torch.nn.init's way of choosing initial values:
    nn.init.normal_/uniform_/constant_/zeros_/ones_ on it (or weight.normal_(…), weight.data.uniform_(…),
    xavier_uniform_ on a fixed table: its [N, dim] shape is known) set the table's initializer, before
    psflow.WorkerSession declares the table; the ps then draws each row from (initializer, seed, id).
    Anything else (reading values, indexing, arithmetic) is refused with one line saying what to use."""

    dtype = torch.float32
    device = torch.device("cpu")
    requires_grad = True

    def __init__(self, module):
        self._module = module

    @property
    def data(self):
        return self

    @property
    def shape(self):
        m = self._module
        if m.num_embeddings is None:
            raise self._refuse("shape", "a dynamic table has no row count (any int64 id is a row)")
        return torch.Size([m.num_embeddings, m.embedding_dim])

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self):
        return 2

    def normal_(self, mean=0.0, std=1.0, generator=None):
        return self._set(f"normal:{float(mean)!r}:{float(std)!r}", generator)

    def uniform_(self, a=0.0, b=1.0, generator=None):
        return self._set(f"uniform:{float(a)!r}:{float(b)!r}", generator)

    def fill_(self, value):
        return self._set(f"constant:{float(value)!r}")

    def zero_(self):
        return self._set("zeros")

    # nn.init.trunc_normal_(w, mean, std, a, b) runs uniform_, erfinv_, mul_(std·√2), add_(mean) and
    # clamp_(a, b) on its tensor: followed here, it becomes the ps's truncated_normal (cut at 2 std,
    # TF's) when [a, b] is mean ± 2 std, a normal when [a, b] lies beyond 6 std, else refused.
    def erfinv_(self):
        self._trunc = {"mean": 0.0, "std": None, "before": self.__dict__.get("_before")}
        return self

    def mul_(self, factor):
        self._trunc_step("mul_")["std"] = float(factor) / 2 ** 0.5
        return self

    def add_(self, value):
        self._trunc_step("add_")["mean"] = float(value)
        return self

    def clamp_(self, min=None, max=None):
        t = self._trunc_step("clamp_")
        mean, std = t["mean"], t["std"]
        del self._trunc
        if std is None or min is None or max is None:
            raise self._refuse("clamp_", "only nn.init.trunc_normal_'s use of it is followed")
        close = lambda x, y: abs(x - y) <= 1e-6 * builtins.max(1.0, abs(y))  # noqa: E731
        if close(min, mean - 2 * std) and close(max, mean + 2 * std):
            return self._set(f"truncated_normal:{mean!r}:{std!r}")
        if min <= mean - 6 * std and max >= mean + 6 * std:
            return self._set(f"normal:{mean!r}:{std!r}")
        if t["before"] is not None:  # undo the uniform_ that began the sequence
            self._module.initializer = self._module.table_options["initializer"] = t["before"]
        raise self._refuse(f"trunc_normal_ cut at [{min}, {max}]", f"the ps's truncated_normal cuts at mean ± 2 std "
                           f"([{mean - 2 * std}, {mean + 2 * std}]); pass a={mean - 2 * std}, b={mean + 2 * std}")

    def _trunc_step(self, what):
        t = self.__dict__.get("_trunc")
        if t is None:
            raise self._refuse(what, "it holds no values on this worker")
        return t

    def _set(self, initializer, generator=None):
        m = self._module
        if generator is not None:
            raise self._refuse("a generator", "the ps draws the rows from the table's seed= (or --seed)")
        if m._tables is not None or m._declared:
            raise _psflow.FailedPreconditionError(
                f"{m._what()}: nn.init on its weight after a psflow.WorkerSession declared the table; "
                "initialize it before the session (or pass initializer=... to the module)")
        _psflow._check_table_options(f"psflow.torch.{m._kind}", {"initializer": initializer})
        self._before = m.initializer
        m.initializer = initializer
        m.table_options["initializer"] = initializer
        return self

    def _refuse(self, what, why):
        return _psflow.UnimplementedError(
            f"{self._module._what()}: {what} of its weight: {why}. Its rows live on the ps tasks: nn.init.* on "
            "weight (or initializer=) sets their initial values; a forward gives a batch's rows; "
            "psflow.read_table_rows(checkpoint, table, ids) reads saved ones")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", str(func))
        weight = args[0] if args else kwargs.pop("tensor", None)
        if isinstance(weight, _TableWeight) and getattr(func, "__module__", "") == "torch.nn.init" and \
                name in _INIT_FUNCTIONS:
            rest = list(args[1:])
            if name == "normal_":
                return weight.normal_(*rest, **kwargs)
            if name == "uniform_":
                return weight.uniform_(*rest, **kwargs)
            if name == "constant_":
                return weight.fill_(*(rest or [kwargs["val"]]))
            return weight.zero_() if name == "zeros_" else weight.fill_(1.0)
        found = [a for a in (weight, *args, *kwargs.values()) if isinstance(a, _TableWeight)]
        if not found:
            return NotImplemented
        raise found[0]._refuse(name, "it holds no values on this worker")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._refuse(f"'{name}'", "it holds no values on this worker")

    def __getitem__(self, index):
        raise self._refuse("indexing", "it holds no values on this worker")

    def __repr__(self):
        m = self._module
        n = "dynamic" if m.num_embeddings is None else m.num_embeddings
        return f"<weight of {m._what()}: [{n}, {m.embedding_dim}] on the ps tasks, initializer={m.initializer}>"


class _Table(torch.nn.Module):
    """What both modules share: the table's declaration and the link to the open session."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx, name, max_norm, kind, table_options):
        super().__init__()
        what = f"psflow.torch.{kind}"
        self._seed_given = table_options.get("seed") is not None
        if not self._seed_given:
            table_options.pop("seed", None)
        for key in table_options:
            if key not in _DEFAULTS:
                raise TypeError(f"{what}() got an unexpected keyword argument {key!r} (table options: "
                                f"{', '.join(_DEFAULTS)})")
        if max_norm is not None:
            raise _psflow.UnimplementedError(f"{what}: max_norm is not supported (the rows live on the ps tasks)")
        if num_embeddings is not None and (not isinstance(num_embeddings, int) or num_embeddings < 1):
            raise _psflow.InvalidArgumentError(
                f"{what}: num_embeddings is {num_embeddings!r}; give a positive int, or None for a dynamic table")
        if not isinstance(embedding_dim, int) or embedding_dim < 1:
            raise _psflow.InvalidArgumentError(f"{what}: embedding_dim is {embedding_dim!r}; give a positive int")
        _psflow._check_table_options(what, table_options)  # each value its field reads, or one line naming it
        if padding_idx is not None and num_embeddings is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise _psflow.InvalidArgumentError(
                    f"{what}: padding_idx {padding_idx} is outside [-{num_embeddings}, {num_embeddings})")
            if padding_idx < 0:
                padding_idx += num_embeddings
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.table_name = name
        self.table_options = {**_DEFAULTS, "seed": None, **table_options}
        for key, value in self.table_options.items():  # emb.initializer, emb.seed, ... as attributes
            setattr(self, key, value)
        self._kind = kind
        self._tables = None  # the open session's _Tables, set by psflow.WorkerSession
        self._index = -1
        self._declared = False  # a session took the declaration (_spec): nn.init on weight is too late
        self._collection = None  # the psflow.torch.EmbeddingBagCollection holding it, if any

    @property
    def weight(self):
        """No values: the rows live on the ps tasks. nn.init.* on it sets the table's initializer
        before the session (see _TableWeight); anything else is refused naming what to use."""
        return _TableWeight(self)

    def _what(self):
        return f"psflow.torch.{self._kind} '{self.table_name or '?'}'"

    def _spec(self, name, job_seed=0):
        """The declaration of the table named `name` in a job of --seed `job_seed`. Without seed=,
        the seed is table_seed(job_seed, name), kept in self.seed from then on."""
        if not self._seed_given:
            self.seed = table_seed(job_seed, name)
        self._declared = True
        options = {key: getattr(self, key) for key in _DEFAULTS}
        return {"name": name, "dim": self.embedding_dim, "num_embeddings": self.num_embeddings, **options}

    def _rows(self, ids):
        """(rows [U (+1 with padding), dim], index int64 like ids) for an integer tensor of ids."""
        if self._collection is not None:
            raise _psflow.FailedPreconditionError(
                f"{self._what()} belongs to a psflow.torch.EmbeddingBagCollection: call the collection with every "
                "table's ids at once (ids [batch, tables]), not one of its tables")
        tables = self._tables
        if tables is not None and self.padding_idx is None and isinstance(ids, torch.Tensor):
            taken = tables.rows_looked_up(self._index, ids)
            if taken is not None:  # the step's Lookup brought them (no copy of the ids to compare)
                return taken
        if tables is None:
            raise _psflow.FailedPreconditionError(
                f"psflow.torch.{self._kind} '{self.table_name or '?'}' needs an open psflow.WorkerSession: "
                "its rows live on the ps tasks (use it inside `with psflow.WorkerSession(model, flags) as sess:`)")
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
            kind = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise _psflow.InvalidArgumentError(
                f"table '{self._tables.name(self._index)}': ids are {kind}; pass an int64 (or int32) tensor of ids")
        if self.padding_idx is None:
            flat = ids.reshape(-1).to(torch.int64).contiguous()
            rows, index = self._tables.rows(self._index, flat.numpy())
            return rows, index.view(ids.shape)
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        keep = flat != self.padding_idx
        rows, sub = self._tables.rows(self._index, flat[keep].numpy())
        index = torch.full((flat.numel(),), rows.shape[0], dtype=torch.int64)  # padding: the extra zero row
        index[keep] = sub
        rows = torch.cat([rows, rows.new_zeros(1, self.embedding_dim)])
        return rows, index.view(ids.shape)

    def extra_repr(self):
        n = "dynamic" if self.num_embeddings is None else f"{self.num_embeddings}, {self.partition_strategy}"
        s = f"{n}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s + (f", name={self.table_name!r}" if self.table_name else "")


@_with_table_options
class Embedding(_Table):
    """Embedding(num_embeddings, embedding_dim, padding_idx=None, *, name=None, initializer=..., seed=None,
    partition_strategy="div", admit_after=0, steps_to_live=0, max_rows=0, evict_every=100, ...):
    nn.Embedding with its rows on the ps tasks.

    num_embeddings=None: a dynamic table (any int64 id; rows created on first push, admitted after
    `admit_after` pushes, evicted after `steps_to_live` steps without update or beyond `max_rows`).
    Row `id`'s initial value is a function of (initializer, seed, id) only; without seed=, the seed
    is table_seed(--seed, the table's name): every table its own rows. name: the table's name on
    the ps and in the checkpoints (default: the module's name in the model).
    forward(input) -> [*input.shape, dim].
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=True, _weight=None, device=None, dtype=None, *, name=None,
                 **table_options):
        if scale_grad_by_freq:
            raise _psflow.UnimplementedError("psflow.torch.Embedding: scale_grad_by_freq is not supported")
        if _weight is not None:
            raise _psflow.InvalidArgumentError(
                "psflow.torch.Embedding: _weight is not taken (the rows are made on the ps from initializer and seed)")
        super().__init__(num_embeddings, embedding_dim, padding_idx, name, max_norm, "Embedding", table_options)

    def forward(self, input):
        rows, index = self._rows(input)
        return F.embedding(index, rows)


@_with_table_options
class EmbeddingBag(_Table):
    """EmbeddingBag(num_embeddings, embedding_dim, mode="mean", padding_idx=None, *, name=None, ...):
    nn.EmbeddingBag with its rows on the ps tasks (mode "sum" or "mean"; the table options as for
    psflow.torch.Embedding). forward(input, offsets=None, per_sample_weights=None) -> [bags, dim],
    as nn.EmbeddingBag's (1-D input with offsets, or 2-D input of equal bags; include_last_offset).
    """

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 mode="mean", sparse=True, _weight=None, include_last_offset=False, padding_idx=None, device=None,
                 dtype=None, *, name=None, **table_options):
        if mode not in _MODES:
            raise _psflow.UnimplementedError(
                f"psflow.torch.EmbeddingBag: mode={mode!r} is not supported; use \"sum\" or \"mean\"")
        if scale_grad_by_freq:
            raise _psflow.UnimplementedError("psflow.torch.EmbeddingBag: scale_grad_by_freq is not supported")
        if _weight is not None:
            raise _psflow.InvalidArgumentError(
                "psflow.torch.EmbeddingBag: _weight is not taken (the rows are made on the ps from initializer "
                "and seed)")
        super().__init__(num_embeddings, embedding_dim, padding_idx, name, max_norm, "EmbeddingBag", table_options)
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(self, input, offsets=None, per_sample_weights=None):
        if isinstance(input, torch.Tensor) and input.dim() not in (1, 2):
            raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {input.dim()}")
        if isinstance(input, torch.Tensor) and input.dim() == 1 and offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        rows, index = self._rows(input)
        pad = rows.shape[0] - 1 if self.padding_idx is not None else None
        if index.dim() == 2:  # equal bags [B, L]: one table of a collection's [B, L, tables]
            weights = None if per_sample_weights is None else per_sample_weights.unsqueeze(2)
            if offsets is not None:
                raise ValueError("if input is 2D, then offsets has to be None, as input is treated is a mini-batch of "
                                 "fixed length sequences.")
            bags = _bags(index.unsqueeze(2), rows, None, weights, self.mode, False, pad)
        else:
            weights = None if per_sample_weights is None else per_sample_weights.view(-1, 1)
            bags = _bags(index.view(-1, 1), rows, offsets, weights, self.mode, self.include_last_offset, pad)
        return bags.squeeze(1)


def _one_id_per_bag(offsets, n, include_last_offset):
    """Whether `offsets` cut n ids into n bags of one (offsets == arange(n), then n with
    include_last_offset)."""
    if offsets.dim() != 1 or offsets.shape[0] != n + include_last_offset:
        return False
    return torch.equal(offsets, torch.arange(n + include_last_offset, dtype=offsets.dtype))


def _bags(index, rows, offsets, weights, mode, include_last_offset, pad):
    """The bags of every table as nn.EmbeddingBag forms them, [bags, tables, dim]: what
    EmbeddingBag (one table) and EmbeddingBagCollection (several, their rows in one leaf) compute,
    so a collection of F tables gives the bits of F EmbeddingBag modules.

    index: rows' index, [N, tables] (1-D input with offsets shared by every table, or without
    offsets one id per bag) or [B, L, tables] (bags of L ids); weights: per-sample weights shaped as
    index, or None; pad: the zero row padding ids point at, or None. One id per bag is a gather
    (F.embedding: its backward sums each row's gradients in example order); other bags go through
    one F.embedding_bag over every table's bags."""
    if index.dim() == 3 and index.shape[1] == 1:
        index = index.squeeze(1)
        weights = None if weights is None else weights.squeeze(1)
    if index.dim() == 2 and (offsets is None or _one_id_per_bag(offsets, index.shape[0], include_last_offset)):
        if weights is not None and mode != "sum":
            raise NotImplementedError("embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                                      f"supported for mode='sum' (got mode='{mode}'). Please open a feature request "
                                      "on GitHub.")
        out = F.embedding(index, rows)
        return out if weights is None else out * weights.unsqueeze(2)
    tables = index.shape[-1]
    if index.dim() == 3:  # [B, L, tables] -> the tables' bags one after another: [tables * B, L]
        b, length = index.shape[0], index.shape[1]
        flat = index.permute(2, 0, 1).reshape(tables * b, length)
        w = None if weights is None else weights.permute(2, 0, 1).reshape(tables * b, length)
        out = F.embedding_bag(flat, rows, None, mode=mode, per_sample_weights=w, padding_idx=pad)
        return out.view(tables, b, -1).transpose(0, 1)
    n = index.shape[0]
    flat = index.t().reshape(-1)  # table-major: table f's ids at [f * n, (f + 1) * n)
    w = None if weights is None else weights.t().reshape(-1)
    starts = offsets[:-1] if include_last_offset else offsets
    bags = starts.shape[0]
    if tables > 1:
        shift = torch.arange(tables, dtype=offsets.dtype).unsqueeze(1) * n
        cut = (starts.unsqueeze(0) + shift).reshape(-1)
        if include_last_offset:
            cut = torch.cat([cut, cut.new_full((1,), tables * n)])
    else:
        cut = offsets
    out = F.embedding_bag(flat, rows, cut, mode=mode, per_sample_weights=w, include_last_offset=include_last_offset,
                          padding_idx=pad)
    return out.view(tables, bags, -1).transpose(0, 1)


class EmbeddingBagCollection(torch.nn.Module):
    """EmbeddingBagCollection(tables): psflow.torch.EmbeddingBag tables of one dim and one mode,
    looked up together (TorchRec's EmbeddingBagCollection): a DLRM's F fields in one module.

        tables = psflow.torch.EmbeddingBagCollection(
            psflow.torch.EmbeddingBag(None, 16, mode="sum") for _ in range(26))
        embedded = tables(ids)             # ids [batch, 26] -> [batch, 26, 16]

    Each table stays a table of its own on the ps tasks (its name — the collection's module name and
    its position, `tables.0`, `tables.1`, ... as an nn.ModuleList of them gives, or its name= —, its
    spec, seed, rows and update rule's slots), so checkpoints, psflow.read_table_rows and a restore
    onto other ps tasks see the same tables as F separate modules. What changes is the worker's
    step: one forward hands every table's ids to the C++ session in one call and gets the batch's
    unique rows of all F tables as one leaf tensor [U_1 + ... + U_F, dim] and one index; backward
    leaves their gradients on that leaf, which step() lends to the session in one piece (each
    table's part read in place, no copy). The bags are EmbeddingBag's, bit for bit.

    forward(ids, offsets=None, per_sample_weights=None) -> [bags, F, dim]:
      ids [B, F]: one id per bag (column f: table f's); [N, F] with offsets [B] (or [B + 1] with
      include_last_offset): table f's bags cut from column f as EmbeddingBag cuts its 1-D input,
      the same offsets for every table; [B, F, L]: bags of L ids. per_sample_weights: shaped as
      ids (mode "sum"). int64 or int32 ids; a fixed table's in [0, num_embeddings).
    The tables: psflow.torch.EmbeddingBag modules without padding_idx, of one embedding_dim, mode
    and include_last_offset, in no other collection; indexable (`coll[f]`) like an nn.ModuleList.
    """

    def __init__(self, tables):
        super().__init__()
        what = "psflow.torch.EmbeddingBagCollection"
        tables = list(tables)
        if not tables:
            raise _psflow.InvalidArgumentError(f"{what}: no tables; give a list of psflow.torch.EmbeddingBag")
        first = tables[0] if isinstance(tables[0], EmbeddingBag) else None
        for f, t in enumerate(tables):
            if not isinstance(t, EmbeddingBag):
                raise _psflow.InvalidArgumentError(
                    f"{what}: table {f} is a {type(t).__name__}; give psflow.torch.EmbeddingBag modules")
            for attr in ("embedding_dim", "mode", "include_last_offset"):
                if getattr(t, attr) != getattr(first, attr):
                    raise _psflow.InvalidArgumentError(
                        f"{what}: table {f} has {attr}={getattr(t, attr)!r}, table 0 {getattr(first, attr)!r}; "
                        f"the tables of a collection share one {attr}")
            if t.padding_idx is not None:
                raise _psflow.UnimplementedError(
                    f"{what}: table {f} has padding_idx={t.padding_idx}; a collection's tables have none (use a "
                    "separate psflow.torch.EmbeddingBag for it)")
            if t._collection is not None or any(t is u for u in tables[:f]):
                raise _psflow.InvalidArgumentError(f"{what}: table {f} is in a collection already")
        for f, t in enumerate(tables):
            self.add_module(str(f), t)
            t._collection = self
        self.num_tables = len(tables)
        self.embedding_dim = first.embedding_dim
        self.mode = first.mode
        self.include_last_offset = first.include_last_offset
        self._tables = None  # the open session's _Tables, set by psflow.WorkerSession
        self._group = -1  # the session's group of the tables (one buffer of rows)
        self._first = -1  # its first table's index among the session's

    def __len__(self):
        return self.num_tables

    def __getitem__(self, f):
        return self._modules[str(f if f >= 0 else f + self.num_tables)]

    def __iter__(self):
        return iter(self._modules.values())

    def _what(self):
        names = [t.table_name for t in self]
        return f"psflow.torch.EmbeddingBagCollection of {self.num_tables} tables" + (
            f" ('{names[0]}' ...)" if names[0] else "")

    def forward(self, ids, offsets=None, per_sample_weights=None):
        tables = self._tables
        if tables is None:
            raise _psflow.FailedPreconditionError(
                f"{self._what()} needs an open psflow.WorkerSession: its rows live on the ps tasks (use it inside "
                "`with psflow.WorkerSession(model, flags) as sess:`)")
        n = self.num_tables
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32) or \
                ids.dim() not in (2, 3) or ids.shape[1] != n:
            got = (f"a {ids.dtype} tensor of shape {list(ids.shape)}" if isinstance(ids, torch.Tensor)
                   else f"a {type(ids).__name__}")
            raise _psflow.InvalidArgumentError(
                f"{self._what()}: ids are {got}; pass an int64 tensor [batch, {n}] (column f: table f's ids) or "
                f"[batch, {n}, bag]")
        if per_sample_weights is not None and (not isinstance(per_sample_weights, torch.Tensor) or
                                               per_sample_weights.shape != ids.shape):
            shape = list(per_sample_weights.shape) if isinstance(per_sample_weights, torch.Tensor) else "no tensor"
            raise _psflow.InvalidArgumentError(
                f"{self._what()}: per_sample_weights is {shape}; give one weight per id, shaped as ids {list(ids.shape)}")
        if ids.dim() == 3:
            if offsets is not None:
                raise _psflow.InvalidArgumentError(
                    f"{self._what()}: ids [batch, tables, bag] are bags of equal length already; pass offsets with "
                    "ids [N, tables] only")
            b, _, length = ids.shape
            rows, index = tables.group_rows(self, ids, by_table=ids.permute(1, 0, 2).reshape(n, b * length))
            weights = None if per_sample_weights is None else per_sample_weights.transpose(1, 2)
            return _bags(index.view(b, length, n), rows, None, weights, self.mode, False, None)
        rows, index = tables.group_rows(self, ids)
        return _bags(index, rows, offsets, per_sample_weights, self.mode, self.include_last_offset, None)

    def extra_repr(self):
        return f"{self.num_tables} tables, {self.embedding_dim}, mode={self.mode!r}"


def tables_of(module):
    """[(name, table module)] of a model, in named_modules() order; name: table_name or the module's name."""
    found = []
    for prefix, m in module.named_modules():
        if isinstance(m, _Table):
            found.append((m.table_name or prefix or type(m).__name__, m))
    return found


# The session's side (re-exported: psflow.torch._Tables and friends, as before).
from ._tables import _IdsLearner, _same, _TableIds, _Tables  # noqa: E402,F401
