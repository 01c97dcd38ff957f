"""Overlap of a PyTorch worker's step with its compute (--overlap, docs/pytorch.md#overlap).

  * push (and push_pull): a hook on each dense parameter's gradient accumulator — the node
    autograd adds the parameter's gradient into, as horovod/torch/optimizer.py does — hands the
    gradient to the C++ session as soon as loss.backward() has finished it, so the push to the ps
    tasks runs while backward goes on for the layers below (table rows and row-sparse gradients go
    with step(), the push's last part).
  * push_pull: a forward pre-hook on each module that holds parameters waits for those values only,
    so the next forward starts on the first layers while the later ones are still being pulled
    (the session pulls in the parameters' order, named_parameters()). A parameter read outside its
    own module's forward (a weight used directly by its parent, a penalty over model.parameters())
    would not be waited for: the first step checks that every parameter that got a gradient belongs
    to a module whose forward ran, and otherwise the whole module waits for every value (one line
    says so).

The hooks are kept cheap (docs/pytorch.md#overlap): a hook marks its parameter and adds it to a
bucket; the bucket goes to C++ in one call (gradients_ready) once it holds EARLY_PART_BYTES, the
C++ session's own part size, and step() pushes what is left as the last part. `auto` installs
no hooks at all when nothing could leave before the last part: walking the trainable dense
parameters backward from the last one (the order backward usually finishes them), no bucket of
EARLY_PART_BYTES closes before the first parameter (the mlp: its first layer holds 99 % of the
bytes and is finished last) — the hooks would cost time and hide none.

Owned by psflow.WorkerSession (session.py); removed when the session ends.
"""
import sys

from . import _psflow

# The C++ session's early part size (src/train/session.cc kEarlyPartBytes): gradients go to the
# ps in parts of at least this many bytes while backward runs.
EARLY_PART_BYTES = 64 << 10


def early_bytes(params, trainable, sparse):
    """The gradient bytes that could be pushed before the last part if backward finished the
    parameters in reverse order: every bucket of EARLY_PART_BYTES that closes before the first
    trainable dense parameter."""
    early = bucket = 0
    dense = [p for i, (_, p) in enumerate(params) if trainable[i] and not sparse[i]]
    for k, p in enumerate(reversed(dense)):
        bucket += p.numel() * 4
        if bucket >= EARLY_PART_BYTES and k < len(dense) - 1:
            early += bucket
            bucket = 0
    return early


class Overlap:
    def __init__(self, session, module, params, trainable, sparse, mode):
        """`session`: the _psflow._Session; `params`: named_parameters() (the session's order)."""
        self._session = session
        self._module = module
        self._params = params
        if mode == "auto":  # a script may read its parameters between steps: push_pull only by name
            mode = "push" if early_bytes(params, trainable, sparse) > 0 else "none"
        self._mode = mode
        self._handles = []
        self._accumulators = []  # the gradient accumulators hooked (kept alive, as Horovod does)
        self.handed = [False] * len(params)
        self._none_handed = [False] * len(params)
        self._bucket = []  # parameters handed over by their hooks, not yet given to C++
        self._bucket_bytes = 0
        self._per_module = mode == "push_pull"
        self._calibrating = self._per_module
        self._fired = set()  # modules whose pre-hook ran during the calibrating step
        self._owner = {}     # parameter index -> the module holding it directly
        if mode == "none":
            return
        index_of = {id(p): i for i, (_, p) in enumerate(params)}
        for i, (name, p) in enumerate(params):
            if not trainable[i] or sparse[i]:
                continue
            # The AccumulateGrad node of p (p.expand_as(p)'s input): its hook runs once the
            # parameter's gradient of this backward is accumulated into p.grad.
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            self._handles.append(accumulator.register_hook(self._gradient_hook(i)))
            self._accumulators.append(accumulator)
        if mode == "push_pull":
            for m in module.modules():
                own = [index_of[id(p)] for p in m.parameters(recurse=False) if id(p) in index_of]
                if not own:
                    continue
                for i in own:
                    self._owner.setdefault(i, m)
                self._handles.append(m.register_forward_pre_hook(self._pre_hook(own)))
            # The root waits for everything when a parameter is read outside its module's forward.
            self._handles.append(module.register_forward_pre_hook(self._root_hook))

    def _gradient_hook(self, i):
        nbytes = self._params[i][1].numel() * 4
        param = self._params[i][1]
        handed = self.handed

        def hook(*_):
            if handed[i]:
                raise _psflow.InvalidArgumentError(
                    f"parameter '{self._params[i][0]}' got a second gradient before step(): with --overlap its first "
                    "was already pushed; call step() after each backward, or accumulate several backward passes "
                    "with --overlap=none")
            grad = param.grad
            mine = self._grads[i]
            if grad is not mine:  # autograd made a new tensor (zero_grad(set_to_none)), or none
                if grad is None or grad.is_sparse:
                    return
                mine.copy_(grad)
            handed[i] = True
            bucket = self._bucket
            bucket.append(i)
            self._bucket_bytes += nbytes
            if self._bucket_bytes >= EARLY_PART_BYTES:
                self._bucket = []
                self._bucket_bytes = 0
                self._session.gradients_ready(bucket)
        return hook

    def _pre_hook(self, own):
        def hook(module, _inputs):
            if self._calibrating:
                self._fired.add(id(module))
            if self._per_module:
                self._session.wait_for_values(own)
        return hook

    def _root_hook(self, _module, _inputs):
        if not self._per_module:
            self._session.wait_for_values([])

    def attach(self, grads):
        """The session's gradient memory (after open), by parameter index (None: not trainable)."""
        self._grads = grads

    def after_backward(self, ready):
        """In step(), before the push: `ready[i]` whether parameter i has a gradient this step. Ends
        the calibrating step (see the module's doc)."""
        if not self._calibrating:
            return
        self._calibrating = False
        for i, has in enumerate(ready):
            owner = self._owner.get(i)
            if has and (owner is None or id(owner) not in self._fired):
                self._per_module = False
                print(f"psflow: parameter '{self._params[i][0]}' is read outside its own module's forward; "
                      "each forward waits for every value (--overlap=push_pull pulls them in order still)",
                      file=sys.stderr, flush=True)
                return

    @property
    def mode(self):
        """none, push or push_pull: what --overlap became (auto: push, or none for a model whose
        gradients could not leave before the last part)."""
        return self._mode

    def step_done(self):
        """After step(): the parameters still in the bucket went with the step (its last part)."""
        self.handed[:] = self._none_handed  # in place: the hooks hold the list
        self._bucket = []
        self._bucket_bytes = 0

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self._accumulators = []
