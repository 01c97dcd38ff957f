"""psflow.optim: torch.optim's optimizers and schedules, applied by the ps tasks.

    opt = psflow.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                              {"params": no_decay, "weight_decay": 0.0}], lr=3e-4, betas=(0.9, 0.95))
    psflow.optim.lr_scheduler.CosineAnnealing(opt, T_max=10000, warmup_steps=500)
    with psflow.WorkerSession(model, flags, optimizer=opt) as sess:
        ...
        sess.step(loss)            # the ps tasks apply AdamW at sess.learning_rate

The classes take torch.optim's arguments and parameter groups (dicts with "params" and their own
"lr" and "weight_decay"), and compute as torch.optim does (convention "torch" of
psflow/optim/optimizer.h). Nothing here updates a tensor: the WorkerSession hands the config to the
chief, whose Initialize carries it to every ps task, and the ps tasks' C++ rules apply it (one
implementation; `psflow train` runs the same rules with TensorFlow's conventions). Schedules count
global steps (one per sess.step() in sync mode, one per push in async mode), not epochs.

What the ps cannot do is refused with one line rather than ignored: groups that differ in anything
but lr and weight_decay, amsgrad, SGD dampening, centered RMSprop, Adagrad lr_decay, maximize.
"""
import sys
import types

from . import _psflow

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "lr_scheduler"]

_GROUP_KEYS = ("lr", "weight_decay")  # what may differ between parameter groups on the ps


def _invalid(message):
    return _psflow.InvalidArgumentError(message)


