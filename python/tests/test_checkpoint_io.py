"""psflow.read_checkpoint / psflow.load_checkpoint on checkpoints written by a real
PyTorch job (loop_script.py, standalone): the tensors equal the job's own final state_dict
(torch.save'd by the script) and what an independent safetensors parser (json + numpy, below)
reads from the file; load_checkpoint fills a fresh module in place; mismatches (missing,
unexpected names, shapes) and damaged files are refused with one line.

Run: PYTHONPATH=build/python /usr/bin/python3 -m unittest -v test_checkpoint_io
"""
import glob
import json
import os
import struct
import subprocess
import tempfile
import unittest

import numpy as np
import torch

import psflow

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "loop_script.py")
PYTHON = "/usr/bin/python3"


def parse_safetensors(path):
    """The safetensors layout read by hand: u64 header length, JSON header, raw F32 data."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, h in header.items():
        assert h["dtype"] == "F32", h
        b, e = h["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(h["shape"])
    return out, meta


def model(hidden):
    return torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))


class CheckpointIoTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="psflow_ckpt_io_")
        cls.ckpt = os.path.join(cls.dir, "ckpt")
        cls.state_file = os.path.join(cls.dir, "state.pt")
        env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "PSFLOW_FLAGS")}
        r = subprocess.run([PYTHON, SCRIPT, "--hidden=6", "--train_steps=25", "--save_checkpoint_steps=10",
                            "--optimizer=adam", f"--checkpoint_dir={cls.ckpt}", f"--save_state={cls.state_file}"],
                           capture_output=True, text=True, env=env, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        cls.stdout = r.stdout
        cls.final = torch.load(cls.state_file)
        # The same job stopped at step 10: its final values are what checkpoint 10 must hold.
        cls.state10 = os.path.join(cls.dir, "state10.pt")
        r = subprocess.run([PYTHON, SCRIPT, "--hidden=6", "--train_steps=10", "--optimizer=adam",
                            f"--save_state={cls.state10}"], capture_output=True, text=True, env=env, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr

    def test_the_newest_checkpoint_is_the_jobs_final_state(self):
        state = psflow.read_checkpoint(self.ckpt)
        self.assertEqual(sorted(state), sorted(self.final))
        for name, t in self.final.items():
            self.assertEqual(state[name].dtype, torch.float32)
            self.assertTrue(torch.equal(state[name], t), name)
        path, step, meta = psflow.checkpoint_info(self.ckpt)
        self.assertEqual((os.path.basename(path), step), ("model.ckpt-25.safetensors", 25))
        self.assertEqual((meta["model"], meta["optimizer"], meta["global_step"]), ("loop_script", "adam", "25"))  # the script's name

    def test_files_are_named_by_the_step_of_their_values(self):
        # --save_checkpoint_steps=10 of 25: the multiples and the final step, not -11, -21.
        names = sorted(os.path.basename(f) for f in glob.glob(os.path.join(self.ckpt, "*.safetensors")))
        self.assertEqual(names, ["model.ckpt-10.safetensors", "model.ckpt-20.safetensors", "model.ckpt-25.safetensors"])
        at10 = psflow.read_checkpoint(os.path.join(self.ckpt, "model.ckpt-10.safetensors"))
        for name, t in torch.load(self.state10).items():
            self.assertTrue(torch.equal(at10[name], t), name)

    def test_rates_are_labelled_per_worker_and_global(self):
        progress = [l for l in self.stdout.splitlines() if l.startswith("step 10/25 ")]
        self.assertEqual(len(progress), 1, self.stdout)
        self.assertIn(" worker examples/s ", progress[0])
        final = [l for l in self.stdout.splitlines() if l.startswith("final: ")][0]
        self.assertIn(" global_examples_per_sec=", final)
        self.assertNotIn(" examples_per_sec=", final)

    def test_a_file_reads_as_the_independent_parser_reads_it(self):
        files = sorted(glob.glob(os.path.join(self.ckpt, "model.ckpt-*.safetensors")))
        self.assertGreaterEqual(len(files), 2)
        for f in files:
            expected, meta = parse_safetensors(f)
            with_slots = psflow.read_checkpoint(f, slots=True)
            self.assertEqual(sorted(with_slots), sorted(expected))
            for name, a in expected.items():
                np.testing.assert_array_equal(with_slots[name].numpy(), a)
            self.assertIn("0.weight/slot/m", with_slots)  # adam's slots, kept out by default
            self.assertEqual(sorted(psflow.read_checkpoint(f)), sorted(self.final))
            self.assertEqual(psflow.checkpoint_info(f)[1], int(meta["global_step"]))

    def test_load_checkpoint_fills_a_fresh_module_in_place(self):
        m = model(6)
        before = {n: p.data_ptr() for n, p in m.named_parameters()}
        self.assertEqual(psflow.load_checkpoint(m, self.ckpt), 25)
        for n, p in m.named_parameters():
            self.assertTrue(torch.equal(p.detach(), self.final[n]), n)
            self.assertEqual(p.data_ptr(), before[n], "copied in place")
        x = torch.randn(3, 4)
        reference = model(6)
        reference.load_state_dict(self.final)
        self.assertTrue(torch.equal(m(x), reference(x)))

    def test_mismatches_are_refused_in_one_line_naming_them(self):
        m = model(7)
        w = m[0].weight.detach().clone()
        with self.assertRaises(psflow.InvalidArgumentError) as e:
            psflow.load_checkpoint(m, self.ckpt)
        msg = str(e.exception)
        self.assertNotIn("\n", msg)
        self.assertIn("shapes differ: 0.weight: checkpoint [6, 4], module [7, 4]; 0.bias: checkpoint [6], module [7]; "
                      "2.weight: checkpoint [1, 6], module [1, 7]", msg)
        self.assertTrue(torch.equal(m[0].weight, w), "nothing copied")

        bigger = torch.nn.Sequential(model(6), torch.nn.Linear(1, 2))
        with self.assertRaises(psflow.InvalidArgumentError) as e:
            psflow.load_checkpoint(bigger, self.ckpt)
        msg = str(e.exception)
        self.assertIn("missing in the checkpoint: 0.0.weight, 0.0.bias, 0.2.weight, 0.2.bias, 1.weight, 1.bias", msg)
        self.assertIn("not in the module: 0.bias, 0.weight, 2.bias, 2.weight", msg)
        self.assertIn("strict=False", msg)

        extra = model(6)
        extra.add_module("head", torch.nn.Linear(1, 1))
        head = extra.head.weight.detach().clone()
        with self.assertRaisesRegex(psflow.InvalidArgumentError, r"^checkpoint .*model\.ckpt-25\.safetensors does not "
                                    r"fit Sequential: missing in the checkpoint: head\.weight, head\.bias; build"):
            psflow.load_checkpoint(extra, self.ckpt)
        self.assertEqual(psflow.load_checkpoint(extra, self.ckpt, strict=False), 25)
        self.assertTrue(torch.equal(extra[0].weight, self.final["0.weight"]))
        self.assertTrue(torch.equal(extra.head.weight, head), "a missing name is left alone")

    def test_damaged_and_absent_checkpoints_are_refused(self):
        with self.assertRaisesRegex(psflow.NotFoundError, r"checkpoint .*nowhere does not exist"):
            psflow.read_checkpoint(os.path.join(self.dir, "nowhere"))
        empty = tempfile.mkdtemp(dir=self.dir)
        with self.assertRaisesRegex(psflow.NotFoundError, r"no readable checkpoint in .*no model\.ckpt-STEP"):
            psflow.read_checkpoint(empty)
        newest = sorted(glob.glob(os.path.join(self.ckpt, "*.safetensors")))[-1]
        with open(newest, "rb") as f:
            raw = bytearray(f.read())
        raw[-3] ^= 0x40  # one bit of the data section
        bad = os.path.join(empty, "model.ckpt-7.safetensors")
        with open(bad, "wb") as f:
            f.write(raw)
        with self.assertRaisesRegex(psflow.DataLossError, r"model\.ckpt-7\.safetensors: checksum mismatch"):
            psflow.read_checkpoint(bad)
        with self.assertRaisesRegex(psflow.NotFoundError, r"no readable checkpoint in .*checksum mismatch"):
            psflow.read_checkpoint(empty)


if __name__ == "__main__":
    unittest.main()
