#!/usr/bin/env python3
"""Reads psflow_table_bench's JSON (stdin) and prints each benchmark's rows/s and its ratio to the
memcpy of the same bytes at the same dim (bench/table_bench.cc)."""
import json
import re
import sys

RULES = ["sgd", "momentum", "adagrad", "ftrl", "adam", "rmsprop"]
runs = [b for b in json.load(sys.stdin)["benchmarks"] if b.get("run_type", "iteration") == "iteration"]
memcpy = {}
for b in runs:
    m = re.match(r"BM_RowsMemcpy/dim:(\d+)", b["name"])
    if m:
        memcpy[int(m.group(1))] = b["rows/s"]
print(f"{'benchmark':<44} {'rows/s':>12} {'x memcpy':>9}")
for b in runs:
    dim = int(re.search(r"dim:(\d+)", b["name"]).group(1))
    name = b["name"]
    m = re.match(r"BM_TableApply/rule:(\d)/(.*)", name)
    if m:
        name = f"BM_TableApply/{RULES[int(m.group(1))]}/{m.group(2)}"
    ratio = b["rows/s"] / memcpy[dim] if dim in memcpy else float("nan")
    print(f"{name:<44} {b['rows/s']:>12.4g} {ratio:>9.3f}")
