#!/usr/bin/env python3
"""Checks psflow's locking with clang's -Wthread-safety, and that clang 14 compiles psflow: every
translation unit of the project in the build's compile_commands.json (the libraries, their tests,
the integration tests, the Python extension, the benchmarks and examples; not the generated
protobuf sources) is compiled with clang++-14 -fsyntax-only -Wthread-safety -Werror=thread-safety,
using the flags CMake recorded. Passes only when every unit compiles with no thread-safety warning.

Two things keep it short (it was 6 of the suite's 15 minutes on 2 cores):
- A test's unit is checked only when its own text locks or names a capability (Mutex, GUARDED_BY,
  REQUIRES, ...): the analysis is per function body, so a test that takes no lock and touches no
  guarded member cannot warn; every library, program, benchmark and example unit is checked.
- Each clang run goes through ccache, as the build's compiles do: a unit whose command and every
  file it read are unchanged since it was checked (in this checkout or another) is answered from
  the cache, its warnings included; a unit that failed is not cached and is compiled again.

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
    # -Wno-error: the build's -Werror is for GCC's warnings; here only the thread-safety ones fail.
    return out + ["-Wno-unknown-warning-option", "-Wno-error", "-Wthread-safety", "-Werror=thread-safety",
                  "-fsyntax-only", entry["file"]]


LOCKING_WORDS = ("Mutex", "GUARDED_BY", "REQUIRES", "LOCKS_", "ACQUIRE", "RELEASE", "CAPABILITY",
                 "NO_THREAD_SAFETY_ANALYSIS", "ASSERT_EXCLUSIVE", "ASSERT_SHARED")


def is_test(path):
    return path.endswith("_test.cc") or f"{os.sep}tests{os.sep}" in path


def locks_anything(path):
    with open(path, errors="replace") as f:
        text = f.read()
    return any(word in text for word in LOCKING_WORDS)


def ccache_environment(source_dir):
    """ccache (scripts/setup.sh installs it; 4.x caches -fsyntax-only runs, warnings included) keeps
    each unit's result under a hash of its command and every file it read, as the build's objects
    are kept: a rerun, or another checkout of the same sources (paths are hashed relative to the
    checkout's parent, as the build does), checks only what changed. Without ccache every unit is
    checked."""
    ccache = shutil.which("ccache")
    env = dict(os.environ, CCACHE_BASEDIR=os.path.dirname(os.path.realpath(source_dir)))
    return ([ccache] if ccache else []), env


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

    skipped_tests = sorted(p for p in entries if is_test(p) and not locks_anything(p))
    for p in skipped_tests:
        del entries[p]
    launcher, env = ccache_environment(args.source_dir)
    to_check = [e for _, e in sorted(entries.items())]

    def run(entry):
        p = subprocess.run(launcher + clang_command(entry, clang), cwd=entry["directory"], env=env,
                           capture_output=True, text=True)
        return entry["file"], p.returncode, p.stderr

    start = time.monotonic()
    warnings = 0
    failed = []
    print(f"{len(entries)} units to check ({len(skipped_tests)} tests that lock nothing left out), "
          f"{'through ccache' if launcher else 'without ccache (not installed): every unit compiled'}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for path, rc, err in pool.map(run, to_check):
            n = err.count("[-Wthread-safety") + err.count("[-Werror,-Wthread-safety")
            warnings += n
            if rc != 0 or n:
                failed.append(path)
                print(f"--- {os.path.relpath(path, args.source_dir)}: exit {rc}, {n} thread-safety warning(s)", flush=True)
                print(err.strip(), flush=True)
    print(f"{len(to_check)} translation units checked with {os.path.basename(clang)} "
          f"-Wthread-safety in {time.monotonic() - start:.0f} s: {warnings} thread-safety warning(s), "
          f"{len(failed)} unit(s) failing")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
