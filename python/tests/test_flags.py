"""psflow train's flags are declared once (src/train/flags.cc) and every surface shows all of them:
the list `psflow train --help` prints (CLI11), the attributes of psflow.Flags (the binding, over
TrainOptions) and what psflow.parse_flags parses. A flag added to the table appears on every
surface by itself; a surface that lists a flag by hand, or misses one, fails here.

Run: PYTHONPATH=build/python PSFLOW_BINARY=build/psflow /usr/bin/python3 -m unittest -v test_flags
     (from python/tests; CTest does this)
"""
import os
import re
import subprocess
import unittest

import psflow

HERE = os.path.dirname(os.path.abspath(__file__))
BINARY = os.environ.get("PSFLOW_BINARY", os.path.join(HERE, "..", "..", "build", "psflow"))

# "  --hidden_units INT=100      hidden units ..." / "  --sync_replicas   synchronous ..."
HELP_LINE = re.compile(r"^  --([a-z0-9_]+)(?: (INT|UINT|FLOAT|TEXT)(?:=(\S+))?)?(?: REQUIRED)?(?:\s|$)", re.M)

# Values the flags' own checks accept, for the text flags that take only some (others: any text).
TEXT_VALUES = {"model": "cnn", "optimizer": "momentum", "transport": "shm", "placement": "greedy",
               "partitioner": "fixed:2", "job_name": "worker", "slurm_jobs": "ps:1,worker:2",
               "sparse_optimizer": "ftrl", "sparse_sync_mean": "row_count", "table_sync": "async", "wire_dtype": "bfloat16",
               "overlap": "none",
               # The --table_* flags, made from include/psflow/dist/table_spec.h's TableFields().
               "table_initializer": "zeros", "table_partition_strategy": "mod", "table_storage": "disk"}
# Flags that need another to be valid: given with it (which then moves too).
COMPANIONS = {"table_storage": ["--table_dir=/some/table_dir"], "table_sync": ["--sync_replicas"]}
# The tables' rule and rate default to the dense ones: they move with them.
FOLLOWERS = {"optimizer": {"sparse_optimizer"}, "learning_rate": {"sparse_learning_rate"}}


def help_flags(*subcommand):
    """{name: (type or None for a flag taking no value, default text or None)} in --help order."""
    env = dict(os.environ)
    env.pop("PSFLOW_FLAGS", None)
    out = subprocess.run([BINARY, *subcommand, "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return {m.group(1): (m.group(2), m.group(3)) for m in HELP_LINE.finditer(out.stdout) if m.group(1) != "help"}


class FlagSurfacesTest(unittest.TestCase):
    def setUp(self):
        self.help = help_flags("train")
        self.saved = {k: os.environ.pop(k) for k in ("PSFLOW_FLAGS", "TF_CONFIG") if k in os.environ}

    def tearDown(self):
        os.environ.update(self.saved)

    def test_help_and_python_list_the_same_flags_in_the_same_order(self):
        self.assertGreater(len(self.help), 40)
        attributes = [name for name, v in vars(psflow.Flags).items() if isinstance(v, property) and name != "unparsed"]
        self.assertEqual(sorted(attributes), sorted(self.help))
        self.assertEqual(list(psflow.Flags().as_dict()), list(self.help))

    def test_local_takes_the_same_flags_hiding_the_ones_it_sets_itself(self):
        local = help_flags("local")
        hidden = {"job_name", "task_index", "ps_hosts", "worker_hosts", "slurm_jobs", "slurm_port_base"}
        self.assertEqual(sorted(local), sorted((set(self.help) - hidden) | {"ps", "workers", "evaluator"}))

    def test_defaults_shown_are_the_defaults_python_gets(self):
        flags = psflow.Flags()  # TrainOptions' own defaults, before any model resolution
        for name, (kind, default) in self.help.items():
            value = getattr(flags, name)
            with self.subTest(flag=name):
                if kind is None:
                    self.assertIs(value, False)  # a flag is off unless given
                elif default is None:
                    self.assertIn(value, (None, ""))  # the model's (None until resolved), or empty
                elif kind == "TEXT":
                    self.assertEqual(value, default)
                elif kind == "FLOAT":
                    self.assertEqual(value, float(default))
                else:
                    self.assertEqual(value, int(default))
                    self.assertIsInstance(value, int)

    def test_every_flag_parses_into_its_own_attribute_with_its_type(self):
        defaults = psflow.parse_flags([]).as_dict()
        for name, (kind, _) in self.help.items():
            if kind is None:
                arg, expected = f"--{name}", True
            elif kind == "TEXT":
                expected = TEXT_VALUES.get(name, f"/some/{name}")
                arg = f"--{name}={expected}"
            elif kind == "FLOAT":
                arg, expected = f"--{name}=0.75", 0.75
            else:
                arg, expected = f"--{name}=3", 3
            with self.subTest(flag=name):
                parsed = psflow.parse_flags([arg] + COMPANIONS.get(name, [])).as_dict()
                self.assertEqual(parsed[name], expected)
                self.assertNotEqual(defaults[name], expected)
                self.assertIsInstance(parsed[name], type(expected))
                # Nothing but that flag (and, for --model, the values the model defaults) moved.
                moved = {k for k in parsed if parsed[k] != defaults[k]}
                # (The tables' rule and rate default to --optimizer's and --learning_rate's.)
                model_defaulted = {"train_steps", "batch_size", "optimizer", "learning_rate", "lr_decay_steps",
                                   "lr_decay_rate", "sparse_optimizer", "sparse_learning_rate"}
                allowed = (model_defaulted if name == "model" else set()) | FOLLOWERS.get(name, set())
                allowed |= {c[2:].split("=")[0] for c in COMPANIONS.get(name, [])}
                self.assertEqual(moved - allowed, {name})
                # as_argv gives it back through the same parser.
                self.assertEqual(psflow.parse_flags(psflow.parse_flags([arg] + COMPANIONS.get(name, [])).as_argv()).as_dict(), parsed)

    def test_a_value_of_the_wrong_type_is_the_cli_line(self):
        for name, (kind, _) in self.help.items():
            if kind not in ("INT", "UINT", "FLOAT"):
                continue
            arg = f"--{name}=abc"
            with self.subTest(flag=name):
                with self.assertRaises(psflow.InvalidArgumentError) as e:
                    psflow.parse_flags([arg])
                must_be = {"INT": "an integer", "UINT": "a non-negative integer", "FLOAT": "a number"}[kind]
                self.assertEqual(str(e.exception), f"{arg} must be {must_be}")
                cli = subprocess.run([BINARY, "train", arg], capture_output=True, text=True, timeout=60)
                self.assertEqual(cli.returncode, 2)
                self.assertEqual(cli.stderr.strip(), f"psflow: error: {arg} must be {must_be}")


if __name__ == "__main__":
    unittest.main()
