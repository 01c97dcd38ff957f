"""The tables' gradients of a PyTorch worker are lent to the C++ session, not copied
(python/psflow/torch.py's before_step, python/ext/table_binding.cc's TablesSetGrads): the session
holds the gradient tensors (read at their address) until its push has read them, which for a push
step() leaves in flight (async, --overlap=push_pull) is after step() returned. Checked here: the
tensors live on while the push is in flight and are let go of by the next step (none: before
step() returns; close: all), memory freed and scribbled over by the script after step() changes
nothing the ps gets (the trained rows and weights are the same bits with none and push_pull), and
a gradient handed over as an array (before_step's general path) that is not float32 [U, dim]
C-contiguous is converted once (the same rows) or refused in one line.

Run: PYTHONPATH=build/python /usr/bin/python3 -m unittest -v test_table_grads   (from python/tests)
"""
import gc
import os
import unittest
import weakref

import torch

import psflow

STEPS, BATCH, FIELDS, DIM, VOCAB = 6, 32, 3, 8, 500


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4 + FIELDS * DIM, 1)
        self.tables = torch.nn.ModuleList(psflow.torch.EmbeddingBag(VOCAB, DIM, mode="sum", seed=f)
                                          for f in range(FIELDS))

    def forward(self, ids, dense):
        offsets = torch.arange(ids.shape[0], dtype=torch.int64)
        e = [t(ids[:, f].contiguous(), offsets) for f, t in enumerate(self.tables)]
        return self.linear(torch.cat([dense] + e, dim=1)).squeeze(1)


def flags_for(overlap, steps=STEPS):
    os.environ.pop("TF_CONFIG", None)
    os.environ.pop("PSFLOW_FLAGS", None)
    return psflow.parse_flags(argv=[f"--overlap={overlap}", f"--train_steps={steps}", "--optimizer=sgd",
                                    "--learning_rate=0.1", "--sparse_optimizer=adagrad", "--sparse_learning_rate=0.3",
                                    "--log_every=1000", "--intra_op_threads=1"])


def data():
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, VOCAB, (STEPS, BATCH, FIELDS), generator=g)
    dense = torch.randn(STEPS, BATCH, 4, generator=g)
    labels = torch.randint(0, 2, (STEPS, BATCH), generator=g).float()
    return ids, dense, labels


def train(overlap):
    """Trains STEPS steps, keeping weak references to the arrays step() lends the session. After
    each step() the script drops every reference and allocates NaN tensors of the gradients' size
    (they would take memory freed too early). Returns the final values and, per step, whether the
    lent arrays were alive right after step() and whether the previous step's were gone after it,
    and whether any was alive after close()."""
    torch.manual_seed(3)
    model = Model()
    ids, dense, labels = data()
    alive_after_step, released_by_next = [], []
    lent, previous = [], []
    kinds = set()
    with psflow.WorkerSession(model, flags_for(overlap)) as sess:
        inner = sess._session

        class Recording:
            def __getattr__(self, name):
                return getattr(inner, name)

            def set_tables_grads(self, grads):
                # (t, tensor, its address, its size) or (t, array): what the session holds
                owners = [item[1] for item in grads]
                lent.extend((weakref.ref(o), o.clone() if isinstance(o, torch.Tensor) else o.copy()) for o in owners)
                kinds.update(type(o).__name__ for o in owners)
                inner.set_tables_grads(grads)

        sess._tables._session = Recording()  # (the tables' side holds the _psflow._Session itself)
        while not sess.should_stop():
            s = sess.local_step
            # announced: the first table's forward looks every table up in one call, and step()
            # lends the leaves' gradients as they are (before_step's usual case)
            sess.lookup({t: ids[s][:, f].contiguous() for f, t in enumerate(model.tables)})
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids[s], dense[s]), labels[s])
            loss.backward()
            sess.step(loss.item())
            gc.collect()
            junk = [torch.full((BATCH, DIM), float("nan")) for _ in range(64)]  # noqa: F841 (takes freed memory)
            alive = [(ref(), want) for ref, want in lent]
            alive_after_step.append(len(alive) == FIELDS and all(a is not None for a, _ in alive))
            for a, want in alive:
                if a is not None and not bool((a == want).all()):
                    raise AssertionError("a lent gradient changed after step()")
            del alive
            released_by_next.append(all(ref() is None for ref, _ in previous))
            previous, lent = lent, []
        sess.wait_for_values()
        with torch.no_grad():
            every = torch.arange(VOCAB, dtype=torch.int64)
            final = {f"table_{f}": t(every, every).clone() for f, t in enumerate(model.tables)}
        final.update({n: p.detach().clone() for n, p in model.linear.named_parameters()})
    gc.collect()
    after_close = any(ref() is not None for ref, _ in previous)
    assert kinds == {"Tensor"}, kinds  # the leaves' gradients themselves, at their address
    return final, alive_after_step, released_by_next, after_close


