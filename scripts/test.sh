#!/usr/bin/env bash
# Set up, build, and run the whole test suite (unit and multi-process integration tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
ctest --test-dir build -j2 --output-on-failure --timeout 600 "$@"
