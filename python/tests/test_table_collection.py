"""psflow.torch.EmbeddingBagCollection (python/psflow/torch.py): F tables looked up in one session
call, one leaf and one gradient per step (the C++ session's table group, train/session_tables.h).

- examples/pytorch/ctr_dlrm.py's DLRM (a collection) and the same model with one EmbeddingBag
  module per field give the same losses and the same checkpoint (every table's rows and adagrad
  slots, the dense weights) bit for bit, on an in-process ps: dynamic and fixed tables, memory and
  disk storage, async and sync, --overlap none / push / push_pull, with sess.batches' prefetch
  (ids learnt from the first step) and without it (each forward's own lookup);
- its forward and gradient against torch.nn.EmbeddingBag holding the same rows (ids [B, F], ids
  [N, F] with offsets, include_last_offset, [B, F, L] bags with per-sample weights, sum and mean),
  and that gradient against finite differences of nn.EmbeddingBag's loss (float64);
- the gradient is lent in one piece (one tensor per step, no per-table arrays);
- bad input refused in one line each.

Run: PYTHONPATH=build/python /usr/bin/python3 -m unittest -v test_table_collection   (from python/tests)
"""
import importlib.util
import os
import tempfile
import unittest

import torch

import psflow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("ctr_dlrm", os.path.join(ROOT, "examples/pytorch/ctr_dlrm.py"))
ctr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ctr)

STEPS, BATCH, FIELDS, DIM, DENSE = 5, 64, 4, 8, 3
INIT = "truncated_normal:0:0.05"


class SeparateDLRM(ctr.DLRM):
    """ctr_dlrm.py's DLRM as it was: one psflow.torch.EmbeddingBag module per field, stacked."""

    def __init__(self, vocab, **options):
        super().__init__(FIELDS, DIM, vocab, DENSE)
        n = vocab if vocab > 0 else None
        self.tables = torch.nn.ModuleList(psflow.torch.EmbeddingBag(n, DIM, mode="sum", initializer=INIT, **options)
                                          for _ in range(FIELDS))

    def forward(self, ids, dense):
        ids = ids % self.vocab if self.vocab > 0 else ids
        offsets = torch.arange(ids.shape[0], dtype=torch.int64)
        embedded = torch.stack([t(ids[:, f], offsets) for f, t in enumerate(self.tables)], dim=1)
        b = self.bottom(dense)
        x = torch.cat([b.unsqueeze(1), embedded], dim=1)
        z = torch.bmm(x, x.transpose(1, 2))[:, self.iu[0], self.iu[1]]
        return self.top(torch.cat([b, z], dim=1)).squeeze(1)


def collection_dlrm(vocab, **options):
    model = ctr.DLRM(FIELDS, DIM, vocab, DENSE)
    if options:  # the example's tables with these options
        n = vocab if vocab > 0 else None
        model.tables = psflow.torch.EmbeddingBagCollection(
            psflow.torch.EmbeddingBag(n, DIM, mode="sum", initializer=INIT, **options) for _ in range(FIELDS))
    return model


def flags(*extra, steps=STEPS):
    os.environ.pop("TF_CONFIG", None)
    os.environ.pop("PSFLOW_FLAGS", None)
    return psflow.parse_flags(argv=[f"--train_steps={steps}", "--optimizer=adam", "--learning_rate=0.01",
                                    "--sparse_optimizer=adagrad", "--sparse_learning_rate=0.5", "--log_every=1000",
                                    "--intra_op_threads=1", "--seed=7", *extra])


