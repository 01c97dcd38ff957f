"""psflow.optim against torch.optim itself: each rule and schedule runs on a real ps task (the C++
`psflow train --job_name=ps`, 1 ps, 1 worker, sync) while torch.optim runs the same model, data
and gradients in this process; after every step the parameters must agree within 1e-6 relative
(max |psflow - torch| / max |torch| per parameter), and sess.learning_rate must be torch's lr.

Run: PYTHONPATH=build/python PSFLOW_BINARY=build/psflow /usr/bin/python3 -m unittest -v test_optim
(from python/tests; CTest does this). PSFLOW_OPTIM_REPORT=1 prints the worst error of each case.
"""
import copy
import os
import subprocess
import sys
import tempfile
import unittest
import warnings

import torch

import psflow

HERE = os.path.dirname(os.path.abspath(__file__))
BINARY = os.environ.get("PSFLOW_BINARY", os.path.join(HERE, "..", "..", "build", "psflow"))
TIMEOUT = 120
RTOL = 1e-6
STEPS = 15

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "lib"))
from localhost import free_ports  # noqa: E402  (tests/lib/localhost.py)

O = psflow.optim
S = psflow.optim.lr_scheduler
TS = torch.optim.lr_scheduler
# torch 1.13's SequentialLR steps its schedulers with an epoch and warns about it.
EPOCH_WARNING = "The epoch parameter in `scheduler.step()`"


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 6)
        self.fc2 = torch.nn.Linear(6, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def data():
    g = torch.Generator().manual_seed(11)
    return torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g)


def loss_of(model, x, y, step):
    # The scale changes per step so that adaptive rules see gradients of different sizes.
    return ((model(x) - y) ** 2).mean() * (1.0 + 0.3 * (step % 4))


def groups_of(model, spec):
    """spec: None (all parameters) or a list of (names, options) for param groups."""
    if spec is None:
        return model.parameters()
    named = dict(model.named_parameters())
    return [dict(params=[named[n] for n in names], **opts) for names, opts in spec]


def relative_error(got, want):
    scale = want.abs().max().item()
    return (got - want).abs().max().item() / max(scale, 1e-30)


