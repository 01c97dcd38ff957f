"""Tests of psflow.CtrGenerator, psflow.log_loss and psflow.auc (the synthetic CTR data's binding)
against the C++ generator's own output (psflow_ctr_dump prints it as JSON), an independent numpy
evaluation of the teacher (pairwise factorization machine) and of the metrics, and PyTorch
tensors that share the binding's arrays.

Run: PYTHONPATH=build/python PSFLOW_CTR_DUMP=build/src/data/psflow_ctr_dump \
     /usr/bin/python3 -m unittest -v test_ctr_data      (from python/tests; CTest does this)
"""
import json
import os
import subprocess
import unittest

import numpy as np
import torch

import psflow

HERE = os.path.dirname(os.path.abspath(__file__))
DUMP = os.environ.get("PSFLOW_CTR_DUMP",
                      os.path.join(HERE, "..", "..", "build", "src", "data", "psflow_ctr_dump"))


def cpp_dump(seed, worker, step, batch, test_size):
    out = subprocess.run([DUMP, str(seed), str(worker), str(step), str(batch), str(test_size)],
                         check=True, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)


def pairwise_auc(labels, scores):
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    return ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size


class CtrGeneratorTest(unittest.TestCase):
    def test_equals_the_cpp_generator_bit_for_bit(self):
        want = cpp_dump(seed=7, worker=1, step=3, batch=64, test_size=2000)
        gen = psflow.CtrGenerator(seed=7)
        ids, dense, labels, p = gen.batch(3, 64, worker_index=1, probabilities=True)
        np.testing.assert_array_equal(ids, np.array(want["ids"], dtype=np.int64).reshape(64, 26))
        np.testing.assert_array_equal(dense, np.array(want["dense"], dtype=np.float32).reshape(64, 13))
        np.testing.assert_array_equal(labels, np.array(want["labels"], dtype=np.float32))
        np.testing.assert_array_equal(p, np.array(want["probabilities"]))
        test = gen.test_set(2000)
        np.testing.assert_array_equal(test["ids"], np.array(want["test_ids"]).reshape(2000, 26))
        np.testing.assert_array_equal(test["labels"], np.array(want["test_labels"], dtype=np.float32))
        np.testing.assert_array_equal(test["probabilities"], np.array(want["test_probabilities"]))
        bayes = gen.bayes_metrics(2000)
        self.assertEqual(bayes["log_loss"], want["bayes_log_loss"])
        self.assertEqual(bayes["auc"], want["bayes_auc"])
        self.assertEqual(gen.bias, want["bias"])
        np.testing.assert_array_equal(gen.dense_weights, np.array(want["dense_weights"], dtype=np.float32))

    def test_streams_per_worker_and_step(self):
        gen = psflow.CtrGenerator(seed=3)
        a = gen.batch(5, 32, worker_index=0)
        for x, y in zip(a, psflow.CtrGenerator(seed=3).batch(5, 32, worker_index=0)):
            np.testing.assert_array_equal(x, y)
        for other in (gen.batch(5, 32, worker_index=1), gen.batch(6, 32, worker_index=0),
                      psflow.CtrGenerator(seed=4).batch(5, 32)):
            # No example in common: compared by their 13 dense features (integer counts, many of them
            # equal one by one, but not 13 at a time).
            rows = {tuple(r) for r in a[1]}
            self.assertFalse(any(tuple(r) in rows for r in other[1]))
        small = gen.batch(5, 8, worker_index=0)  # a smaller batch is a prefix
        np.testing.assert_array_equal(small[0], a[0][:8])

    def test_out_arrays_are_filled_in_place_and_torch_shares_them(self):
        gen = psflow.CtrGenerator(seed=2, num_fields=4, num_dense=3, vocab_sizes=[10, 100, 1000, 10**9])
        out = (np.zeros((16, 4), np.int64), np.zeros((16, 3), np.float32), np.zeros(16, np.float32))
        tensors = [torch.from_numpy(a) for a in out]
        returned = gen.batch(1, 16, out=out)
        for r, o, t in zip(returned, out, tensors):
            self.assertIs(r, o)
            self.assertEqual(t.data_ptr(), o.ctypes.data)  # no copy
        fresh = gen.batch(1, 16)
        for t, f in zip(tensors, fresh):
            np.testing.assert_array_equal(t.numpy(), f)  # the tensors see what the C++ wrote
        self.assertEqual(tensors[0].dtype, torch.int64)
        self.assertEqual(tensors[1].dtype, torch.float32)
        ids = gen.batch(2, 16)[0]
        t = torch.from_numpy(ids)
        t[0, 0] = -5
        self.assertEqual(ids[0, 0], -5)  # one memory
        # Ids are non-negative, and each is the id of a rank of its field.
        self.assertTrue((out[0] >= 0).all())
        self.assertTrue(set(out[0][:, 0]) <= {gen.id_of_rank(0, r) for r in range(1, 11)})

    def test_true_probabilities_are_the_pairwise_factorization_machine(self):
        gen = psflow.CtrGenerator(seed=5, num_fields=5, num_dense=4, teacher_dim=6)
        ids, dense, labels, p = gen.batch(0, 40, probabilities=True)
        w = gen.dense_weights.astype(np.float64)
        for i in range(40):
            e = [gen.teacher_embedding(f, int(ids[i, f])).astype(np.float64) for f in range(5)]
            logit = gen.bias + dense[i].astype(np.float64) @ w
            logit += sum(e[f] @ e[g] for f in range(5) for g in range(f + 1, 5))
            self.assertAlmostEqual(p[i], 1 / (1 + np.exp(-logit)), places=12)
        np.testing.assert_allclose(gen.true_logits(ids, dense), np.log(p / (1 - p)), rtol=1e-9, atol=1e-9)

    def test_bayes_metrics_against_numpy(self):
        gen = psflow.CtrGenerator(seed=1)
        test = gen.test_set(20000)
        y, p = test["labels"], test["probabilities"]
        bayes = gen.bayes_metrics(20000)
        self.assertAlmostEqual(bayes["log_loss"], -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)), places=10)
        self.assertAlmostEqual(bayes["click_rate"], y.astype(np.float64).mean(), places=12)
        self.assertTrue(0.23 < y.mean() < 0.27, y.mean())
        # AUC from numpy ranks (ties: none expected among float64 probabilities).
        ranks = np.empty(len(p))
        ranks[np.argsort(p, kind="stable")] = np.arange(1, len(p) + 1)
        npos = y.sum()
        want_auc = (ranks[y == 1].sum() - npos * (npos + 1) / 2) / (npos * (len(y) - npos))
        self.assertAlmostEqual(bayes["auc"], want_auc, places=10)
        self.assertGreater(bayes["auc"], 0.7)

    def test_metrics_against_brute_force(self):
        rng = np.random.default_rng(0)
        y = (rng.random(300) < 0.3).astype(np.float32)
        s = np.round(rng.random(300) + 0.3 * y, 1).astype(np.float32)  # many ties
        self.assertAlmostEqual(psflow.auc(y, s), pairwise_auc(y, s), places=12)
        self.assertAlmostEqual(psflow.auc(y, s.astype(np.float64)), pairwise_auc(y, s), places=12)
        self.assertAlmostEqual(psflow.log_loss(np.array([1, 0, 1], np.float32), np.array([0.8, 0.3, 0.5])),
                               -(np.log(0.8) + np.log(0.7) + np.log(0.5)) / 3, places=12)
        t = torch.tensor([0.8, 0.3, 0.5])
        self.assertAlmostEqual(psflow.log_loss(np.array([1, 0, 1], np.float32), t.numpy()),
                               torch.nn.functional.binary_cross_entropy(t, torch.tensor([1., 0., 1.])).item(),
                               places=6)

    def test_bad_input_raises_one_line(self):
        gen = psflow.CtrGenerator(seed=0)
        cases = [
            (lambda: psflow.CtrGenerator(num_fields=3, vocab_sizes=[5, 5]), "2 vocabulary sizes for 3 fields"),
            (lambda: psflow.CtrGenerator(base_ctr=1.5), "base_ctr is 1.5"),
            (lambda: gen.batch(-1, 4), "none may be negative"),
            (lambda: gen.batch(0, -4), "must not be negative"),
            (lambda: gen.batch(0, 4, out=(np.zeros((4, 26), np.int32), np.zeros((4, 13), np.float32),
                                          np.zeros(4, np.float32))), "out ids is a int32 array"),
            (lambda: gen.batch(0, 4, out=(np.zeros((4, 26), np.int64), np.zeros((13, 4), np.float32).T,
                                          np.zeros(4, np.float32))), "not a writeable C-contiguous"),
            (lambda: gen.test_set(0), "must be >= 1"),
            (lambda: psflow.auc(np.ones(3, np.float32), np.zeros(3, np.float32)), "AUC needs both classes"),
            (lambda: psflow.auc(np.zeros(3, np.float32), np.zeros(3, np.int64)), "pass float32 or float64"),
            (lambda: psflow.log_loss(np.array([0, 1], np.float32), np.array([0.5, 2.0])), "probability 1 is 2"),
            (lambda: gen.id_of_rank(0, 0), "out of range"),
        ]
        for fn, message in cases:
            with self.assertRaises(psflow.InvalidArgumentError) as cm:
                fn()
            self.assertIn(message, str(cm.exception))
            self.assertNotIn("\n", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
