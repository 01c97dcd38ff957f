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
from collections.abc import Mapping

from . import _psflow
from .threads import set_compute_threads

_SPARSE_MODULES = ("Embedding", "EmbeddingBag")


def _number(what, value):
    try:
        return float(value)  # a float, an int, a numpy scalar, a one-element tensor
    except (TypeError, ValueError):
        raise _psflow.InvalidArgumentError(
            f"{what} is {type(value).__name__}; give a number (a float, an int, a 0-d tensor)") from None


def _checked_evaluate(evaluate):
    """The script's evaluate(), its result checked at once and handed to C++ as [(name, float)]."""
    if not callable(evaluate):
        raise _psflow.InvalidArgumentError(
            f"evaluate must be a function returning a dict of name -> number, got {type(evaluate).__name__}")

    def call():
        result = evaluate()
        if not isinstance(result, Mapping):
            raise _psflow.InvalidArgumentError(
                f"evaluate() returned {type(result).__name__}; return a dict of name -> number, "
                "e.g. {'validation_accuracy': 0.97, 'validation_perplexity': 3.1}")
        scalars = []
        ctr = None
        for name, value in result.items():
            if not isinstance(name, str):
                raise _psflow.InvalidArgumentError(f"evaluate() returned the key {name!r}; keys must be str names")
            if name == "ctr" and isinstance(value, Mapping):
                ctr = dict(value)  # a ctr model's test figures: the summary's `ctr` block
                continue
            scalars.append((name, _number(f"evaluate()'s '{name}'", value)))
        return scalars, ctr

    return call


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
    if p.storage_offset() != 0 or p.storage().size() != p.numel():
        # The session moves each parameter into memory of its own: a view would be cut loose from
        # its base silently (the base would stop seeing the trained values). Refused instead.
        raise _psflow.InvalidArgumentError(
            f"parameter '{name}' is a view of a larger tensor ({p.storage().size()} elements, this one "
            f"{p.numel()} at offset {p.storage_offset()}); psflow gives each parameter memory of its own, "
            "which would cut it loose from its base: make it a tensor of its own (nn.Parameter(t.clone()))")


def _script_model_name():
    """The running script's name without .py ("mnist_mlp"), or None (an interactive session): a
    module's class name says little ("Sequential")."""
    import os

    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not script or script in ("-c", "-m") or script.startswith("<"):
        return None
    return script[:-3] if script.endswith(".py") else script


