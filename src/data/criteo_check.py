#!/usr/bin/python3
"""A second reader of Criteo-layout files: Python's own gzip and csv modules read the files that
`psflow data ctr-files` writes (and a hand-written file of edge cases), and every example must equal
what the C++ reader (psflow_criteo_dump) makes of it, bit for bit.

    criteo_check.py PSFLOW_CRITEO_DUMP PSFLOW_BINARY
"""
import csv
import gzip
import io
import json
import math
import os
import struct
import subprocess
import sys
import tempfile


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def python_read(path, num_dense=13, num_fields=26):
    """(ids, dense, labels) of a file, gzip or plain by its first two bytes."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    raw = gzip.open(path, "rb") if gz else open(path, "rb")
    with raw, io.TextIOWrapper(raw, encoding="ascii", newline="") as text:
        ids, dense, labels = [], [], []
        for row in csv.reader(text, delimiter="\t", quoting=csv.QUOTE_NONE):
            assert len(row) == 1 + num_dense + num_fields, row
            labels.append(float(row[0]))
            dense.append([f32(math.log1p(max(int(x), 0))) if x else 0.0 for x in row[1:1 + num_dense]])
            row_ids = []
            for x in row[1 + num_dense:]:
                v = int(x, 16) if x else 0
                row_ids.append(v - (1 << 64) if v >= 1 << 63 else v)
            ids.append(row_ids)
    return ids, dense, labels


def cpp_read(dump, path, num_dense=13, num_fields=26):
    out = subprocess.run([dump, path, str(num_dense), str(num_fields)], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"psflow_criteo_dump {path}: {out.stderr.strip()}")
    got = json.loads(out.stdout)
    return got["ids"], [[f32(x) for x in row] for row in got["dense"]], got["labels"]


def compare(dump, path, num_dense=13, num_fields=26, expect_examples=None):
    want = python_read(path, num_dense, num_fields)
    got = cpp_read(dump, path, num_dense, num_fields)
    for name, w, g in zip(("ids", "dense", "labels"), want, got):
        if w != g:
            bad = next(i for i, (a, b) in enumerate(zip(w, g)) if a != b) if len(w) == len(g) else None
            raise AssertionError(f"{path}: {name} differ ({len(w)} vs {len(g)} examples; first difference at {bad})")
    if expect_examples is not None and len(want[2]) != expect_examples:
        raise AssertionError(f"{path}: {len(want[2])} examples, expected {expect_examples}")
    print(f"ok {path}: {len(want[2])} examples equal")


def main():
    dump, psflow = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="psflow_criteo_check_") as tmp:
        for gz in (True, False):
            out = os.path.join(tmp, "gz" if gz else "plain")
            cmd = [psflow, "data", "ctr-files", f"--out={out}", "--files=2", "--examples_per_file=250", "--seed=7",
                   "--batch_size=100", "--ctr_test_examples=60"] + (["--gzip"] if gz else [])
            subprocess.run(cmd, check=True, capture_output=True)
            suffix = ".gz" if gz else ""
            compare(dump, os.path.join(out, "train-00001" + suffix), expect_examples=250)
            compare(dump, os.path.join(out, "test" + suffix), expect_examples=60)
        # Edge cases by hand: missing values, negative and huge integers, 16-digit and upper-case
        # hex, a CRLF line, no final newline; three integers and two categoricals per line.
        edge = os.path.join(tmp, "edge.txt")
        with open(edge, "w", newline="") as f:
            f.write("1\t\t-5\t9223372036854775807\tFFFFFFFFFFFFFFFF\t\n")
            f.write("0\t0\t4096\t000123\t0\tAbCdEf01\r\n")
            f.write("1\t12\t\t7\t68fd1e64\t8000000000000000")
        compare(dump, edge, 3, 2, expect_examples=3)
        # A bad line: one line on stderr naming the file and line number.
        bad = os.path.join(tmp, "bad.txt")
        with open(bad, "w") as f:
            f.write("1\t1\t2\t3\ta\tb\n0\t1\t2\t3\tzz\tb\n")
        out = subprocess.run([dump, bad, "3", "2"], capture_output=True, text=True)
        assert out.returncode == 1, out
        assert out.stderr.count("\n") == 1 and f"{bad} line 2: categorical field C1 'zz'" in out.stderr, out.stderr
        print("ok bad line:", out.stderr.strip())


if __name__ == "__main__":
    main()
