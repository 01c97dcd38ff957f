#!/usr/bin/python3
"""After a failed ctest run: the machine, and each failed test's last lines, printed last.

  scripts/failed_tests_digest.py BUILD_DIR [LINES=40]

CI shows only the end of the test command's output, where ctest prints just the failed tests'
names; their output (--output-on-failure) is far above. This reads ctest's own logs
(BUILD_DIR/Testing/Temporary/LastTestsFailed.log and LastTest.log) and repeats, for each failed
test, its command, how it ended and its last LINES lines of output.
"""
import os
import re
import shutil
import sys


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        mem = f"{fields['MemAvailable'].strip()} available of {fields['MemTotal'].strip()}"
    except (OSError, KeyError):
        pass
    disk = shutil.disk_usage(".")
    return (f"cpu: {cpu}; cores: {os.cpu_count()} (usable {len(os.sched_getaffinity(0))}); "
            f"load: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; memory: {mem}; "
            f"disk free here: {disk.free / 2**30:.1f} GiB")


def main():
    build = sys.argv[1]
    lines = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    temporary = os.path.join(build, "Testing", "Temporary")
    try:
        with open(os.path.join(temporary, "LastTestsFailed.log")) as f:
            failed = [line.strip().split(":", 1)[1] for line in f if ":" in line]
        with open(os.path.join(temporary, "LastTest.log"), errors="replace") as f:
            log = f.read()
    except OSError as e:
        print(f"failed_tests_digest: no ctest log to read ({e})")
        return 0
    print("=" * 30 + " failed tests, their last lines " + "=" * 30)
    print(machine())
    for name in failed:
        # One test's block: from its "N/M Testing: NAME" line to its end-time line.
        block = re.search(rf"^\d+/\d+ Testing: {re.escape(name)}\n(.*?)^\"{re.escape(name)}\" time elapsed",
                          log, re.M | re.S)
        if block is None:
            print(f"--- {name}: no output in {temporary}/LastTest.log")
            continue
        text = block.group(1)
        command = re.search(r"^Command: (.*)$", text, re.M)
        output = re.search(r"^Output:\n-+\n(.*?)<end of output>\n(.*)", text, re.S | re.M)
        body, ending = (output.group(1), output.group(2)) if output else (text, "")
        verdict = " ".join(line for line in ending.splitlines() if line.startswith(("Test Failed", "Test time")))
        print(f"--- {name} ({verdict or 'no verdict'}): {command.group(1) if command else ''}")
        for line in body.rstrip("\n").splitlines()[-lines:]:
            print(f"  {line[:400]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