class Optimizer:
    """Base of psflow.optim's optimizers: torch.optim.Optimizer's param_groups and defaults."""

    _name = None  # the ps rule

    def __init__(self, params, defaults, schedule=None):
        import torch

        if isinstance(params, torch.Tensor):
            raise _invalid(f"{type(self).__name__}: params must be an iterable of tensors or of dicts, "
                           "not a tensor (pass model.parameters())")
        params = list(params)
        if not params:
            raise _invalid(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        self.defaults = dict(defaults)
        self.param_groups = []
        for i, group in enumerate(params):
            if not isinstance(group, dict) or "params" not in group:
                raise _invalid(f"{type(self).__name__}: parameter group {i} must be a dict with 'params'")
            p = group["params"]
            tensors = [p] if isinstance(p, torch.Tensor) else list(p)
            tensors = [t[1] if isinstance(t, tuple) else t for t in tensors]  # named_parameters() pairs
            for t in tensors:
                if not isinstance(t, torch.Tensor):
                    raise _invalid(f"{type(self).__name__}: parameter group {i} holds a {type(t).__name__}, "
                                   "not a tensor")
            full = dict(self.defaults)
            for key, value in group.items():
                if key == "params":
                    continue
                if key not in self.defaults:
                    raise _invalid(f"{type(self).__name__}: parameter group {i} has unknown option '{key}'")
                if key not in _GROUP_KEYS and value != self.defaults[key]:
                    raise _invalid(
                        f"{type(self).__name__}: parameter group {i} sets {key}={value!r} unlike the optimizer's "
                        f"{self.defaults[key]!r}; on the ps only lr and weight_decay may differ between groups")
                full[key] = value
            full["params"] = tensors
            self.param_groups.append(full)
        self.schedule = None
        if schedule is not None:
            schedule._attach(self)
        if self.defaults.get("maximize"):
            raise _invalid(f"{type(self).__name__}: maximize=True is not supported on the ps (negate the loss)")
        self._check()

    def _check(self):
        """Subclasses refuse what the ps rules do not implement."""

    def _rule(self):
        """The ps rule's fields (name, convention, hyper-parameters) from the defaults."""
        raise NotImplementedError

    def config(self, named_parameters=None):
        """The ps tasks' optimizer config (a dict of psflow/optim/optimizer.h's OptimizerConfig).

        named_parameters: (name, tensor) pairs (module.named_parameters()) naming the groups'
        parameters; every one must be in exactly one group (psflow updates every trainable
        parameter). Without it, the config has no groups (the first group's settings).
        """
        d = self.defaults
        c = {"convention": "torch", "learning_rate": float(d["lr"]), "weight_decay": float(d["weight_decay"])}
        c.update(self._rule())
        if self.schedule is not None:
            c.update(self.schedule._fields())
        if named_parameters is None:
            return c
        names = {}
        for name, p in named_parameters:
            names.setdefault(id(p), name)
        seen = {}
        groups = []
        for i, group in enumerate(self.param_groups):
            variables = []
            for t in group["params"]:
                name = names.get(id(t))
                if name is None:
                    raise _invalid(f"{type(self).__name__}: parameter group {i} holds a tensor of shape "
                                   f"{tuple(t.shape)} that is not a parameter of the module")
                if name in seen:
                    raise _invalid(f"{type(self).__name__}: parameter '{name}' is in groups {seen[name]} and {i}")
                seen[name] = i
                variables.append(name)
            if group["lr"] != d["lr"] or group["weight_decay"] != d["weight_decay"]:
                groups.append({"variables": variables, "learning_rate": float(group["lr"]),
                               "lr_scale": 1.0, "weight_decay": float(group["weight_decay"])})
        missing = [name for name, p in named_parameters if name not in seen and p.requires_grad]
        if missing:
            raise _invalid(f"{type(self).__name__}: parameter '{missing[0]}' of the module is in no parameter "
                           "group; the ps updates every trainable parameter: add it to a group, or set "
                           "requires_grad=False")
        if groups:
            c["groups"] = groups
        return c

    def learning_rate_at(self, step, name=None):
        """The learning rate at global step `step` (of parameter `name`'s group when given, with
        named_parameters from the module given to config()): the ps tasks' own function."""
        if name is None:
            return _psflow._learning_rate_at(self.config(), int(step))
        if getattr(self, "_named_config", None) is None:
            raise _psflow.FailedPreconditionError(
                "learning_rate_at(step, name): the optimizer knows parameter names once given to a WorkerSession")
        return _psflow._learning_rate_at(self._named_config, int(step), name)

    def _bind(self, named_parameters):
        """The config for a module's parameters (WorkerSession calls it), checked now."""
        self._named_config = self.config(list(named_parameters))
        _psflow._check_optimizer(self._named_config)
        return self._named_config

    def step(self, closure=None):
        raise _psflow.FailedPreconditionError(
            f"{type(self).__name__}.step(): psflow.optim updates on the ps tasks; call sess.step(loss) instead")

    def zero_grad(self, set_to_none=False):
        """Zeroes the groups' gradients (sess.step() already does after each push)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.zero_()


class SGD(Optimizer):
    """torch.optim.SGD: w -= lr * g (momentum: buffer b = mu b + g; nesterov: g + mu b); weight_decay
    adds wd * w to g. dampening must be 0."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                 maximize=False, schedule=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize), schedule)

    def _check(self):
        if self.defaults["dampening"] != 0:
            raise _invalid("SGD: dampening must be 0 on the ps (torch's default)")
        if self.defaults["nesterov"] and self.defaults["momentum"] <= 0:
            raise _invalid("SGD: nesterov needs momentum > 0")

    def _rule(self):
        d = self.defaults
        if d["momentum"] == 0:
            return {"name": "sgd"}
        return {"name": "momentum", "momentum": float(d["momentum"]), "nesterov": bool(d["nesterov"])}


class Adam(Optimizer):
    """torch.optim.Adam (weight_decay: L2 added to the gradient). amsgrad is not supported."""

    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
                 maximize=False, schedule=None):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize), schedule)

    def _check(self):
        if self.defaults["amsgrad"]:
            raise _invalid(f"{type(self).__name__}: amsgrad is not supported on the ps")

    def _rule(self):
        b1, b2 = self.defaults["betas"]
        return {"name": "adamw" if self._decoupled else "adam", "beta1": float(b1), "beta2": float(b2),
                "adam_epsilon": float(self.defaults["eps"])}