class OptimAgainstTorchTest(unittest.TestCase):
    worst = {}

    @classmethod
    def tearDownClass(cls):
        if os.environ.get("PSFLOW_OPTIM_REPORT"):
            for name, err in sorted(cls.worst.items()):
                print(f"{name:40s} max relative error {err:.2e}")

    def compare(self, name, psflow_opt, torch_opt, groups=None, schedule=None, torch_schedule=None):
        """Trains Net for STEPS sync steps on a 1-ps cluster with psflow_opt(params, schedule) and in
        this process with torch_opt(params) and torch_schedule(opt); compares after every step."""
        torch.manual_seed(3)
        model = Net()
        reference = copy.deepcopy(model)
        x, y = data()
        ref_opt = torch_opt(groups_of(reference, groups))
        warnings.filterwarnings("ignore", message=EPOCH_WARNING)
        ref_sched = torch_schedule(ref_opt) if torch_schedule else None
        opt = psflow_opt(groups_of(model, groups))
        if schedule is not None:
            schedule(opt)
        ports = free_ports(2)
        cluster = [f"--ps_hosts=127.0.0.1:{ports[0]}", f"--worker_hosts=127.0.0.1:{ports[1]}"]
        names = {id(p): n for n, p in model.named_parameters()}
        worst = 0.0
        with tempfile.TemporaryDirectory() as d:
            log_path = os.path.join(d, "ps.log")
            with open(log_path, "w") as log:
                env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "PSFLOW_FLAGS")}
                ps = subprocess.Popen([BINARY, "train", "--job_name=ps", "--task_index=0", *cluster],
                                      stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                flags = psflow.parse_flags(["--job_name=worker", "--task_index=0", *cluster, "--sync_replicas",
                                            f"--train_steps={STEPS}"])
                with psflow.WorkerSession(model, flags, optimizer=opt) as sess:
                    for step in range(STEPS):
                        # The lr of this update, as torch's scheduler has it before its step: the
                        # optimizer's (the last group's, which keeps the defaults in these cases), and
                        # each group's.
                        self.assertAlmostEqual(sess.learning_rate / ref_opt.param_groups[-1]["lr"], 1.0, delta=1e-6,
                                               msg=f"{name}: learning rate at step {step}")
                        for group, ref_group in zip(opt.param_groups, ref_opt.param_groups):
                            pname = names[id(group["params"][0])]
                            self.assertAlmostEqual(opt.learning_rate_at(step, pname) / ref_group["lr"], 1.0,
                                                   delta=1e-6, msg=f"{name}: lr of {pname} at step {step}")
                        loss_of(model, x, y, step).backward()
                        sess.step(float(loss_of(model, x, y, step)))
                        ref_opt.zero_grad()
                        loss_of(reference, x, y, step).backward()
                        ref_opt.step()
                        if ref_sched is not None:
                            ref_sched.step()
                        for (pname, p), q in zip(model.named_parameters(), reference.parameters()):
                            err = relative_error(p.detach(), q.detach())
                            worst = max(worst, err)
                            self.assertLessEqual(err, RTOL, f"{name}: {pname} after step {step + 1}")
                    self.assertTrue(sess.should_stop())
                code = ps.wait(timeout=TIMEOUT)
                with open(log_path) as f:
                    self.assertEqual(code, 0, f.read())
            finally:
                if ps.poll() is None:
                    ps.kill()
        OptimAgainstTorchTest.worst[name] = worst

    # --- rules ------------------------------------------------------------------------------------

    def test_sgd(self):
        self.compare("SGD", lambda p: O.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1))

    def test_sgd_momentum_weight_decay(self):
        kw = dict(lr=0.05, momentum=0.9, weight_decay=0.01)
        self.compare("SGD momentum wd", lambda p: O.SGD(p, **kw), lambda p: torch.optim.SGD(p, **kw))

    def test_sgd_nesterov(self):
        kw = dict(lr=0.05, momentum=0.8, nesterov=True)
        self.compare("SGD nesterov", lambda p: O.SGD(p, **kw), lambda p: torch.optim.SGD(p, **kw))

    def test_adam_betas_eps_weight_decay(self):
        kw = dict(lr=0.01, betas=(0.8, 0.99), eps=1e-4, weight_decay=0.05)
        self.compare("Adam betas eps wd", lambda p: O.Adam(p, **kw), lambda p: torch.optim.Adam(p, **kw))

    def test_adamw(self):
        kw = dict(lr=0.01, weight_decay=0.2)
        self.compare("AdamW", lambda p: O.AdamW(p, **kw), lambda p: torch.optim.AdamW(p, **kw))

    def test_adagrad(self):
        kw = dict(lr=0.1, initial_accumulator_value=0.1, eps=1e-6, weight_decay=0.01)
        self.compare("Adagrad", lambda p: O.Adagrad(p, **kw), lambda p: torch.optim.Adagrad(p, **kw))

    def test_rmsprop(self):
        kw = dict(lr=0.01, alpha=0.9, eps=1e-6)
        self.compare("RMSprop", lambda p: O.RMSprop(p, **kw), lambda p: torch.optim.RMSprop(p, **kw))

    def test_rmsprop_momentum(self):
        kw = dict(lr=0.005, momentum=0.5, weight_decay=0.01)
        self.compare("RMSprop momentum wd", lambda p: O.RMSprop(p, **kw), lambda p: torch.optim.RMSprop(p, **kw))

    def test_parameter_groups(self):
        groups = [(["fc1.weight", "fc1.bias"], dict(lr=0.002, weight_decay=0.0)),
                  (["fc2.weight", "fc2.bias"], dict())]
        kw = dict(lr=0.01, weight_decay=0.1)
        self.compare("AdamW groups", lambda p: O.AdamW(p, **kw), lambda p: torch.optim.AdamW(p, **kw), groups=groups)

    # --- schedules -------------------------------------------------------------------------------

    def test_step_lr(self):
        self.compare("StepLR", lambda p: O.SGD(p, lr=0.1, momentum=0.5), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5),
                     schedule=lambda o: S.StepLR(o, step_size=4, gamma=0.5),
                     torch_schedule=lambda o: TS.StepLR(o, step_size=4, gamma=0.5))

    def test_exponential_lr(self):
        self.compare("ExponentialLR", lambda p: O.Adam(p, lr=0.02), lambda p: torch.optim.Adam(p, lr=0.02),
                     schedule=lambda o: S.ExponentialLR(o, gamma=0.9),
                     torch_schedule=lambda o: TS.ExponentialLR(o, gamma=0.9))

    def test_cosine_annealing_with_groups(self):
        groups = [(["fc1.weight"], dict(lr=0.05)), (["fc1.bias", "fc2.weight", "fc2.bias"], dict())]
        self.compare("CosineAnnealing groups", lambda p: O.SGD(p, lr=0.1, momentum=0.9),
                     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), groups=groups,
                     schedule=lambda o: S.CosineAnnealing(o, T_max=STEPS, eta_min=0.001),
                     torch_schedule=lambda o: TS.CosineAnnealingLR(o, T_max=STEPS, eta_min=0.001))

    def test_linear_warmup(self):
        self.compare("LinearWarmup", lambda p: O.Adam(p, lr=0.02), lambda p: torch.optim.Adam(p, lr=0.02),
                     schedule=lambda o: S.LinearWarmup(o, warmup_steps=6, start_factor=0.1),
                     torch_schedule=lambda o: TS.LinearLR(o, start_factor=0.1, total_iters=6))

    def test_warmup_then_cosine(self):
        def torch_schedule(o):
            return TS.SequentialLR(o, [TS.LinearLR(o, start_factor=0.2, total_iters=5),
                                       TS.CosineAnnealingLR(o, T_max=10)], milestones=[5])

        self.compare("warmup + cosine", lambda p: O.AdamW(p, lr=0.02), lambda p: torch.optim.AdamW(p, lr=0.02),
                     schedule=lambda o: S.CosineAnnealing(o, T_max=10, warmup_steps=5, warmup_start_factor=0.2),
                     torch_schedule=torch_schedule)

    def test_piecewise_constant(self):
        # TF's boundaries b (values[i+1] from step b+1) are MultiStepLR's milestones b + 1.
        self.compare("PiecewiseConstant", lambda p: O.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1),
                     schedule=lambda o: S.PiecewiseConstant(o, boundaries=[3, 8], values=[0.1, 0.05, 0.025]),
                     torch_schedule=lambda o: TS.MultiStepLR(o, milestones=[4, 9], gamma=0.5))