class LentTableGradientsTest(unittest.TestCase):
    def test_held_while_the_push_is_in_flight_and_the_same_bits(self):
        none, alive, released, after_close = train("none")
        self.assertEqual(alive, [False] * STEPS)  # read before step() returned, let go of at once
        self.assertFalse(after_close)
        got, alive, released, after_close = train("push_pull")
        # Async push_pull leaves each push in flight (the last one, which ends training, excepted):
        # its gradients stay with the session after step(), and go with the next step.
        self.assertEqual(alive, [True] * (STEPS - 1) + [False])
        self.assertEqual(released, [True] * STEPS)
        self.assertFalse(after_close)
        for name in none:
            self.assertTrue(torch.equal(none[name], got[name]), f"{name} differs between none and push_pull")

    def test_a_gradient_not_float32_contiguous_is_converted_and_a_wrong_shape_refused(self):
        def two_steps(convert):
            torch.manual_seed(4)
            model = Model()
            ids, dense, labels = data()
            with psflow.WorkerSession(model, flags_for("push_pull", steps=3)) as sess:
                inner = sess._session

                class Converting:  # hands the gradients over as float64 in Fortran order
                    def __getattr__(self, name):
                        return getattr(inner, name)

                    def set_tables_grads(self, grads):
                        inner.set_tables_grads([(t, g.astype("float64").T.copy().T) for t, g in grads])

                if convert:
                    sess._tables._session = Converting()
                for s in range(2):
                    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids[s], dense[s]), labels[s])
                    loss.backward()
                    if s == 0:
                        u = [uses[0][1] for uses in sess._tables._used.values()]
                        with self.assertRaises(psflow.InvalidArgumentError) as e:
                            inner.set_tables_grads([(FIELDS - 1, torch.zeros(u[-1].shape[0], DIM + 1).numpy())])
                        self.assertIn(f"table {FIELDS - 1}: the gradient is not [{u[-1].shape[0]}, {DIM}] for the batch's",
                                      str(e.exception))
                        self.assertNotIn("\n", str(e.exception))
                        # Lent in place (psflow.torch's (table, owner, address, count)): the count is checked.
                        wrong = torch.zeros(u[-1].shape[0], DIM + 1)
                        with self.assertRaises(psflow.InvalidArgumentError) as e:
                            inner.set_tables_grads([(FIELDS - 1, wrong, wrong.data_ptr(), wrong.numel())])
                        self.assertIn(f"table {FIELDS - 1}: the gradient holds {wrong.numel()} values, not "
                                      f"[{u[-1].shape[0]}, {DIM}] for the batch's", str(e.exception))
                        with self.assertRaises(IndexError):
                            inner.set_tables_grads([(FIELDS, u[0].grad.numpy())])
                        del u
                    sess.step(loss.item())
                sess.wait_for_values()
                with torch.no_grad():
                    every = torch.arange(VOCAB, dtype=torch.int64)
                    return [t(every, every).clone() for t in model.tables]

        plain, converted = two_steps(False), two_steps(True)
        for f in range(FIELDS):
            self.assertTrue(torch.equal(plain[f], converted[f]), f"table {f} differs")


if __name__ == "__main__":
    unittest.main()