class AdamW(Adam):
    """torch.optim.AdamW: w *= 1 - lr * weight_decay, then Adam."""

    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False,
                 maximize=False, schedule=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize, schedule)


class Adagrad(Optimizer):
    """torch.optim.Adagrad: acc += g^2; w -= lr * g / (sqrt(acc) + eps). lr_decay must be 0."""

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10,
                 maximize=False, schedule=None):
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, eps=eps,
                                      maximize=maximize), schedule)

    def _check(self):
        if self.defaults["lr_decay"] != 0:
            raise _invalid("Adagrad: lr_decay must be 0 on the ps; use a schedule (psflow.optim.lr_scheduler)")

    def _rule(self):
        d = self.defaults
        return {"name": "adagrad", "initial_accumulator": float(d["initial_accumulator_value"]),
                "adagrad_epsilon": float(d["eps"])}


class RMSprop(Optimizer):
    """torch.optim.RMSprop: ms = alpha ms + (1 - alpha) g^2; w -= lr * g / (sqrt(ms) + eps), through a
    momentum buffer when momentum > 0. centered is not supported."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False,
                 maximize=False, schedule=None):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, maximize=maximize), schedule)

    def _check(self):
        if self.defaults["centered"]:
            raise _invalid("RMSprop: centered=True is not supported on the ps")

    def _rule(self):
        d = self.defaults
        return {"name": "rmsprop", "rms_decay": float(d["alpha"]), "rms_momentum": float(d["momentum"]),
                "rms_epsilon": float(d["eps"])}


# --- schedules ------------------------------------------------------------------------------------


class _Schedule:
    """A learning-rate schedule over global steps, computed by the ps tasks (LearningRateAt)."""

    def __init__(self, optimizer):
        self.optimizer = None
        if optimizer is not None:
            if not isinstance(optimizer, Optimizer):
                raise _invalid(f"{type(self).__name__}: the first argument must be a psflow.optim optimizer, "
                               f"got {type(optimizer).__name__}")

    def _attach(self, optimizer):
        if optimizer.schedule is not None and optimizer.schedule is not self:
            raise _invalid(f"{type(self).__name__}: the optimizer already has a schedule "
                           f"({type(optimizer.schedule).__name__}); combine them with LinearWarmup(then=...)")
        optimizer.schedule = self
        self.optimizer = optimizer

    def _fields(self):
        raise NotImplementedError

    def step(self, *args, **kwargs):
        raise _psflow.FailedPreconditionError(
            f"{type(self).__name__}.step(): psflow schedules follow the global step on the ps tasks; "
            "drop scheduler.step() (read sess.learning_rate)")


class ExponentialLR(_Schedule):
    """torch's ExponentialLR: lr * gamma^step."""

    def __init__(self, optimizer=None, gamma=0.1):
        super().__init__(optimizer)
        self.gamma = gamma
        if optimizer is not None:
            self._attach(optimizer)

    def _fields(self):
        return {"schedule": "exponential", "decay_steps": 1, "decay_rate": float(self.gamma), "staircase": False}


class ExponentialDecay(_Schedule):
    """tf.train.exponential_decay (psflow train's --lr_decay_*): lr * rate^(step / decay_steps)."""

    def __init__(self, optimizer=None, decay_steps=1, decay_rate=0.96, staircase=False):
        super().__init__(optimizer)
        self.decay_steps, self.decay_rate, self.staircase = decay_steps, decay_rate, staircase
        if optimizer is not None:
            self._attach(optimizer)

    def _fields(self):
        return {"schedule": "exponential", "decay_steps": int(self.decay_steps),
                "decay_rate": float(self.decay_rate), "staircase": bool(self.staircase)}


