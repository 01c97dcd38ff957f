#!/usr/bin/env python3
"""Checks that psflow's C++ sources follow the house format (.clang-format at the checkout's root):
every .h and .cc under include/, src/, python/ext/, examples/, bench/, tests/ and fuzz/ is run through
clang-format-14 --dry-run --Werror. Passes only when no file would change; prints each file that
would, with the command that fixes it.

Usage: clang_format_check.py SOURCE_DIR [--clang-format PATH]
Exit status: 0 formatted; 1 a file differs; 77 skipped (clang-format-14 absent, which CTest reports
as a skip saying why).
"""
import argparse
import os
import shutil
import subprocess
import sys

SKIP = 77
FOLDERS = ("include", "src", "python/ext", "examples", "bench", "tests", "fuzz")


def sources(root):
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("build") and d != "corpus")
            for name in sorted(filenames):
                if name.endswith((".h", ".cc")):
                    yield os.path.join(dirpath, name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source_dir")
    parser.add_argument("--clang-format", default="clang-format-14")
    args = parser.parse_args()
    tool = shutil.which(args.clang_format)
    if tool is None:
        print(f"SKIPPED: {args.clang_format} not found, so the format was not checked; install "
              "clang-format-14 (it is in scripts/setup.sh's package list) and run this test again")
        return SKIP
    files = list(sources(args.source_dir))
    bad = []
    for start in range(0, len(files), 64):
        chunk = files[start:start + 64]
        result = subprocess.run([tool, "--dry-run", "--Werror", *chunk], capture_output=True, text=True)
        if result.returncode != 0:
            bad.extend(f for f in chunk
                       if subprocess.run([tool, "--dry-run", "--Werror", f], capture_output=True).returncode != 0)
    for f in bad:
        print(f"{os.path.relpath(f, args.source_dir)}: not in the house format; fix with "
              f"clang-format-14 -i {os.path.relpath(f, args.source_dir)}")
    print(f"{len(files) - len(bad)} of {len(files)} files formatted")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