def train(make_model, argv, prefetch):
    """(losses, checkpoint {name: tensor} with slots) of STEPS steps of ctr_dlrm's batches."""
    torch.manual_seed(1)
    model = make_model()
    gen = psflow.CtrGenerator(seed=3, num_fields=FIELDS, num_dense=DENSE)
    losses = []
    with tempfile.TemporaryDirectory() as d:
        with psflow.WorkerSession(model, flags(f"--checkpoint_dir={d}/ckpt", *argv)) as sess:
            data = ctr.batches(gen, sess, BATCH)
            for ids, dense, labels in (sess.batches(data) if prefetch else data):
                if sess.should_stop():
                    break
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids, dense), labels)
                loss.backward()
                losses.append(loss.item())
                sess.step(loss.item())
        return losses, psflow.read_checkpoint(f"{d}/ckpt", slots=True)


class SameBitsAsSeparateTablesTest(unittest.TestCase):
    def check(self, vocab, argv=(), prefetch=True, **options):
        table_dir = tempfile.mkdtemp(prefix="psflow_coll_") if options.get("storage") == "disk" else None
        argv = list(argv) + ([f"--table_dir={table_dir}"] if table_dir else [])
        want_losses, want = train(lambda: SeparateDLRM(vocab, **options), argv, prefetch)
        got_losses, got = train(lambda: collection_dlrm(vocab, **options), argv, prefetch)
        self.assertEqual(len(want_losses), STEPS)
        self.assertEqual(got_losses, want_losses)
        self.assertEqual(sorted(got), sorted(want))
        self.assertIn("tables.0", got)  # the tables keep the ModuleList's names
        self.assertIn(f"tables.{FIELDS - 1}", got)
        for name in want:
            self.assertTrue(torch.equal(got[name], want[name]), f"{name} differs")

    def test_dynamic_tables_prefetched(self):
        self.check(0)

    def test_fixed_tables_prefetched_push_pull(self):
        self.check(50, ["--overlap=push_pull"])

    def test_dynamic_tables_push_sync(self):
        self.check(0, ["--overlap=push", "--sync_replicas"])

    def test_fixed_tables_without_prefetch(self):
        self.check(50, ["--overlap=none"], prefetch=False)

    def test_disk_tables(self):
        self.check(0, ["--overlap=push_pull"], storage="disk")


