#!/usr/bin/env bash
# Set up, build, and run the whole test suite (unit and multi-process integration tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
status=0
ctest --test-dir build -j2 --output-on-failure --timeout 600 "$@" || status=$?
if ((status != 0)); then
  # CI keeps only the end of the output: repeat each failed test's last lines there, with the machine
  # it ran on, so a failure that does not show on a developer's machine can still be read.
  scripts/failed_tests_digest.py build >&2 || true
fi
exit "$status"
