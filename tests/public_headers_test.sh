#!/usr/bin/env bash
# Every public header compiles on its own with only include/ and system headers, warning-free under
# the warnings a C++ user is likely to turn on: what a user who installs psflow's include/ gets
# (four headers used to need the build tree's psflow.pb.h; layers.h and tensor.h used to warn).
#   tests/public_headers_test.sh SOURCE_DIR WORK_DIR CXX [CXX...]
# Each compiler given is checked (the suite passes the build's compiler and clang++-14 when
# installed); -Werror turns any warning into a failure. Each check is a one-line unit under
# WORK_DIR (the header included twice) compiled through ccache when it is installed, as the build's
# own units are: a header unchanged since it passed, in this checkout or another, is not parsed again.
set -uo pipefail
src=$(cd "$1" && pwd); work=$2; shift 2
compilers=("${@:-c++}")
mkdir -p "$work"
work=$(cd "$work" && pwd)
launcher=$(command -v ccache || true)
check_one() {  # compiler, header path relative to include/; prints PASS or FAIL with the first errors
  local out unit="$WORK/$(basename "$1")/${2//\//_}.cc"
  mkdir -p "$(dirname "$unit")"
  printf '#include "%s"\n#include "%s"\n' "$2" "$2" >"$unit"
  # Paths are hashed relative to the checkout's parent, as the build does (CMakeLists.txt).
  if out=$(cd "$SRC/include" && CCACHE_BASEDIR=$(dirname "$SRC") $LAUNCHER "$1" -std=c++20 -fsyntax-only \
             -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror -I "$SRC/include" "$unit" 2>&1); then
    echo "PASS $1 $2"
  else
    echo "FAIL $1 $2 does not compile warning-free on its own:"; echo "$out" | head -5 | sed 's/^/  /'
  fi
}
export -f check_one; export SRC=$src WORK=$work LAUNCHER=$launcher
results=$(cd "$src/include" &&
          for cxx in "${compilers[@]}"; do find psflow -name '*.h' | sort | sed "s|^|$cxx |"; done |
          xargs -P "$(nproc)" -L 1 bash -c 'check_one "$0" "$1"')
echo "$results" | grep -v '^PASS'
passed=$(grep -c '^PASS' <<<"$results"); failed=$(grep -c '^FAIL' <<<"$results")
echo "$passed passed, $failed failed (compilers: ${compilers[*]}${launcher:+, through ccache})"
((failed == 0 && passed > 0))