class ScheduleReadingTest(unittest.TestCase):
    """The ps's LearningRateAt read from Python, against torch's schedulers over many steps."""

    def check(self, schedule, torch_schedule, steps=300, lr=0.1):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = O.SGD([p], lr=lr)
        schedule(opt)
        ref = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
        warnings.filterwarnings("ignore", message=EPOCH_WARNING)
        sched = torch_schedule(ref)
        for step in range(steps):
            want = ref.param_groups[0]["lr"]
            got = opt.learning_rate_at(step)
            self.assertLessEqual(abs(got - want), 1e-6 * max(want, 1e-12) + 1e-12, f"step {step}")
            ref.step()
            sched.step()

    def test_cosine(self):
        self.check(lambda o: S.CosineAnnealing(o, T_max=300, eta_min=1e-3),
                   lambda o: TS.CosineAnnealingLR(o, T_max=300, eta_min=1e-3))

    def test_step(self):
        self.check(lambda o: S.StepLR(o, step_size=30, gamma=0.3), lambda o: TS.StepLR(o, step_size=30, gamma=0.3))

    def test_warmup_then_step(self):
        self.check(lambda o: S.LinearWarmup(o, warmup_steps=20, start_factor=0.5, then=S.StepLR(step_size=50, gamma=0.5)),
                   lambda o: TS.SequentialLR(o, [TS.LinearLR(o, start_factor=0.5, total_iters=20),
                                                 TS.StepLR(o, step_size=50, gamma=0.5)], milestones=[20]))


class RefusalsTest(unittest.TestCase):
    def test_what_the_ps_cannot_do_is_refused_with_one_line(self):
        model = Net()
        params = list(model.parameters())
        cases = [
            (lambda: O.Adam([{"params": params[:2], "betas": (0.5, 0.9)}, {"params": params[2:]}]),
             "parameter group 0 sets betas=(0.5, 0.9) unlike the optimizer's (0.9, 0.999); on the ps only lr and "
             "weight_decay may differ between groups"),
            (lambda: O.Adam(params, amsgrad=True), "amsgrad is not supported"),
            (lambda: O.SGD(params, lr=0.1, momentum=0.9, dampening=0.1), "dampening must be 0"),
            (lambda: O.RMSprop(params, centered=True), "centered=True is not supported"),
            (lambda: O.Adagrad(params, lr_decay=0.1), "lr_decay must be 0"),
            (lambda: O.SGD(params, lr=0.1, maximize=True), "maximize=True is not supported"),
        ]
        for make, message in cases:
            with self.assertRaises(psflow.InvalidArgumentError) as e:
                make()
            self.assertIn(message, str(e.exception))
            self.assertNotIn("\n", str(e.exception))

    def test_a_parameter_in_no_group_is_refused(self):
        model = Net()
        opt = O.Adam([model.fc1.weight, model.fc1.bias])
        with self.assertRaisesRegex(psflow.InvalidArgumentError, "parameter 'fc2.weight' of the module is in no parameter group"):
            opt._bind(model.named_parameters())

    def test_bad_values_are_refused_by_the_ps_rules_validation(self):
        model = Net()
        opt = O.Adam(model.parameters(), betas=(1.0, 0.999))
        with self.assertRaisesRegex(psflow.InvalidArgumentError, r"optimizer 'adam': beta1 must be in \[0, 1\), got 1"):
            opt._bind(model.named_parameters())
        opt = O.SGD(model.parameters(), lr=0.1)
        S.PiecewiseConstant(opt, boundaries=[5], values=[0.1])
        with self.assertRaisesRegex(psflow.InvalidArgumentError, "needs one more value than boundaries"):
            opt._bind(model.named_parameters())

    def test_step_calls_of_torch_loops_are_refused(self):
        model = Net()
        opt = O.Adam(model.parameters())
        sched = S.StepLR(opt, step_size=3)
        with self.assertRaisesRegex(psflow.FailedPreconditionError, r"call sess.step\(loss\) instead"):
            opt.step()
        with self.assertRaisesRegex(psflow.FailedPreconditionError, "drop scheduler.step"):
            sched.step()


if __name__ == "__main__":
    unittest.main()
