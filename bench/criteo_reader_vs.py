#!/usr/bin/python3
"""The Criteo-layout reader beside what else reads the same file, in one run (docs/data-files.md):

  psflow reader      build/bench/psflow_criteo_reader_bench (BM_CriteoParse, BM_CriteoReader)
  zcat | wc -l       decompression and line counting, nothing parsed (the floor for gzip)
  wc -l              line counting of the plain file
  pandas read_csv    pd.read_csv(path, sep="\\t", header=None, engine="c"), what a PyTorch user writes
                     (ids stay hex strings: converting them would cost more)

on one file the CTR generator writes (`psflow data ctr-files`, --lines examples; its ids have 16 hex
digits) and on the same examples with Criteo's 8-digit ids (Criteo's line length), plain and gzip -1.
Figures are lines per CPU-second of the process doing the work (its threads and children), i.e.
per core, and lines per wall-second.

    /usr/bin/python3 bench/criteo_reader_vs.py [--build=build] [--lines=500000] [--json=OUT]
"""
import argparse
import json
import os
import resource
import subprocess
import tempfile
import time


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd, **kwargs):
    """(stdout, wall s, CPU s of the command and its children)."""
    cpu0, t0 = children_cpu(), time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, **kwargs)
    return out.stdout, time.perf_counter() - t0, children_cpu() - cpu0


def pandas_available():
    """Debian's python3-pandas, in Debian's interpreter."""
    return subprocess.run(["/usr/bin/python3", "-c", "import pandas"], capture_output=True).returncode == 0


PANDAS_READ = """
import sys, time
import pandas as pd
c0, t0 = time.process_time(), time.perf_counter()
df = pd.read_csv(sys.argv[1], sep="\\t", header=None, engine="c")
print(len(df), time.perf_counter() - t0, time.process_time() - c0, pd.__version__)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--lines", type=int, default=500000)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    psflow = os.path.join(args.build, "psflow")
    bench = os.path.join(args.build, "bench", "psflow_criteo_reader_bench")
    rows = []
    with tempfile.TemporaryDirectory(prefix="psflow_criteo_vs_") as tmp:
        plain = os.path.join(tmp, "train-00000")
        subprocess.run([psflow, "data", "ctr-files", f"--out={tmp}", "--files=1", f"--examples_per_file={args.lines}",
                        "--ctr_test_examples=0"], check=True, capture_output=True)
        # The same examples with Criteo's 8-digit ids (each id's last 8 hex digits): Criteo's line length.
        short = os.path.join(tmp, "short")
        with open(plain) as src, open(short, "w") as dst:
            for line in src:
                f = line.rstrip("\n").split("\t")
                f[14:] = [x[-8:].rjust(8, "0") if x else "" for x in f[14:]]
                dst.write("\t".join(f) + "\n")
        for path in (plain, short):
            subprocess.run(["sh", "-c", f"gzip -1 -k {path}"], check=True)
        for name, path in (("16-digit ids", plain), ("8-digit ids", short)):
            size, size_gz = os.path.getsize(path), os.path.getsize(path + ".gz")
            print(f"file with {name}: {args.lines} lines, {size / 1e6:.1f} MB plain ({size / args.lines:.0f} bytes/line), "
                  f"{size_gz / 1e6:.1f} MB gzip -1")

        for label, path in (("", plain), (" 8-digit", short)):
            for gz in (False, True):
                file = path + (".gz" if gz else "")
                kind = ("gzip" if gz else "plain") + label
                # The psflow reader (Google Benchmark, one run of each).
                flt = "BM_CriteoReader/gzip:1" if gz else "BM_CriteoParse|BM_CriteoReader/gzip:0"
                env = dict(os.environ, PSFLOW_CRITEO_BENCH_FILE=file)
                out, _, _ = timed([bench, f"--benchmark_filter={flt}", "--benchmark_format=json",
                                   "--benchmark_min_time=2"], env=env)
                for b in json.loads(out)["benchmarks"]:
                    if b["name"].startswith("BM_CriteoParse"):
                        # Parsing on the benchmark's own thread: items/s of its CPU time is per core.
                        rows.append(("psflow parser, text in memory (1 thread)", kind, b["items_per_second"],
                                     b["items_per_second"] * b["cpu_time"] / b["real_time"]))
                    else:
                        threads = b["name"].split("threads:")[1].split("/")[0]
                        rows.append((f"psflow reader, {threads} parsing thread(s) + read-ahead", kind,
                                     b["lines_per_cpu_s"], b["lines_per_s"]))
                # zcat | wc -l, or wc -l.
                cmd = f"zcat {file} | wc -l" if gz else f"wc -l < {file}"
                out, wall, cpu = timed(["sh", "-c", cmd])
                assert int(out.split()[0]) == args.lines, out
                rows.append(("zcat | wc -l" if gz else "wc -l", kind, args.lines / max(cpu, 1e-3), args.lines / wall))
                # pandas.
                if pandas_available():
                    out, _, _ = timed(["/usr/bin/python3", "-c", PANDAS_READ, file])
                    n, wall, cpu, version = out.split()
                    assert int(n) == args.lines, out
                    rows.append((f"pandas {version} read_csv(engine='c')", kind, args.lines / float(cpu),
                                 args.lines / float(wall)))
                else:
                    rows.append(("pandas read_csv: python3-pandas is not installed", kind, float("nan"), float("nan")))

    print(f"{'reader':52} {'file':14} {'lines/s per core':>17} {'lines/s wall':>13}")
    for name, kind, per_core, wall in rows:
        print(f"{name:52} {kind:14} {per_core / 1e6:>15.2f} M {wall / 1e6:>11.2f} M")
    print(f"(machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(reader=r[0], file=r[1], lines_per_cpu_s=r[2], lines_per_s=r[3]) for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
