"""The worker session's side of psflow.torch's tables (python/psflow/torch.py holds the modules):
per step, which ids each table's (or collection's) forward saw, the rows and leaves it was given,
the C++ session's lookups, prefetches and the gradients lent to it (_Tables), and the learning of
a batch's ids per table from the first step's forwards (_IdsLearner). Made and driven by
psflow.WorkerSession (session.py); no state of a script's.
"""
import torch

from . import _psflow


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
    """Equal id arrays (int64, any shape); the same array (the usual case: the ids announced are the ones
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

    def _take_announced(self, known=None):
        """The step's Lookup of the announced ids (served by the prefetch when it brought them):
        every table's and group's rows become this step's leaves. `known`: (g, group g's announced
        ids as _announced_group made them), when the caller has them already."""
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
            by_table = known[1] if known is not None and known[0] == g else self._announced_group(announced, c)
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
            return _same(by_table.numpy(), known)
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
                self._take_announced((g, known))
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