class LocalReference(unittest.TestCase):
    """The collection's forward and gradient against torch.nn.EmbeddingBag modules holding the
    same rows, and against finite differences."""

    VOCAB = 30

    def test_against_nn_embedding_bag_and_finite_differences(self):
        g = torch.Generator().manual_seed(5)
        b, length = 6, 3
        cases = {  # name: (ids, offsets, per-sample weights, mode, include_last_offset)
            "one per bag": (torch.randint(0, self.VOCAB, (b, 3), generator=g), None, None, "sum", False),
            "one per bag, mean, int32": (torch.randint(0, self.VOCAB, (b, 3), generator=g).int(), None, None, "mean",
                                         False),
            "offsets": (torch.randint(0, self.VOCAB, (9, 3), generator=g), torch.tensor([0, 2, 2, 5]), None, "mean",
                        False),
            "offsets, last, weights": (torch.randint(0, self.VOCAB, (9, 3), generator=g),
                                       torch.tensor([0, 4, 4, 9]), torch.rand(9, 3, generator=g), "sum", True),
            "bags of 3, weights": (torch.randint(0, self.VOCAB, (b, 3, length), generator=g), None,
                                   torch.rand(b, 3, length, generator=g), "sum", False),
            "bags of 3, mean": (torch.randint(0, 5, (b, 3, length), generator=g), None, None, "mean", False),
        }
        for name, (ids, offsets, weights, mode, last) in cases.items():
            with self.subTest(name):
                self.compare(ids, offsets, weights, mode, last)

    def compare(self, ids, offsets, weights, mode, last):
        coll = psflow.torch.EmbeddingBagCollection(
            psflow.torch.EmbeddingBag(self.VOCAB, 4, mode=mode, include_last_offset=last, initializer="normal:0:1")
            for _ in range(3))
        model = torch.nn.ModuleDict({"tables": coll, "dense": torch.nn.Linear(1, 1)})  # (a session needs one)
        with psflow.WorkerSession(model, flags("--train_steps=1")) as sess:
            out = coll(ids, offsets, weights)
            leaf = sess._tables._group_used[0][2]  # the step's one leaf: every table's unique rows
            mix = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
            (out * mix).sum().backward()
            grad = leaf.grad.clone()
            rows = leaf.detach().clone()
            # Each table's unique ids in the leaf's order (first appearance), as the C++ dedup gives them.
            uniques = []
            for f in range(3):
                column = (ids[:, f] if ids.dim() == 2 else ids[:, f, :]).reshape(-1).tolist()
                uniques.append(list(dict.fromkeys(column)))
            self.assertEqual(rows.shape[0], sum(len(u) for u in uniques))
            sess.step(0.0)
        # The same rows in torch.nn.EmbeddingBag tables (float64), their forward and gradient.
        weights64 = None if weights is None else weights.double()
        refs, start = [], 0
        for f in range(3):
            w = torch.zeros(self.VOCAB, 4, dtype=torch.float64)
            w[uniques[f]] = rows[start:start + len(uniques[f])].double()
            start += len(uniques[f])
            refs.append(torch.nn.EmbeddingBag(self.VOCAB, 4, mode=mode, include_last_offset=last,
                                              _weight=w, dtype=torch.float64))

        def reference(ws):
            parts = []
            for f, ref in enumerate(refs):
                column = ids[:, f].long() if ids.dim() == 2 else ids[:, f, :].long()
                psw = None if weights64 is None else (weights64[:, f] if ids.dim() == 2 else weights64[:, f, :])
                if ids.dim() == 2 and offsets is None:  # one id per bag: bags [B, 1]
                    column = column.unsqueeze(1)
                    psw = None if psw is None else psw.unsqueeze(1)
                parts.append(torch.nn.functional.embedding_bag(column, ws[f], offsets, mode=mode, per_sample_weights=psw,
                                                               include_last_offset=last))
            return (torch.stack(parts, dim=1) * mix.double()).sum(), torch.stack(parts, dim=1)

        ws = [r.weight.detach().clone().requires_grad_(True) for r in refs]
        loss, ref_out = reference(ws)
        self.assertTrue(torch.allclose(out.double(), ref_out, rtol=1e-6, atol=1e-6))
        loss.backward()
        start = 0
        for f in range(3):
            n = len(uniques[f])
            self.assertTrue(torch.allclose(grad[start:start + n].double(), ws[f].grad[uniques[f]], rtol=1e-5,
                                           atol=1e-6), f"table {f}'s gradient")
            # Finite differences of the reference loss, row by row (central, float64).
            for k, row in enumerate(uniques[f][:3]):
                for d in range(4):
                    eps = 1e-6
                    plus = [w.detach().clone() for w in ws]
                    minus = [w.detach().clone() for w in ws]
                    plus[f][row, d] += eps
                    minus[f][row, d] -= eps
                    numeric = (reference(plus)[0] - reference(minus)[0]).item() / (2 * eps)
                    self.assertAlmostEqual(grad[start + k, d].item(), numeric, delta=1e-4 * max(1.0, abs(numeric)))
            start += n


