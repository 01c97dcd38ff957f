#!/usr/bin/env bash
# Every public header compiles on its own with only include/ and system headers: what a C++ user
# who installs psflow's include/ gets (issue: four headers needed the build tree's psflow.pb.h).
#   tests/public_headers_test.sh SOURCE_DIR CXX
set -uo pipefail
src=$1; cxx=${2:-c++}
failed=0; total=0
while IFS= read -r header; do
  rel=${header#"$src/include/"}
  total=$((total + 1))
  if ! out=$(printf '#include "%s"\n#include "%s"\n' "$rel" "$rel" |
             "$cxx" -std=c++20 -fsyntax-only -Wall -I "$src/include" -x c++ - 2>&1); then
    echo "FAIL $rel does not compile on its own:"; echo "$out" | head -5
    failed=$((failed + 1))
  fi
done < <(find "$src/include" -name '*.h' | sort)
echo "$((total - failed)) passed, $failed failed"
((failed == 0))
