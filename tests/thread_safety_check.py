#!/usr/bin/env python3
"""Checks psflow's locking with clang's -Wthread-safety, and that clang 14 compiles psflow: every
translation unit of the project in the build's compile_commands.json (the libraries, their tests,
the integration tests, the Python extension, the benchmarks and examples; not the generated
protobuf sources) is compiled with clang++-14 -fsyntax-only -Wthread-safety -Werror=thread-safety,
using the flags CMake recorded. Passes only when every unit compiles with no thread-safety warning.

Usage: thread_safety_check.py SOURCE_DIR BUILD_DIR [--jobs N] [--clang PATH]
Exit status: 0 clean; 1 warnings or a compile error (each printed); 77 skipped (clang++-14 absent,
so CTest reports the test as skipped and says why).
"""
import argparse
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

SKIP = 77


def clang_command(entry, clang):
    """The entry's compile command for clang, syntax only, with the thread-safety analysis."""
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    out = [clang]
    skip_next = False
    for a in args[1:]:
        if skip_next:
            skip_next = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip_next = True
            continue
        if a in ("-c", "-MD", "-MMD") or a == entry["file"]:
            continue
        out.append(a)
    return out + ["-Wno-unknown-warning-option", "-Wthread-safety", "-Werror=thread-safety",
                  "-fsyntax-only", entry["file"]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source_dir")
    parser.add_argument("build_dir")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--clang", default="clang++-14")
    args = parser.parse_args()

    clang = shutil.which(args.clang)
    if clang is None:
        print(f"SKIPPED: {args.clang} not found, so the locking annotations were not checked; install "
              "clang-14 (it is in scripts/setup.sh's package list) and run this test again")
        return SKIP
    db_path = os.path.join(args.build_dir, "compile_commands.json")
    try:
        with open(db_path) as f:
            db = json.load(f)
    except OSError as e:
        print(f"error: cannot read {db_path} ({e.strerror}); configure the build with cmake first "
              "(CMAKE_EXPORT_COMPILE_COMMANDS is on in CMakeLists.txt)")
        return 1
    source = os.path.realpath(args.source_dir) + os.sep
    build = os.path.realpath(args.build_dir) + os.sep
    entries = {}
    for e in db:
        path = os.path.realpath(os.path.join(e["directory"], e["file"]))
        if path.startswith(source) and not path.startswith(build) and path.endswith(".cc"):
            entries[path] = dict(e, file=path)
    if not entries:
        print(f"error: no translation unit under {source} in {db_path}")
        return 1

    def run(entry):
        p = subprocess.run(clang_command(entry, clang), cwd=entry["directory"], capture_output=True, text=True)
        return entry["file"], p.returncode, p.stderr

    start = time.monotonic()
    warnings = 0
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for path, rc, err in pool.map(run, sorted(entries.values(), key=lambda e: e["file"])):
            n = err.count("[-Wthread-safety") + err.count("[-Werror,-Wthread-safety")
            warnings += n
            if rc != 0 or n:
                failed.append(path)
                print(f"--- {os.path.relpath(path, args.source_dir)}: exit {rc}, {n} thread-safety warning(s)", flush=True)
                print(err.strip(), flush=True)
    print(f"{len(entries)} translation units checked with {os.path.basename(clang)} "
          f"-Wthread-safety in {time.monotonic() - start:.0f} s: {warnings} thread-safety warning(s), "
          f"{len(failed)} unit(s) failing")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