class OneGradientPerStepTest(unittest.TestCase):
    def test_the_leaf_gradient_is_lent_in_one_piece(self):
        torch.manual_seed(1)
        model = ctr.DLRM(FIELDS, DIM, 0, DENSE)
        gen = psflow.CtrGenerator(seed=3, num_fields=FIELDS, num_dense=DENSE)
        calls = []
        test = self
        with psflow.WorkerSession(model, flags()) as sess:
            inner = sess._session

            class Recording:
                def __getattr__(self, name):
                    return getattr(inner, name)

                def set_tables_grads(self, grads, groups=()):
                    calls.append((list(grads), [(g, type(t).__name__, tuple(t.shape)) for g, t, _, _ in groups]))
                    if len(calls) == 2:  # (after the first lookup) a group's lent count is checked
                        g, t, address, n = groups[0]
                        with test.assertRaises(psflow.InvalidArgumentError) as e:
                            inner.set_tables_grads(grads, [(g, t, address, n - 1)])
                        test.assertIn(f"tables 0..{FIELDS - 1}: the gradient holds {n - 1} values, not "
                                      f"[{n // DIM}, {DIM}]", str(e.exception))
                    inner.set_tables_grads(grads, groups)

                def lookup(self, ids):
                    calls.append("lookup")
                    return inner.lookup(ids)

            sess._tables._session = Recording()
            for ids, dense, labels in sess.batches(ctr.batches(gen, sess, BATCH)):
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids, dense), labels)
                loss.backward()
                sess.step(loss.item())
        steps = [c for c in calls if c != "lookup"]
        self.assertEqual(len(steps), STEPS)
        self.assertEqual(calls.count("lookup"), STEPS)  # one session call per forward
        for grads, groups in steps:
            self.assertEqual(grads, [])
            self.assertEqual(len(groups), 1)
            self.assertEqual(groups[0][:2], (0, "Tensor"))
            self.assertEqual(groups[0][2][1], DIM)


class BadInputTest(unittest.TestCase):
    def one_line(self, error, fn, *says):
        with self.assertRaises(error) as e:
            fn()
        for s in says:
            self.assertIn(s, str(e.exception))
        self.assertNotIn("\n", str(e.exception))

    def test_construction(self):
        E, C = psflow.torch.EmbeddingBag, psflow.torch.EmbeddingBagCollection
        self.one_line(psflow.InvalidArgumentError, lambda: C([]), "no tables")
        self.one_line(psflow.InvalidArgumentError, lambda: C([E(5, 4), E(5, 3)]), "table 1 has embedding_dim=3")
        self.one_line(psflow.InvalidArgumentError, lambda: C([E(5, 4, mode="sum"), E(5, 4)]), "mode")
        self.one_line(psflow.InvalidArgumentError, lambda: C([E(5, 4), torch.nn.EmbeddingBag(5, 4)]),
                      "table 1 is a EmbeddingBag")
        self.one_line(psflow.UnimplementedError, lambda: C([E(5, 4, padding_idx=0)]), "padding_idx")
        t = E(5, 4)
        C([t])
        self.one_line(psflow.InvalidArgumentError, lambda: C([t]), "in a collection already")

    def test_forward(self):
        coll = psflow.torch.EmbeddingBagCollection(psflow.torch.EmbeddingBag(10, 4) for _ in range(3))
        model = torch.nn.ModuleDict({"tables": coll, "dense": torch.nn.Linear(1, 1)})
        ids = torch.randint(0, 10, (5, 3))
        self.one_line(psflow.FailedPreconditionError, lambda: coll(ids), "needs an open psflow.WorkerSession")
        with psflow.WorkerSession(model, flags("--train_steps=1")) as sess:
            self.one_line(psflow.InvalidArgumentError, lambda: coll(ids.float()), "torch.float32", "[batch, 3]")
            self.one_line(psflow.InvalidArgumentError, lambda: coll(ids[:, :2]), "shape [5, 2]", "[batch, 3]")
            self.one_line(psflow.InvalidArgumentError, lambda: coll(ids[:, 0]), "shape [5]")
            self.one_line(psflow.InvalidArgumentError, lambda: coll(ids, None, torch.ones(5)),
                          "per_sample_weights is [5]")
            self.one_line(psflow.InvalidArgumentError, lambda: coll(ids + 10), "10")  # outside [0, 10)
            self.one_line(psflow.FailedPreconditionError, lambda: coll[0](ids[:, 0], torch.arange(5)),
                          "belongs to a psflow.torch.EmbeddingBagCollection")
            coll(ids).sum().backward()
            self.one_line(psflow.FailedPreconditionError, lambda: coll(ids.flip(0)), "called again in the step")
            sess.step(0.0)


if __name__ == "__main__":
    unittest.main()
