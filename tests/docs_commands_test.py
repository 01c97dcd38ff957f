#!/usr/bin/env python3
"""Runs the commands of the docs as written, so every documented command keeps working.

Each ```sh block of the given Markdown files is run as one bash script (set -euo pipefail) and
must exit 0. HTML comments right above a block adjust it:
  <!-- docs-test: skip: REASON -->   not run (REASON says why: a whole build, a multi-host cluster)
  <!-- docs-test: args: FLAGS -->    FLAGS appended to each `build/psflow train|local` command, to
                                     keep long trainings short (a flag given twice takes the last)
  <!-- docs-test: expect: REGEX -->  the block's output must match REGEX (Python re, multiline)
A `psflow local` run is shortened to no fewer than about 3000 steps: a worker that starts
after a very short job has ended waits for the ps that is gone (--ps_timeout_secs) and fails.
The scripts run in a fresh directory holding `build` (-> the build under test), `data` and
`scripts` (-> the source tree's), with every `/tmp/` path moved into that directory, so they run
as written without touching the machine's /tmp.

Usage: docs_commands_test.py --build BUILD_DIR --source SOURCE_DIR FILE.md...
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(skip|args|expect):\s*(.*?)\s*-->")
PSFLOW_COMMAND = re.compile(r"^(\s*build/psflow (?:train|local)\b.*?)(\s+[>&].*|\s+#.*)?$")


def blocks(path):
    """Yields (line number, script, directives) for each ```sh block of a Markdown file."""
    lines = open(path, encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```sh":
            i += 1
            continue
        directives = []
        j = i - 1
        while j >= 0 and DIRECTIVE.search(lines[j]):
            directives.insert(0, DIRECTIVE.search(lines[j]).groups())
            j -= 1
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        yield i + 1, "\n".join(lines[i + 1:end]), directives
        i = end + 1


def with_args(script, flags):
    """Appends `flags` to every `build/psflow train|local` command (before a redirection or comment)."""
    out = []
    for line in script.splitlines():
        m = PSFLOW_COMMAND.match(line)
        out.append(f"{m.group(1)} {flags}{m.group(2) or ''}" if m else line)
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--timeout", type=float, default=300, help="seconds per block")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()

    failures, ran, skipped = [], 0, 0
    for name in args.files:
        path = os.path.join(args.source, name)
        for line, script, directives in blocks(path):
            where = f"{name}:{line}"
            if any(kind == "skip" for kind, _ in directives):
                skipped += 1
                print(f"SKIP {where}: {[v for k, v in directives if k == 'skip'][0]}", flush=True)
                continue
            for kind, value in directives:
                if kind == "args":
                    script = with_args(script, value)
            work = tempfile.mkdtemp(prefix="psflow_docs_")
            try:
                os.symlink(os.path.abspath(args.build), os.path.join(work, "build"))
                for d in ("data", "scripts"):
                    os.symlink(os.path.join(os.path.abspath(args.source), d), os.path.join(work, d))
                os.mkdir(os.path.join(work, "tmp"))
                script = script.replace("/tmp/", os.path.join(work, "tmp") + "/")
                start = time.monotonic()
                try:
                    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, capture_output=True,
                                       text=True, timeout=args.timeout)
                    code, output = r.returncode, r.stdout + r.stderr
                except subprocess.TimeoutExpired as e:
                    code, output = "timeout", (e.stdout or b"").decode() + (e.stderr or b"").decode()
                seconds = time.monotonic() - start
                problems = [] if code == 0 else [f"exit {code}"]
                for kind, value in directives:
                    if kind == "expect" and not re.search(value, output, re.MULTILINE):
                        problems.append(f"output does not match {value!r}")
                ran += 1
                if problems:
                    failures.append(where)
                    print(f"FAIL {where} ({seconds:.1f} s): {'; '.join(problems)}\n--- script:\n{script}\n"
                          f"--- output (last 40 lines):\n" + "\n".join(output.splitlines()[-40:]), flush=True)
                else:
                    print(f"ok   {where} ({seconds:.1f} s)", flush=True)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    print(f"{ran} blocks ran, {skipped} skipped, {len(failures)} failed{': ' + ', '.join(failures) if failures else ''}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
