"""Incremental checkpoints read from Python (docs/checkpoints.md#increments): a sync ctr job saving
a full checkpoint and increments (--full_checkpoint_every=4) and the same job saving in full; at
step 100 psflow.read_checkpoint (slots included) and psflow.read_table_rows of the chain's newest
increment equal the full save's, tensor for tensor and row for row.

Run: PYTHONPATH=build/python /usr/bin/python3 -m unittest -v test_checkpoint_chain
"""
import os
import subprocess
import tempfile
import unittest

import numpy as np
import torch

import psflow

BUILD = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(psflow.__file__))))
PSFLOW = os.environ.get("PSFLOW_BINARY", os.path.join(BUILD, "psflow"))


def ctr(dir, *more):
    args = [PSFLOW, "local", "--ps=2", "--workers=2", "--model=ctr", "--ctr_fields=3", "--ctr_dim=4",
            "--ctr_vocab=0", "--batch_size=96", "--train_steps=100", "--sync_replicas", "--seed=5",
            "--ctr_test_examples=512", "--sparse_optimizer=adagrad", f"--checkpoint_dir={dir}",
            "--save_checkpoint_steps=25", "--log_every=1000", *more]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


class CheckpointChainTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.chain = tempfile.mkdtemp(prefix="psflow_chain_")
        cls.full = tempfile.mkdtemp(prefix="psflow_full_")
        ctr(cls.chain, "--full_checkpoint_every=4")
        ctr(cls.full)

    def test_the_chain_reads_as_the_full_save(self):
        inc = os.path.join(self.chain, "model.ckpt-100.increment.safetensors")
        self.assertTrue(os.path.exists(inc))
        for path in (inc, self.chain):  # the file, and the directory's newest checkpoint
            a = psflow.read_checkpoint(path, slots=True)
            b = psflow.read_checkpoint(os.path.join(self.full, "model.ckpt-100.safetensors"), slots=True)
            self.assertEqual(sorted(a), sorted(b))
            for name in b:
                self.assertTrue(torch.equal(a[name], b[name]), name)

    def test_read_table_rows_of_the_chain(self):
        ids = torch.tensor(psflow.read_checkpoint(self.full)["field_01/ids"][:50].tolist() + [123456789])
        rows, found = psflow.read_table_rows(self.chain, "field_01", ids)
        want, want_found = psflow.read_table_rows(os.path.join(self.full, "model.ckpt-100.safetensors"),
                                                  "field_01", ids)
        self.assertTrue(torch.equal(found, want_found))
        self.assertTrue(bool(found[:50].all()) and not bool(found[50]))
        np.testing.assert_array_equal(rows.numpy(), want.numpy())


if __name__ == "__main__":
    unittest.main()