class WorkerSession:
    """WorkerSession(module, flags, evaluate=None, model_name=None, optimizer=None): a context manager.

    Entering it (or open()) connects; the chief (worker 0) initializes the ps variables from the
    module's values, or restores the newest checkpoint of --checkpoint_dir; the other workers wait
    for the chief. The parameters then hold the current values.

        with psflow.WorkerSession(model, flags, evaluate=evaluate) as sess:
            while not sess.should_stop():
                idx = sess.batch_indices(num_examples, flags.batch_size)
                ...forward, loss.backward()...
                sess.step(loss, accuracy)

    evaluate: called by the chief at close() with the final values in the parameters, and every
      --eval_every_steps global steps during training; returns a dict of name -> number. Every
      name reaches the summary line, --metrics_json and TensorBoard as given (validation_accuracy,
      validation_cross_entropy, test_accuracy and test_cross_entropy are the summary's own
      fields; those not returned are absent, never 0). Anything but a dict of numbers is refused
      at the call with one line.
    model_name: the summary's "model" and the checkpoints' metadata (default: the script's name
      without .py, e.g. "mnist_mlp"; the module's class name when there is no script); a
      checkpoint of another model name is refused at restore.
    optimizer: a psflow.optim optimizer (torch.optim's arguments, parameter groups and a schedule)
      the ps tasks apply, instead of --optimizer / --learning_rate / --lr_decay_* (docs/pytorch.md).
    An exception inside the `with` block aborts the job when raised on the chief (the ps tasks exit
    non-zero with its message); other workers just leave.
    """

    def __init__(self, module, flags, evaluate=None, model_name=None, optimizer=None):
        import torch

        if not isinstance(module, torch.nn.Module):
            raise _psflow.InvalidArgumentError(
                f"WorkerSession needs a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(flags, _psflow.Flags):
            raise _psflow.InvalidArgumentError(
                "WorkerSession needs the flags of psflow.parse_flags()")
        set_compute_threads(flags.intra_op_threads)  # before the first op of the session
        self._module = module
        self._flags = flags
        self._evaluate = evaluate
        self._params = list(module.named_parameters())
        from . import torch as tables  # psflow.torch: the model's tables
        self._table_modules = tables.tables_of(module)
        names = [n for n, _ in self._table_modules]
        for n in names:
            if names.count(n) > 1:
                raise _psflow.InvalidArgumentError(
                    f"two psflow.torch tables are named '{n}' (a module used twice is one table; give distinct "
                    "name= to distinct tables)")
        if not self._params and not self._table_modules:
            raise _psflow.InvalidArgumentError("the module has no parameters to train")
        for name, p in self._params:
            _check_parameter(name, p)
        sparse_names = _sparse_parameter_names(module)
        self._sparse = [name in sparse_names for name, _ in self._params]
        self._trainable = [p.requires_grad for _, p in self._params]
        optimizer_config = None
        if optimizer is not None:
            from . import optim

            if not isinstance(optimizer, optim.Optimizer):
                raise _psflow.InvalidArgumentError(
                    f"WorkerSession(optimizer=...) needs a psflow.optim optimizer, got {type(optimizer).__name__}")
            optimizer_config = optimizer._bind(self._params)
        self._session = _psflow._Session(
            flags, [n for n, _ in self._params], [list(p.shape) for _, p in self._params],
            self._trainable, model_name or _script_model_name() or type(module).__name__,
            _checked_evaluate(evaluate) if evaluate is not None else None, optimizer_config,
            [m._spec(n, flags.seed) for n, m in self._table_modules],
            waits_for_values=flags.overlap == "push_pull")  # (auto: push)
        self._overlap = None
        self._collections = self._group_collections(module, tables)
        self._tables = tables._Tables(self._session, self._table_modules, self._collections) \
            if self._table_modules else None
        if self._tables is not None:
            self._tables.after_lookup = self._early_prefetch
        self._table_index = None  # _ids_list's {table name or id(module): position}, made once
        self._next_ids = None
        self._next_ids_from = None  # batches() without ids: the next batch's ids, known after the forward
        self._next_ids_early = False  # _next_ids_from may be called before this step's forwards end
        self._next_ids_sent = False  # _next_ids went to C++ already (early_prefetch)
        self._values = []
        self._grads = []
        self._samplers = {}
        self.summary = None
        self._opened = False

    def _group_collections(self, module, tables):
        """The model's psflow.torch.EmbeddingBagCollections, each made a group of the C++ session
        (its tables' rows in one buffer), in group order."""
        found = [m for m in module.modules() if isinstance(m, tables.EmbeddingBagCollection)]
        position = {id(m): t for t, (_, m) in enumerate(self._table_modules)}
        for c in found:
            first = position[id(c[0])]
            if [position[id(t)] for t in c] != list(range(first, first + c.num_tables)):
                raise _psflow.InvalidArgumentError(
                    f"{c._what()}: its tables are not one after another among the model's tables (one of them is "
                    "also a module elsewhere in the model); give each collection tables of its own")
            c._first = first
            c._group = self._session.group_tables(first, c.num_tables)
        return found

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
        self._known = {id(p) for _, p in self._params}
        self._num_module_params = len(self._params)
        self._structure = self._module_structure()
        from .overlap import Overlap

        self._overlap = Overlap(self._session, self._module, self._params, self._trainable, self._sparse,
                                self._flags.overlap)
        self._overlap.attach(self._grads)
        self._opened = True
        sys.stdout.flush()  # the script's own lines before the session's (C++ stdout)
        # No cluster flags and no $TF_CONFIG: the C++ session trains alone, with a ps task of its
        # own on a thread of this process (src/train/in_process_ps.h), and says so.
        self._session.open()
        for t, (_, m) in enumerate(self._table_modules):
            if m._tables is not None:
                raise _psflow.FailedPreconditionError(
                    f"table '{m.table_name}' already belongs to another open worker session")
            m._tables, m._index = self._tables, t
        for c in self._collections:
            c._tables = self._tables
        return self

    def _detach_tables(self):
        if self._overlap is not None:
            self._overlap.remove()
        for _, m in self._table_modules:
            if m._tables is self._tables:
                m._tables, m._index = None, -1
        for c in self._collections:
            if c._tables is self._tables:
                c._tables = None

    def close(self):
        """Chief: pulls the final values, saves the final checkpoint, calls evaluate(), prints
        the summary, writes --metrics_json and ends the job. Others: leave. Returns the summary."""
        if not self._opened:
            raise _psflow.FailedPreconditionError("close() before the worker session is open")
        sys.stdout.flush()
        try:
            self.summary = self._session.close()
        finally:
            self._detach_tables()
        return self.summary

    def abort(self, reason):
        """After a failure: the chief aborts the job (the ps tasks exit non-zero with `reason`)."""
        self._abort(str(reason), False)

    def _abort(self, reason, aborted):
        self._detach_tables()
        self._session.abort(reason, aborted)

    def __enter__(self):
        try:
            return self.open()
        except BaseException as e:  # __exit__ is not called for a failed __enter__
            if self._opened:
                self._abort(f"{type(e).__name__}: {e}", isinstance(e, _psflow.AbortedError))
            raise

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                self.close()
            except BaseException as e:  # a close that failed before the end aborts the job
                self._abort(f"{type(e).__name__}: {e}", isinstance(e, _psflow.AbortedError))
                raise
            return False
        if self._opened:
            self._detach_tables()
            aborted = isinstance(exc, _psflow.AbortedError)
            self._abort(f"{exc_type.__name__}: {exc}" if not aborted else str(exc), aborted)
        return False

    # --- training -----------------------------------------------------------------------------

    def should_stop(self):
        """True once the global step reached --train_steps (or training ended elsewhere)."""
        return self._session.should_stop()

    def step(self, loss, accuracy=float("nan")):
        """Pushes the parameters' gradients and pulls the new values into the parameters (one call
        per ps task), advancing the global step; logs progress, feeds telemetry, and the chief
        checkpoints on schedule. The gradients are zeroed afterwards. Async with
        --overlap=push_pull it returns once the push is handed over: the next forward waits for the
        values (read them outside a forward after wait_for_values()), global_step is the last
        answer's plus one until the next step(), and a failure of the push is raised by the next
        call (docs/pytorch.md#overlap)."""
        if not self._opened:
            raise _psflow.FailedPreconditionError(
                "step() before the worker session is open: use `with psflow.WorkerSession(...) as sess:` "
                "or call open() first")
        self._check_no_new_parameters()
        handed = self._overlap.handed
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
                elif g is self._grads[i] or g.data_ptr() == self._grad_ptrs[i]:
                    ready = True
                else:  # autograd made a new tensor (e.g. after zero_grad(set_to_none=True))
                    if not handed[i]:  # (a handed one was copied by its hook, and is being pushed)
                        self._grads[i].copy_(g)
                    p.grad = self._grads[i]
                    ready = True
            dense_ready.append(ready)
        self._overlap.after_backward(dense_ready)
        loss = float(loss)
        accuracy = float(accuracy)
        if self._tables is not None:
            self._tables.before_step()
            ahead = False  # a prefetch given after the forward rides on the push ...
            if self._next_ids_from is not None:
                self._next_ids, self._next_ids_from = self._next_ids_from(), None
                ahead = True  # ... but sess.batches' is pulled ahead (async) whenever it is known
            if self._next_ids is not None and not self._next_ids_sent:  # after this step's lookups
                self._tables.prefetch(self._next_ids, ahead=ahead)
        try:
            self._session.step(loss, accuracy, dense_ready, sparse)
        finally:
            self._overlap.step_done()
            if self._tables is not None:
                self._tables.after_step()
                self._tables.announce(self._next_ids)
                self._next_ids = None
                self._next_ids_sent = False

    def _early_prefetch(self):
        """Right after the step's Lookup (the first table forward): the next batch's ids, when they
        are known already, go to C++ now; their dedup runs beside the rest of the forward and the
        backward (the binding's helper thread) instead of inside step()."""
        if self._next_ids_from is not None and self._next_ids_early:
            self._next_ids, self._next_ids_from = self._next_ids_from(), None
        if self._next_ids is not None and not self._next_ids_sent:
            # Async: the rows are pulled now, beside the rest of the forward and the backward
            # (one step stale: they miss this step's update); sync: they ride on the step's push.
            self._tables.prefetch(self._next_ids, ahead=True)
            self._next_ids_sent = True

    def _module_structure(self):
        """The module's submodules' dicts of parameters and of submodules, and how many entries
        they hold: a parameter or module added anywhere changes the count (cheaper per step than
        walking module.parameters())."""
        dicts = [d for m in self._module.modules() for d in (m._parameters, m._modules)]
        return dicts, sum(map(len, dicts))

    def _check_no_new_parameters(self):
        """A parameter added to the module after the session was made is on no ps task: its
        gradient would be dropped silently. Refused, naming it."""
        dicts, size = self._structure
        if sum(map(len, dicts)) == size:
            return
        self._structure = self._module_structure()
        count = sum(1 for _ in self._module.parameters())
        if count == self._num_module_params:
            return
        for name, p in self._module.named_parameters():
            if id(p) not in self._known:
                raise _psflow.InvalidArgumentError(
                    f"parameter '{name}' is not on the ps tasks (it was added to the module after the "
                    "WorkerSession was made, so nothing would push or update it): build the whole module "
                    "before the session")
        self._num_module_params = count

    def wait_for_values(self):
        """Waits until every parameter holds the values of the last step's pull. With
        --overlap=push_pull the pull runs in forward order behind step() and each module's forward
        waits for its own values; call this before reading parameters outside a forward between
        steps (a state_dict, a norm)."""
        self._session.wait_for_values([])

    def gradient_ready(self, parameter):
        """Hands `parameter`'s (a parameter of the module, or its name) final gradient of this step
        to the push now (the session's own hooks do this during backward; for a custom backward).
        A parameter that is not on the ps tasks is refused."""
        for i, (name, p) in enumerate(self._params):
            if (isinstance(parameter, str) and parameter == name) or parameter is p:
                if self._overlap.handed[i]:
                    return
                if p.grad is None or not self._trainable[i] or self._sparse[i]:
                    raise _psflow.InvalidArgumentError(
                        f"gradient_ready('{name}'): it has no dense gradient to push")
                if p.grad.data_ptr() != self._grad_ptrs[i]:
                    self._grads[i].copy_(p.grad)
                self._overlap.handed[i] = True
                self._session.gradient_ready(i)
                return
        what = (f"'{parameter}'" if isinstance(parameter, str)
                else f"a {type(parameter).__name__} of shape {tuple(getattr(parameter, 'shape', ()))}")
        raise _psflow.InvalidArgumentError(
            f"gradient_ready: {what} is not a parameter on the ps tasks (not among the module's "
            "named_parameters() when the session was made)")

    # --- tables (psflow.torch.Embedding / EmbeddingBag) ------------------------------------------

    def _ids_list(self, ids_by_table, what):
        """One flat int64 numpy array (padding ids left out) or None per table, in declaration order."""
        import torch

        if self._tables is None:
            raise _psflow.FailedPreconditionError(f"{what}: the model has no psflow.torch tables")
        if not self._opened:
            raise _psflow.FailedPreconditionError(f"{what} before the worker session is open")
        index = self._table_index
        if index is None:  # once: a table's name or module -> its position
            index = self._table_index = {}
            for t, (n, m) in enumerate(self._table_modules):
                index[n] = t
                index[id(m)] = t
        out = [None] * len(self._table_modules)
        for key, ids in ids_by_table.items():
            t = index.get(key if isinstance(key, str) else id(key))
            if t is None:
                raise _psflow.InvalidArgumentError(
                    f"{what}: {key!r} is not one of the model's tables ({', '.join(n for n, _ in self._table_modules)})")
            out[t] = self._flat_ids(t, ids)
        return out

    def _flat_ids(self, t, ids):
        """Table t's ids (a tensor or array) as one flat int64 numpy array, padding ids left out."""
        import torch

        m = self._table_modules[t][1]
        if not isinstance(ids, torch.Tensor):
            ids = torch.as_tensor(ids)
        if ids.dtype is torch.int64 and ids.dim() == 1 and ids.is_contiguous():
            flat = ids  # (the usual case, e.g. a learnt column: no reshape, cast or copy to ask for)
        elif ids.dtype not in (torch.int64, torch.int32):
            raise _psflow.InvalidArgumentError(
                f"table '{self._table_modules[t][0]}': ids are {ids.dtype}; pass an int64 (or int32) tensor of ids")
        else:
            flat = ids.reshape(-1).to(torch.int64).contiguous()
        if m.padding_idx is not None:
            flat = flat[flat != m.padding_idx]
        return flat.numpy()

    def lookup(self, ids_by_table):
        """Announces this step's ids of every table ({table name or module: ids as the forward gets
        them}), so the step's first table forward fetches all tables' rows in one call per ps (or
        takes the rows prefetch() brought). Optional: without it each table's forward pulls its own."""
        self._tables.announce(self._ids_list(ids_by_table, "lookup()"))

    def prefetch(self, next_ids_by_table):
        """Gives the next batch's ids of every table ({table name or module: ids}), before step():
        their rows ride back with step()'s push (one round trip per step), and the next step's
        forwards use them when they see the same ids. Given before this step's forwards (as
        batches() does), in async mode they are pulled at once instead, beside the forward and the
        backward (docs/pytorch.md#overlap): rows both batches share then miss this step's update."""
        self._next_ids = self._ids_list(next_ids_by_table, "prefetch()")

    def batches(self, iterable, ids=None):
        """Wraps the user's batch iterator for one round trip per step: yields its batches while
        announcing each one's table ids (ids(batch) -> {table name or module: ids}) and prefetching
        the next one's before the step (async: its rows pulled at once, beside the compute, one
        step stale). Stops at the iterator's end or once should_stop().

        Without `ids`, each table's ids are learnt from the first step's forwards (which tensor of
        the batch, or which column, as is or % num_embeddings: psflow._tables._IdsLearner) and the
        next batch's are taken the same way at each step; a table whose ids come otherwise pulls
        its own rows in its forward.

        In async mode a psflow.DistributedBatchSampler (or a DataLoader drawing from one) is not
        read ahead: its next batch is known only after the step's push (data_step), and a batch
        drawn before it would be another worker's. Each batch is then announced (one Pull per ps
        for all tables) instead of prefetched."""
        from .data import draws_from_distributed_sampler

        if ids is None and self._tables is None:
            yield from iterable
            return
        # What differs between given and learnt ids: the first batch's announcement, a batch
        # announced when it is not read ahead, and the next batch's ids given before the step.
        if ids is not None:
            first = announce = lambda current: self.lookup(ids(current))

            def ahead(current, following):
                self.prefetch(ids(following))
        else:
            first, announce, ahead = self._learnt_ids()
        if not self.sync and draws_from_distributed_sampler(iterable):  # not read ahead (see above)
            for current in iterable:
                announce(current)
                yield current
                self._next_ids_from = None
                if self.should_stop():
                    return
            return
        it = iter(iterable)
        try:
            current = next(it)
        except StopIteration:
            return
        first(current)
        while not self.should_stop():
            try:
                following = next(it)
            except StopIteration:
                following = None
            if following is not None:
                ahead(current, following)
            if self._tables is not None:
                self._tables.settle()  # (the batch's ids may be read behind for its prefetch)
            yield current
            self._next_ids_from = None
            if following is None:
                return
            current = following

    def _learnt_ids(self):
        """batches()' three steps when the ids are learnt from the first step's forwards: the first
        batch is pulled by its forwards; after that each batch's ids are taken as they were learnt,
        in step() (after the forwards) for a batch read ahead."""
        from ._tables import _IdsLearner, _TableIds

        learner = _IdsLearner(self._table_modules)
        seen = self._tables.ids_seen

        def first(current):
            pass

        def announce(current):
            if learner.learnt:
                self.lookup(learner.ids(current))
            else:  # learnt in step(), after the forwards
                self._next_ids_from = lambda: learner.learn(current, seen)
                self._next_ids_early = False

        def ahead(current, following):
            def next_ids():  # in step(), after the forwards (once learnt: after the first Lookup)
                if not learner.learnt:
                    learner.learn(current, seen)
                # (learner.ids as _ids_list gives them, without its per-table dict and checks)
                ids = learner.ids_list(following, self._flat_ids)
                return ids if isinstance(ids, _TableIds) or any(i is not None for i in ids) else None

            self._next_ids_from = next_ids
            self._next_ids_early = learner.learnt

        return first, announce, ahead

    def log_scalar(self, name, value):
        """Writes a scalar of the script's (e.g. a gradient norm, the learning rate it uses) to
        TensorBoard under --logdir at the current global step, as `name`. The chief's are written;
        other workers write no event files, so theirs are dropped."""
        if not self._opened:
            raise _psflow.FailedPreconditionError("log_scalar() before the worker session is open")
        if not isinstance(name, str):
            raise _psflow.InvalidArgumentError(f"log_scalar: the name must be a str, got {type(name).__name__}")
        self._session.log_scalars([(name, _number(f"log_scalar('{name}', ...)'s value", value))])

    def add_clicks(self, probabilities, labels):
        """A click-through-rate model's batch: its predicted click probabilities (torch.sigmoid of
        the logits) and its labels (0 or 1), added to the running AUC and log-loss the progress line
        shows (" auc A log_loss L", over the examples since the last line). Call before step()."""
        import numpy as np

        if not self._opened:
            raise _psflow.FailedPreconditionError("add_clicks() before the worker session is open")

        def flat(x):
            if hasattr(x, "detach"):
                x = x.detach().reshape(-1).float().numpy()
            return np.ascontiguousarray(np.asarray(x, dtype=np.float32).reshape(-1))

        self._session.add_clicks(flat(labels), flat(probabilities))

    def batch_indices(self, num_examples, batch_size=None):
        """This worker's next batch (docs/design.md#data-order), as psflow train's workers take it:
        numpy int64 indices into the training examples. Sync: slice worker_index of global batch
        `global_step`; async: batch `data_step` of the one-worker stream (see data_step)."""
        if batch_size is None:
            batch_size = self._flags.batch_size
        key = (int(num_examples), int(batch_size))
        sampler = self._samplers.get(key)
        if sampler is None:
            sampler = _psflow.BatchSampler(key[0], key[1], self._session.data_worker_index,
                                           self._session.data_num_workers, self._flags.seed)
            self._samplers[key] = sampler
        return sampler.batch(self._session.data_step)

    def sampling_seed(self):
        """A seed for a script that draws its own batches (torch.randint and the like): distinct
        per worker and per data position, so workers do not draw the same batches and a resumed
        job or restarted worker does not draw its first ones again. Call after open():
        torch.manual_seed(sess.sampling_seed()). (psflow.DistributedBatchSampler needs none.)"""
        if not self._opened:
            raise _psflow.FailedPreconditionError("sampling_seed() before the worker session is open")
        mask = (1 << 63) - 1
        x = (self._flags.seed * 0x9E3779B97F4A7C15 + (self.worker_index + 1) * 0xBF58476D1CE4E5B9 +
             (self.data_step + 1) * 0x94D049BB133111EB) & mask
        x ^= x >> 31
        return (x * 0xD6E8FEB86659FD93) & mask

    # --- state --------------------------------------------------------------------------------

    @property
    def data_step(self):
        """The batch this worker takes next (docs/pytorch.md#data). Sync: the global step (the
        worker takes its slice of that global batch). Async: a batch of the one-worker stream —
        S + N - 1 after a push that claimed global step S (each push claims its own step, so the
        workers' batches are disjoint and the stream is taken in order), S + worker_index right
        after open at global step S (a resumed job continues at its checkpoint's step)."""
        return self._session.data_step

    @property
    def global_step(self):
        return self._session.global_step

    @property
    def learning_rate(self):
        """The learning rate of the next update (the ps tasks' schedule at the global step; a
        parameter group with its own lr scales it). Also logged to TensorBoard as learning_rate."""
        return self._session.learning_rate

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