class StepLR(_Schedule):
    """torch's StepLR: lr * gamma^floor(step / step_size)."""

    def __init__(self, optimizer=None, step_size=1, gamma=0.1):
        super().__init__(optimizer)
        self.step_size, self.gamma = step_size, gamma
        if optimizer is not None:
            self._attach(optimizer)

    def _fields(self):
        return {"schedule": "exponential", "decay_steps": int(self.step_size), "decay_rate": float(self.gamma),
                "staircase": True}


class CosineAnnealing(_Schedule):
    """torch's CosineAnnealingLR(T_max, eta_min) over global steps, held at eta_min after T_max; with
    warmup_steps, a linear warmup from warmup_start_factor * lr first and the cosine's T_max steps
    after it (torch's SequentialLR of LinearLR and CosineAnnealingLR)."""

    def __init__(self, optimizer=None, T_max=1, eta_min=0.0, warmup_steps=0, warmup_start_factor=0.0):
        super().__init__(optimizer)
        self.T_max, self.eta_min = T_max, eta_min
        self.warmup_steps, self.warmup_start_factor = warmup_steps, warmup_start_factor
        if optimizer is not None:
            self._attach(optimizer)

    def _fields(self):
        return {"schedule": "cosine", "cosine_steps": int(self.T_max), "min_learning_rate": float(self.eta_min),
                "warmup_steps": int(self.warmup_steps), "warmup_start_factor": float(self.warmup_start_factor)}


class LinearWarmup(_Schedule):
    """torch's LinearLR(start_factor, end_factor=1, total_iters=warmup_steps): lr * (f + (1 - f) step / W)
    for step < W, then `then` (another schedule, counted from W) or the constant lr."""

    def __init__(self, optimizer=None, warmup_steps=1, start_factor=0.0, then=None):
        super().__init__(optimizer)
        self.warmup_steps, self.start_factor, self.then = warmup_steps, start_factor, then
        if then is not None and (not isinstance(then, _Schedule) or isinstance(then, LinearWarmup)):
            raise _invalid("LinearWarmup: then= must be another psflow.optim.lr_scheduler schedule, not a warmup")
        if then is not None and getattr(then, "warmup_steps", 0):
            raise _invalid("LinearWarmup: the schedule given as then= has its own warmup_steps")
        if optimizer is not None:
            self._attach(optimizer)

    def _fields(self):
        f = self.then._fields() if self.then is not None else {"schedule": "exponential", "decay_steps": 0}
        f.update({"warmup_steps": int(self.warmup_steps), "warmup_start_factor": float(self.start_factor)})
        return f


class PiecewiseConstant(_Schedule):
    """tf.train.piecewise_constant: values[0] while step <= boundaries[0], values[i] while step <=
    boundaries[i], values[-1] after. values are learning rates of the optimizer's lr; a group with
    another lr gets them scaled by its lr / the optimizer's."""

    def __init__(self, optimizer=None, boundaries=(), values=(1.0,)):
        super().__init__(optimizer)
        self.boundaries, self.values = list(boundaries), list(values)
        if optimizer is not None:
            self._attach(optimizer)

    def _fields(self):
        return {"schedule": "piecewise", "boundaries": [int(b) for b in self.boundaries],
                "values": [float(v) for v in self.values]}


lr_scheduler = types.ModuleType("psflow.optim.lr_scheduler",
                                "Learning-rate schedules over global steps, computed by the ps tasks.")
for _s in (ExponentialLR, ExponentialDecay, StepLR, CosineAnnealing, LinearWarmup, PiecewiseConstant):
    setattr(lr_scheduler, _s.__name__, _s)
lr_scheduler.CosineAnnealingLR = CosineAnnealing  # torch's name
lr_scheduler.__all__ = ["ExponentialLR", "ExponentialDecay", "StepLR", "CosineAnnealing", "CosineAnnealingLR",
                        "LinearWarmup", "PiecewiseConstant"]
sys.modules[lr_scheduler.__name__] = lr_scheduler
del _s
