#!/usr/bin/env bash
# Set up, build, and run the whole test suite (unit and multi-process integration tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
# The tests' scratch (every tempfile, TempDir and checkpoint directory they make) goes under one
# directory of this checkout's, emptied before the run and removed after a green one: a failed
# run's files stay for a look, and /tmp does not collect a run's hundreds of leftovers.
scratch="${TMPDIR:-/tmp}/psflow_tests_$(printf %s "$PWD" | md5sum | cut -c1-8)"
rm -rf "$scratch" && mkdir -p "$scratch"
export TMPDIR=$scratch
status=0
ctest --test-dir build -j2 --output-on-failure --timeout 600 "$@" || status=$?
if ((status != 0)); then
  # CI keeps only the end of the output: repeat each failed test's last lines there, with the machine
  # it ran on, so a failure that does not show on a developer's machine can still be read.
  scripts/failed_tests_digest.py build >&2 || true
  echo "test: the tests' scratch files are kept in $scratch" >&2
else
  rm -rf "$scratch"
fi
exit "$status"
