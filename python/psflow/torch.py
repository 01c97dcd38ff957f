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


class _TableIds:
    """One flat int64 numpy array per table, as the session's calls take them, when they are the
    rows of one C-contiguous [tables, n] array (a DLRM's columns, learnt: _IdsLearner): `matrix`
    is that array, handed to C++ in one piece instead of one array per table. The rows (numpy
    views) are made when one is first asked for: a model whose tables are all in collections
    never asks.

    Made from a batch's [n, columns] ids and a modulus (`source`), the matrix — (ids % modulus).T's
    first rows — is made by the prefetch it is handed to, behind the training thread (prefetch());
    reading it first waits for that (settle), or, never handed over, makes it here."""

    __slots__ = ("_matrix", "_rows", "_count", "_source", "_settle")

    def __init__(self, matrix=None, source=None):
        self._matrix = matrix
        self._rows = None
        self._source = source  # (ids as a numpy array [n, columns], modulus, tables) or None
        self._count = matrix.shape[0] if matrix is not None else source[2]
        self._settle = None  # the session's settle() while the prefetch makes the matrix

    @property
    def matrix(self):
        if self._source is not None:  # not handed to a prefetch: made here
            x, modulus, count = self._source
            self._source = None
            self._matrix = _psflow._remainder_transposed(x, modulus)[:count]
        self.settle()
        return self._matrix

    def settle(self):
        """Waits for the prefetch making the matrix, if one is."""
        if self._settle is not None:
            settle, self._settle = self._settle, None
            settle()

    def prefetch(self, session, ahead):
        """Hands the ids to the session's prefetch (made there from the source, if any)."""
        if self._source is None:
            session.prefetch(self.matrix, ahead=ahead)
            return
        x, modulus, count = self._source
        self._source = None
        self._matrix = session.prefetch_columns(x, modulus, count, ahead=ahead)[:count]
        self._settle = session.settle

    def _all(self):
        if self._rows is None:
            self._rows = list(self.matrix)
        return self._rows

    def __len__(self):
        return self._count

    def __getitem__(self, t):
        return self._all()[t]

    def __iter__(self):
        return iter(self._all())


