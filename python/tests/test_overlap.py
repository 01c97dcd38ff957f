"""--overlap in PyTorch workers (python/psflow/overlap.py): gradients handed to the push by hooks
during loss.backward(), and with push_pull the pull in forward order behind step(), each module's
forward waiting for its own values. The parameters a job trains to are the same bits with none,
push and push_pull (sync and async, one worker); the hooks fire during backward; misuse is refused
with one line: a second backward before step(), gradient_ready() on a tensor the ps does not hold,
a parameter added to the module after the session was made.

Run: PYTHONPATH=build/python /usr/bin/python3 -m unittest -v test_overlap   (from python/tests)
"""
import os
import unittest

import torch

import psflow

STEPS = 6


def model_and_data(seed):
    torch.manual_seed(seed)
    # Layers of 120 KiB and 240 KiB: several early parts (64 KiB each at least) and pull groups.
    model = torch.nn.Sequential(torch.nn.Linear(100, 300), torch.nn.ReLU(), torch.nn.Linear(300, 200),
                                torch.nn.ReLU(), torch.nn.Linear(200, 10))
    x = torch.randn(STEPS, 16, 100)
    y = torch.randint(0, 10, (STEPS, 16))
    return model, x, y


def train(overlap, *extra):
    os.environ.pop("TF_CONFIG", None)
    os.environ.pop("PSFLOW_FLAGS", None)
    flags = psflow.parse_flags(argv=[f"--overlap={overlap}", f"--train_steps={STEPS}", "--optimizer=adam",
                                     "--learning_rate=0.01", "--log_every=1000", "--intra_op_threads=1", *extra])
    model, x, y = model_and_data(3)
    handed_during_backward = []
    with psflow.WorkerSession(model, flags) as sess:
        while not sess.should_stop():
            s = sess.local_step
            loss = torch.nn.functional.cross_entropy(model(x[s]), y[s])
            model.zero_grad()
            loss.backward()
            handed_during_backward.append(sum(sess._overlap.handed))
            sess.step(loss.item())
        sess.wait_for_values()
        final = {n: p.detach().clone() for n, p in model.named_parameters()}
    return final, handed_during_backward


