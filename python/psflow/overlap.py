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

Owned by psflow.WorkerSession (session.py); removed when the session ends.
"""
import sys

from . import _psflow


class Overlap:
    def __init__(self, session, module, params, trainable, sparse, mode):
        """`session`: the _psflow._Session; `params`: named_parameters() (the session's order)."""
        self._session = session
        self._module = module
        self._params = params
        if mode == "auto":  # a script may read its parameters between steps: push_pull only by name
            mode = "push"
        self._mode = mode
        self._handles = []
        self._accumulators = []  # the gradient accumulators hooked (kept alive, as Horovod does)
        self.handed = [False] * len(params)
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
        def hook(*_):
            name, p = self._params[i]
            if self.handed[i]:
                raise _psflow.InvalidArgumentError(
                    f"parameter '{name}' got a second gradient before step(): with --overlap its first was "
                    "already pushed; call step() after each backward, or accumulate several backward passes "
                    "with --overlap=none")
            grad = p.grad
            if grad is None or grad.is_sparse:
                return
            mine = self._grads[i]
            if grad.data_ptr() != mine.data_ptr():  # autograd made a new tensor (zero_grad(set_to_none))
                mine.copy_(grad)
            self.handed[i] = True
            self._session.gradient_ready(i)
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

    def step_done(self):
        self.handed = [False] * len(self._params)

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self._accumulators = []
