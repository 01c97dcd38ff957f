#!/usr/bin/env bash
# Every public header compiles on its own with only include/ and system headers: what a C++ user
# who installs psflow's include/ gets (four headers used to need the build tree's psflow.pb.h).
#   tests/public_headers_test.sh SOURCE_DIR CXX
set -uo pipefail
src=$1; cxx=${2:-c++}
check_one() {  # header path relative to include/; prints PASS or FAIL with the first errors
  local out
  if out=$(printf '#include "%s"\n#include "%s"\n' "$1" "$1" |
           "$CXX" -std=c++20 -fsyntax-only -Wall -I "$SRC/include" -x c++ - 2>&1); then
    echo "PASS $1"
  else
    echo "FAIL $1 does not compile on its own:"; echo "$out" | head -5 | sed 's/^/  /'
  fi
}
export -f check_one; export CXX=$cxx SRC=$src
results=$(cd "$src/include" && find psflow -name '*.h' | sort | xargs -P "$(nproc)" -I{} bash -c 'check_one {}')
echo "$results" | grep -v '^PASS'
passed=$(grep -c '^PASS' <<<"$results"); failed=$(grep -c '^FAIL' <<<"$results")
echo "$passed passed, $failed failed"
((failed == 0 && passed > 0))