def _same(a, b):
    """Equal id arrays (int64, 1-D); the same array (the usual case: the ids announced are the ones
    looked up) without comparing them. Compared as bytes: 4x faster than np.array_equal on a batch."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes())


class _Tables:
    """The session's side of a model's tables for one worker session: per step, the ids each
    table's forward saw, the rows it was given (leaf tensors whose .grad backward fills), and what
    the C++ session's table batches hold, so that step() pushes exactly the rows the forward used.

    One round trip per step needs the step's ids of every table at once (the C++ Lookup takes them
    together): announced by WorkerSession.prefetch (the next batch's, riding on the push) or
    WorkerSession.lookup (this batch's). Without either, each table's first forward pulls its own
    rows (one Pull per table) and step() looks the batch up once more before pushing.

    An EmbeddingBagCollection's tables are a group of the C++ session (their rows in one buffer):
    its forward gets one leaf [U_1 + ... + U_F, dim] and one index [N, F] for all of them
    (group_rows), and step() lends that leaf's gradient in one piece, each table's part in place.
    """

    def __init__(self, session, modules, collections=()):
        self._session = session  # the _psflow._Session
        self._modules = modules
        self._n = len(modules)
        self._announced = None  # [ids or None] per table, for the step's first forward
        self._used = {}  # table -> [(ids numpy, rows leaf tensor, index tensor)] of this step, one per call
        self._held = [None] * self._n  # the ids the C++ session's batches were last looked up with
        # per table, (ids as a tensor, leaf, index) while its one use of the step is the announced
        # Lookup's (what rows_looked_up compares a forward's ids with), else None
        self._taken = [None] * self._n
        self._groups = list(collections)  # group g: its EmbeddingBagCollection (_first, num_tables)
        self._group_of = [-1] * self._n
        for g, c in enumerate(self._groups):
            self._group_of[c._first:c._first + c.num_tables] = [g] * c.num_tables
        self._ungrouped = [t for t in range(self._n) if self._group_of[t] < 0]
        # group -> [ids the forward gave, ids by table (numpy [F, N]), leaf, index, stamp] of this step
        self._group_used = {}
        self._stamp = 0  # Lookups so far: a group's leaf is lent as it is when its Lookup was the last
        self._prefetched = None  # the ids given to the last prefetch, until a Lookup
        self.after_lookup = None  # called after the step's announced Lookup (WorkerSession._early_prefetch)

    def name(self, t):
        return self._modules[t][0]

    @staticmethod
    def for_cpp(ids_list):
        """What the session's lookup and prefetch are given for `ids_list`: its matrix, or the list."""
        matrix = getattr(ids_list, "matrix", None)
        return ids_list if matrix is None else matrix

    def _lookup(self, ids_list):
        """The C++ Lookup: (rows, index) per table (None for a grouped one), then per group. Of the
        very ids the last prefetch was given, psflow's own (learnt) array: the session's copy of
        them is looked up, not compared again."""
        if ids_list is self._prefetched and isinstance(ids_list, _TableIds):
            out = self._session.lookup(None)
        else:
            out = self._session.lookup(self.for_cpp(ids_list))
        self._prefetched = None  # (a prefetch is used once)
        self._held = ids_list if isinstance(ids_list, _TableIds) else list(ids_list)
        self._stamp += 1
        return out

    def prefetch(self, ids_list, ahead):
        """The next batch's ids (one array or None per table) to the C++ prefetch."""
        if isinstance(ids_list, _TableIds):
            ids_list.prefetch(self._session, ahead)
        else:
            self._session.prefetch(self.for_cpp(ids_list), ahead=ahead)
        self._prefetched = ids_list

    def settle(self):
        """Waits for the announced ids being made behind the training thread (before the batch
        they came from is handed to the script, which may change it)."""
        if isinstance(self._announced, _TableIds):
            self._announced.settle()

    def announce(self, ids_list):
        self._announced = ids_list

    def rows_looked_up(self, t, ids):
        """(rows, index shaped as ids) when table t's one use of this step was made for exactly
        `ids` (an int64 tensor, compared in place): the step's Lookup of the announced ids; else None."""
        taken = self._taken[t]
        if taken is None or ids.dtype is not torch.int64:
            return None
        if ids.dim() == 1:  # (a DLRM's column: no reshape nor view)
            return (taken[1], taken[2]) if torch.equal(ids, taken[0]) else None  # (False for another size)
        if not torch.equal(ids.reshape(-1), taken[0]):
            return None
        return taken[1], taken[2].view(ids.shape)

    def _take_announced(self):
        """The step's Lookup of the announced ids (served by the prefetch when it brought them):
        every table's and group's rows become this step's leaves."""
        announced = self._announced
        self._announced = None
        looked = self._lookup(announced)
        if self.after_lookup is not None:
            self.after_lookup()
        used, taken = self._used, self._taken
        matrix = getattr(announced, "matrix", None)
        # the announced ids as tensors (what rows_looked_up compares with): one call for a matrix
        ungrouped = self._ungrouped
        as_tensors = torch.from_numpy(matrix).unbind(0) if matrix is not None and ungrouped else None
        from_numpy = torch.from_numpy
        for u in ungrouped:
            ids_u = announced[u]
            if ids_u is not None and u not in used:
                rows, index = looked[u]
                leaf = from_numpy(rows).requires_grad_(True)
                index = from_numpy(index)
                used[u] = [(ids_u, leaf, index)]
                taken[u] = (as_tensors[u] if as_tensors is not None else from_numpy(ids_u), leaf, index)
        for g, c in enumerate(self._groups):
            rows, index = looked[self._n + g]
            by_table = self._announced_group(announced, c)
            if index is None or by_table is None or g in self._group_used:
                continue
            self._group_used[g] = [None, by_table, from_numpy(rows).requires_grad_(True), from_numpy(index),
                                   self._stamp]

    def rows(self, t, ids):
        uses = self._used.get(t, [])
        for used in uses:  # a second call of the step with the same ids
            if _same(used[0], ids):
                return used[1], used[2]
        if not uses and self._announced is not None and self._announced[t] is not None and \
                _same(self._announced[t], ids):
            self._take_announced()
            used = self._used.get(t)
            if used is not None and _same(used[0][0], ids):
                return used[0][1], used[0][2]
            self._used.pop(t, None)
            self._taken[t] = None
        # Its own Pull; a table called again in the step with other ids (one table for two fields,
        # as nn.EmbeddingBag allows) gets a leaf of its own, and before_step sums the leaves'
        # gradients per id.
        ids_list = [None] * self._n
        ids_list[t] = ids
        rows, index = self._lookup(ids_list)[t]
        leaf = torch.from_numpy(rows)
        if torch.is_grad_enabled():
            leaf.requires_grad_(True)
            self._used.setdefault(t, []).append((ids, leaf, torch.from_numpy(index)))
            self._taken[t] = None  # a second use: rows_looked_up no longer answers for the table
        return leaf, torch.from_numpy(index)

    # --- collections (EmbeddingBagCollection: a group of tables) ------------------------------------

    @staticmethod
    def _announced_group(announced, c):
        """The announced ids of collection c's tables as one numpy array [F, N] (a view of the
        announced matrix when there is one), or None when one of them is missing or their lengths differ."""
        import numpy as np

        first, count = c._first, c.num_tables
        matrix = getattr(announced, "matrix", None)
        if matrix is not None:
            return matrix[first:first + count]
        parts = announced[first:first + count]
        if any(p is None for p in parts) or len({p.shape[0] for p in parts}) != 1:
            return None
        return np.stack(parts)

    @staticmethod
    def _group_ids_equal(ids, by_table, known):
        """Whether a forward's ids (ids [N, F], or its ids by table [F, M]) are `known` ([F, N] numpy)."""
        if by_table is not None:
            m = by_table.numpy()
            return m.shape == known.shape and m.tobytes() == known.tobytes()
        return _psflow._equal_transposed(ids.numpy(), known)

    def group_rows(self, c, ids, by_table=None):
        """(leaf [U_1 + ... + U_F, dim], index [N, F]) for collection c's forward: ids [N, F] (column
        f: table f's), or by_table [F, M] (row f: table f's) when given. The rows of the announced
        Lookup when the ids are the announced ones, else a Lookup of their own (one call)."""
        g = c._group
        if ids.dtype is not torch.int64 or not ids.is_contiguous():
            ids = ids.to(torch.int64).contiguous()
        if by_table is not None:
            by_table = by_table.to(torch.int64).contiguous()
        used = self._group_used.get(g)
        if used is None and self._announced is not None:
            known = self._announced_group(self._announced, c)
            if known is not None and self._group_ids_equal(ids, by_table, known):
                self._take_announced()
                used = self._group_used.get(g)
                if used is not None:  # (its ids: the ones just compared)
                    used[0] = ids
        if used is not None:
            if used[0] is ids or self._group_ids_equal(ids, by_table, used[1]):
                used[0] = ids
                return used[2], used[3]
            if torch.is_grad_enabled():
                raise _psflow.FailedPreconditionError(
                    f"{c._what()}: called again in the step with other ids; call it once per step with every "
                    "batch's ids (or use separate psflow.torch.EmbeddingBag modules)")
        m = (by_table if by_table is not None else ids.t()).contiguous().numpy()
        if c.num_tables == self._n:
            ids_list = _TableIds(m)  # (one array)
        else:
            ids_list = [None] * self._n
            ids_list[c._first:c._first + c.num_tables] = list(m)
        rows, index = self._lookup(ids_list)[self._n + g]
        leaf, index = torch.from_numpy(rows), torch.from_numpy(index)
        if torch.is_grad_enabled():
            leaf.requires_grad_(True)
            self._group_used[g] = [ids, m, leaf, index, self._stamp]
        return leaf, index

    def _group_grads(self, relooked=False):
        """[(group, gradient, its address, its size)] of the groups whose leaf has a gradient, to lend
        as they are; None when a group's tables were looked up again since (unless `relooked`: the
        Lookup before_step made with the group's ids, whose deduplication is the leaf's rows)."""
        out = []
        for g, (_, _, leaf, _, stamp) in self._group_used.items():
            grad = leaf.grad
            if grad is None:
                continue
            if stamp != self._stamp and not relooked:
                return None
            if not grad.is_contiguous():
                grad = grad.contiguous()
            out.append((g, grad, grad.data_ptr(), grad.numel()))
        return out

    def _drop_group_grads(self):
        for used in self._group_used.values():  # (a later backward must not add into lent memory)
            used[2].grad = None

    def ids_seen(self, t):
        """The ids table t's forwards were called with in this step (concatenated), or None."""
        import numpy as np

        g = self._group_of[t]
        if g >= 0:
            used = self._group_used.get(g)
            return None if used is None else used[1][t - self._groups[g]._first]
        uses = self._used.get(t)
        if not uses:
            return None
        return uses[0][0] if len(uses) == 1 else np.concatenate([u[0] for u in uses])

    def before_step(self):
        """Hands the step's unique rows' gradients to the C++ session (after a Lookup with the
        step's ids when the session's batches hold others): lent, not copied — the session holds
        the tensors until its push has read them (after step() returns when the push is deferred)."""
        import numpy as np

        groups = self._group_grads()
        if groups is not None and self._lend_simple(groups):
            return
        pushed = {}
        for t, uses in self._used.items():
            with_grad = [u for u in uses if u[1].grad is not None]
            if with_grad:
                pushed[t] = with_grad
        # Per table, the ids the session's batch must hold: a leaf's own ids, or (called more than
        # once) every leaf's unique ids one after another; a group's tables, the group's.
        want = {}
        for t, uses in pushed.items():
            if len(uses) == 1:
                want[t] = uses[0][0]
            else:
                parts = []
                for ids, leaf, index in uses:
                    unique = np.empty(leaf.shape[0], dtype=np.int64)
                    unique[index.numpy().reshape(-1)] = ids
                    parts.append(unique)
                want[t] = np.concatenate(parts)
        for g, (_, by_table, leaf, _, _) in self._group_used.items():
            if leaf.grad is not None:
                first = self._groups[g]._first
                for k in range(by_table.shape[0]):
                    want[first + k] = by_table[k]
        looked = None
        if groups is None or any(len(uses) > 1 for uses in pushed.values()) or \
                any(self._held[t] is None or not _same(self._held[t], want[t]) for t in pushed):
            looked = self._lookup([want.get(t) for t in range(self._n)])
        grads = []  # (table, its unique rows' gradients), lent to C++ in one call (not copied)
        for t, uses in pushed.items():
            if len(uses) == 1:
                leaf = uses[0][1]
                grads.append((t, leaf.grad.numpy()))
                leaf.grad = None  # (a backward through a graph kept alive must not add into the lent memory)
                continue
            rows, index = looked[t]  # the union of the leaves' ids; index: each listed id's row there
            grad = torch.zeros(rows.shape[0], rows.shape[1])
            at = torch.from_numpy(index)
            start = 0
            for _, leaf, _ in uses:
                grad.index_add_(0, at[start:start + leaf.shape[0]], leaf.grad)
                start += leaf.shape[0]
            grads.append((t, grad.numpy()))
        groups = self._group_grads(relooked=True)
        self._drop_group_grads()
        if groups:
            self._session.set_tables_grads(grads, groups)
        elif grads:
            self._session.set_tables_grads(grads)

    def _lend_simple(self, groups):
        """before_step's usual case, in one pass: each table used once in the step, and the
        session's batches hold the very ids it used (the step's Lookup); `groups`: the groups'
        gradients (_group_grads). False (nothing done) when another case needs the general path."""
        held = self._held
        grads, leaves = [], []
        f32 = torch.float32
        for t, uses in self._used.items():
            if len(uses) != 1:
                return False
            ids, leaf, _ = uses[0]
            grad = leaf.grad
            if grad is None:
                continue
            if held[t] is not ids:
                return False
            if grad.dtype is f32 and grad.is_contiguous():  # (always: the leaf's layout) read at its address
                grads.append((t, grad, grad.data_ptr(), grad.numel()))
            else:
                grads.append((t, grad.numpy()))
            leaves.append(leaf)
        for leaf in leaves:  # (a backward through a graph kept alive must not add into the lent memory)
            leaf.grad = None
        self._drop_group_grads()
        if groups:
            self._session.set_tables_grads(grads, groups)
        elif grads:
            self._session.set_tables_grads(grads)
        return True

    def after_step(self):
        self._used = {}
        self._taken = [None] * self._n
        self._group_used = {}


class _IdsLearner:
    """A batch's ids per table, learnt from the step's first forwards: for each table, which integer
    tensor of the batch (or which column of a 2-D one) gave the ids its forwards saw, as they are or
    `% num_embeddings` (a fixed table's usual hashing). WorkerSession.batches(iterable) without an
    ids function uses it to prefetch the next batch's rows. A table whose ids come otherwise (several
    columns, another transform) is not learnt: its forwards pull their own rows, as without prefetch.
    A wrong guess costs speed only: a forward whose ids differ from the announced ones pulls."""

    def __init__(self, modules):
        self._modules = modules  # [(name, module)]
        self._recipes = None  # per table: (path, column or None, modulus or None), or None
        self._matrix = None  # (path, modulus) when table t takes column t of that tensor % modulus, for every t

    @property
    def learnt(self):
        return self._recipes is not None

    @staticmethod
    def _leaves(batch, path=()):
        if isinstance(batch, torch.Tensor):
            if not batch.is_floating_point() and not batch.is_complex() and batch.dtype != torch.bool:
                yield path, batch
        elif isinstance(batch, (tuple, list)):
            for i, x in enumerate(batch):
                yield from _IdsLearner._leaves(x, path + (i,))
        elif isinstance(batch, dict):
            for k, x in batch.items():
                yield from _IdsLearner._leaves(x, path + (k,))

    @staticmethod
    def _at(batch, path, column):
        for key in path:
            batch = batch[key]
        return batch if column is None else batch[:, column]

    def _candidate(self, module, tensor):
        flat = tensor.reshape(-1).to(torch.int64)
        if module.padding_idx is not None:
            flat = flat[flat != module.padding_idx]
        return flat.numpy()

    def learn(self, batch, seen):
        """seen(t): the ids table t's forwards got this step (flat, no padding), or None."""
        import numpy as np

        leaves = list(self._leaves(batch))
        self._recipes = []
        self._matrix = None
        for t, (_, m) in enumerate(self._modules):
            ids = seen(t)
            recipe = None
            if ids is not None:
                for path, tensor in leaves:
                    columns = [None] + (list(range(tensor.shape[1])) if tensor.dim() == 2 else [])
                    for column in columns:
                        raw = self._at(batch, path, column)
                        for modulus in (None,) if m.num_embeddings is None else (None, m.num_embeddings):
                            x = raw if modulus is None else raw % modulus
                            if x.numel() >= ids.size and np.array_equal(self._candidate(m, x), ids):
                                recipe = (path, column, modulus)
                                break
                        if recipe:
                            break
                    if recipe:
                        break
            self._recipes.append(recipe)
        # Every table taking column t of one tensor with one modulus, in order, no padding (a DLRM):
        # ids_list hands that tensor's transposed remainder over as one array.
        first = self._recipes[0] if self._recipes else None
        if first is not None and first[1] is not None and first[2] is not None and all(
                r is not None and r[0] == first[0] and r[1] == t and r[2] == first[2] and m.padding_idx is None
                for t, (r, (_, m)) in enumerate(zip(self._recipes, self._modules))):
            self._matrix = (first[0], first[2])

    def ids(self, batch):
        """{module: ids} of the learnt tables for `batch`. Tables taking columns of one tensor with
        one modulus (a DLRM's [B, fields] ids) share one `%` and one transposed copy of it, each
        table's ids a contiguous row of that copy (one op per tensor instead of two per table)."""
        out = {}
        columns = {}  # (path, modulus) -> that tensor % modulus, transposed: [columns, B]
        for (_, m), recipe in zip(self._modules, self._recipes or []):
            if recipe is None:
                continue
            path, column, modulus = recipe
            if column is None:
                x = self._at(batch, path, None)
                out[m] = x if modulus is None else x % modulus
                continue
            by_column = columns.get((path, modulus))
            if by_column is None:
                x = self._at(batch, path, None)
                by_column = columns[(path, modulus)] = (x if modulus is None else x % modulus).t().contiguous()
            out[m] = by_column[column]
        return out

    def ids_list(self, batch, flat_ids):
        """ids(batch) in table order, each table's ids as flat_ids(t, ids) makes them (a flat int64
        numpy array, padding ids left out) or None. The columns of an int64 tensor go over as rows of
        one numpy view of its transposed copy, as they are (flat_ids would return them unchanged):
        no per-table tensor, check or dict."""
        if self._matrix is not None:
            path, modulus = self._matrix
            x = self._at(batch, path, None)
            if x.dtype is torch.int64 and x.device.type == "cpu" and x.is_contiguous() and x.dim() == 2:
                # (x % modulus).T's rows: each table's ids, made by the prefetch they are handed to
                return _TableIds(source=(x.numpy(), modulus, len(self._modules)))
        out = [None] * len(self._modules)
        columns = {}  # (path, modulus) -> that tensor % modulus, transposed: [columns, B] (numpy when int64)
        for t, ((_, m), recipe) in enumerate(zip(self._modules, self._recipes or [])):
            if recipe is None:
                continue
            path, column, modulus = recipe
            if column is None:
                x = self._at(batch, path, None)
                out[t] = flat_ids(t, x if modulus is None else x % modulus)
                continue
            by_column = columns.get((path, modulus))
            if by_column is None:
                x = self._at(batch, path, None)
                if modulus is not None and x.dtype is torch.int64 and x.device.type == "cpu" and x.is_contiguous():
                    # (x % modulus).t().contiguous() in one pass, by multiplication: 4x faster
                    by_column = _psflow._remainder_transposed(x.numpy(), modulus)
                else:
                    by_column = (x if modulus is None else x % modulus).t().contiguous()
                    if by_column.dtype is torch.int64:
                        by_column = by_column.numpy()
                columns[(path, modulus)] = by_column
            ids = by_column[column]
            out[t] = ids if m.padding_idx is None and not isinstance(ids, torch.Tensor) else flat_ids(t, ids)
        return out
