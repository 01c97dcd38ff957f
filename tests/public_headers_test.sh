#!/usr/bin/env bash
# Every public header compiles on its own with only include/ and system headers, warning-free under
# the warnings a C++ user is likely to turn on: what a user who installs psflow's include/ gets
# (four headers used to need the build tree's psflow.pb.h; layers.h and tensor.h used to warn).
#   tests/public_headers_test.sh SOURCE_DIR CXX [CXX...]
# Each compiler given is checked (the suite passes the build's compiler and clang++-14 when
# installed); -Werror turns any warning into a failure.
set -uo pipefail
src=$1; shift
compilers=("${@:-c++}")
check_one() {  # compiler, header path relative to include/; prints PASS or FAIL with the first errors
  local out
  if out=$(printf '#include "%s"\n#include "%s"\n' "$2" "$2" |
           "$1" -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror \
             -I "$SRC/include" -x c++ - 2>&1); then
    echo "PASS $1 $2"
  else
    echo "FAIL $1 $2 does not compile warning-free on its own:"; echo "$out" | head -5 | sed 's/^/  /'
  fi
}
export -f check_one; export SRC=$src
results=$(cd "$src/include" &&
          for cxx in "${compilers[@]}"; do find psflow -name '*.h' | sort | sed "s|^|$cxx |"; done |
          xargs -P "$(nproc)" -L 1 bash -c 'check_one "$0" "$1"')
echo "$results" | grep -v '^PASS'
passed=$(grep -c '^PASS' <<<"$results"); failed=$(grep -c '^FAIL' <<<"$results")
echo "$passed passed, $failed failed (compilers: ${compilers[*]})"
((failed == 0 && passed > 0))