class OverlapTest(unittest.TestCase):
    def assert_same_bits(self, a, b, what):
        for name in a:
            self.assertTrue(torch.equal(a[name], b[name]), f"{what}: parameter {name} differs")

    def test_none_push_and_push_pull_train_to_the_same_bits(self):
        for mode in ([], ["--sync_replicas"]):
            none, handed = train("none", *mode)
            self.assertEqual(handed, [0] * STEPS)
            for overlap in ("push", "push_pull"):
                got, handed = train(overlap, *mode)
                self.assert_same_bits(none, got, f"--overlap={overlap} {' '.join(mode)}")
                # Every dense parameter was handed over by its hook during backward.
                self.assertEqual(handed, [6] * STEPS, overlap)

    def test_auto_pushes_during_backward_only_what_could_leave_before_the_last_part(self):
        from psflow.overlap import EARLY_PART_BYTES, early_bytes

        def of(model):
            params = list(model.named_parameters())
            return early_bytes(params, [p.requires_grad for _, p in params], [False] * len(params))

        # The seed mlp: its first layer (314 KB) is finished last, the rest (4 KB) cannot fill a part.
        mlp = torch.nn.Sequential(torch.nn.Linear(784, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
        self.assertEqual(of(mlp), 0)
        # This file's model: the last two layers (8 KB + 240 KB) leave before the first one.
        model, _, _ = model_and_data(3)
        self.assertEqual(of(model), (200 * 10 + 10 + 300 * 200 + 200) * 4)
        self.assertGreaterEqual(of(model), EARLY_PART_BYTES)
        # A frozen layer is no gradient: the mlp's last layer frozen, nothing to push early either.
        model[4].requires_grad_(False)
        self.assertEqual(of(model), (300 * 200 + 200) * 4)

        os.environ.pop("TF_CONFIG", None)
        os.environ.pop("PSFLOW_FLAGS", None)
        for net, mode in ((mlp, "none"), (model_and_data(3)[0], "push")):
            flags = psflow.parse_flags(argv=["--overlap=auto", "--train_steps=2", "--log_every=1000"])
            with psflow.WorkerSession(net, flags) as sess:
                self.assertEqual(sess._overlap.mode, mode)
                x = torch.randn(4, net[0].in_features)
                while not sess.should_stop():
                    loss = net(x).square().mean()
                    loss.backward()
                    handed = sum(sess._overlap.handed)
                    self.assertEqual(handed, 0 if mode == "none" else 6)
                    sess.step(loss.item())

    def test_the_hooks_hand_gradients_over_in_buckets(self):
        # Each gradients_ready call carries a bucket of at least EARLY_PART_BYTES, the last one
        # excepted (it goes with step()), in the order backward finished them.
        from psflow.overlap import EARLY_PART_BYTES

        os.environ.pop("TF_CONFIG", None)
        os.environ.pop("PSFLOW_FLAGS", None)
        flags = psflow.parse_flags(argv=["--overlap=push", "--train_steps=2", "--log_every=1000"])
        model, x, y = model_and_data(5)
        sizes = [p.numel() * 4 for p in model.parameters()]
        calls = []
        with psflow.WorkerSession(model, flags) as sess:
            inner = sess._session

            class Recording:
                def __getattr__(self, name):
                    return getattr(inner, name)

                def gradients_ready(self, indices):
                    calls.append(list(indices))
                    inner.gradients_ready(indices)

            sess._overlap._session = Recording()
            loss = torch.nn.functional.cross_entropy(model(x[0]), y[0])
            loss.backward()
            sess.step(loss.item())
        # Backward finishes 4.*, 2.*, 0.*: the first bucket closes with 2.weight (8 + 240 KB), the
        # second with 0.weight (120 KB); step() then sends the push's last part.
        self.assertEqual(len(calls), 2)
        self.assertEqual(sorted(calls[0]), [2, 3, 4, 5])
        self.assertGreaterEqual(sum(sizes[i] for i in calls[0]), EARLY_PART_BYTES)
        self.assertEqual(sorted(calls[1]), [0, 1])

    def test_a_failure_behind_the_python_thread_is_raised_by_the_next_call(self):
        # The buckets go to C++ on the binding's helper thread; what fails there (here the same
        # parameter handed over twice, which the hooks never do) is raised by step(), in one line.
        os.environ.pop("TF_CONFIG", None)
        os.environ.pop("PSFLOW_FLAGS", None)
        flags = psflow.parse_flags(argv=["--overlap=push", "--train_steps=3", "--log_every=1000"])
        model, x, y = model_and_data(6)
        with self.assertRaises(psflow.InvalidArgumentError) as e:
            with psflow.WorkerSession(model, flags) as sess:
                loss = torch.nn.functional.cross_entropy(model(x[0]), y[0])
                loss.backward()
                sess.step(loss.item())  # a step with every bucket handed over by the hooks
                sess._session.gradients_ready([5])  # returns at once
                sess._session.gradients_ready([5])
                sess.step(1.0)
        self.assertIn("parameter '4.bias' got a second gradient before the step", str(e.exception))
        self.assertNotIn("\n", str(e.exception))

    def test_misuse_is_refused_with_one_line(self):
        os.environ.pop("TF_CONFIG", None)
        os.environ.pop("PSFLOW_FLAGS", None)
        flags = psflow.parse_flags(argv=["--overlap=push", "--train_steps=5", "--log_every=1000"])
        model, x, y = model_and_data(4)
        with self.assertRaises(psflow.InvalidArgumentError) as e:
            with psflow.WorkerSession(model, flags) as sess:
                # A tensor that is no parameter of the session.
                with self.assertRaises(psflow.InvalidArgumentError) as stray:
                    sess.gradient_ready(torch.nn.Parameter(torch.zeros(3)))
                self.assertIn("is not a parameter on the ps tasks", str(stray.exception))
                with self.assertRaises(psflow.InvalidArgumentError):
                    sess.gradient_ready("no.such.weight")
                # A second backward before step(): the first gradient was already pushed.
                model(x[0]).sum().backward(retain_graph=False)
                with self.assertRaises(psflow.InvalidArgumentError) as twice:
                    model(x[1]).sum().backward()
                self.assertIn("got a second gradient before step()", str(twice.exception))
                sess.step(1.0)
                # A parameter added after the session was made: on no ps task.
                model.add_module("late", torch.nn.Linear(10, 2))
                model(x[2]).sum().backward()
                sess.step(1.0)
        self.assertIn("parameter 'late.weight' is not on the ps tasks", str(e.exception))


if __name__ == "__main__":
    unittest.main()
