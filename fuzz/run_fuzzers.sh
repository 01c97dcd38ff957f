#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang-14, ASan + UBSan) and runs each for a bounded time
# over a copy of its committed seed corpus (the committed corpus never grows).
#
#   fuzz/run_fuzzers.sh [SECONDS_PER_TARGET=20] [BUILD_DIR=build/fuzz]
#
# Targets run side by side, PSFLOW_FUZZ_JOBS at a time (default: the number of cores). Exits 0 when
# no target found anything; 1 when one crashed, leaked, timed out or ran out of memory (the input
# that did it is printed: rerun it with `BUILD_DIR/TARGET INPUT`); 77 when clang-14 is missing
# (CTest reports a skip).
set -euo pipefail

seconds=${1:-20}
fuzz_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${2:-$fuzz_dir/../build/fuzz}
targets=(fuzz_safetensors fuzz_idx fuzz_tf_config fuzz_tensor_coding)
declare -A dict=([fuzz_safetensors]=safetensors.dict [fuzz_tf_config]=tf_config.dict)
# Messages above 16 KiB reach ForEachRun's bounce-buffer refill; the other formats need no more.
declare -A max_len=([fuzz_tensor_coding]=65536)

if ! command -v clang++-14 >/dev/null; then
  echo "run_fuzzers: clang++-14 not found (apt-get install clang-14); skipping the fuzz targets" >&2
  exit 77
fi
mkdir -p "$build"
if [[ ! -f $build/CMakeCache.txt ]]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$fuzz_dir" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++-14 >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; exit 1; }
fi
cores=$(nproc)
cmake --build "$build" -j "$cores" >"$build/build.log" 2>&1 || { tail -n 50 "$build/build.log" >&2; exit 1; }

jobs=${PSFLOW_FUZZ_JOBS:-$cores}
pids=()
# Stop our own fuzzers if this script is interrupted (e.g. by a CTest timeout).
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

run_one() {
  local target=$1 work=$build/run/$1
  rm -rf "$work"
  mkdir -p "$work/corpus"
  cp "$fuzz_dir/corpus/$target"/* "$work/corpus/"
  local extra=()
  [[ -n ${dict[$target]:-} ]] && extra=(-dict="$fuzz_dir/dict/${dict[$target]}")
  # exec: the background job's pid is the fuzzer's, so the trap above stops the fuzzer itself.
  exec "$build/$target" "$work/corpus" "${extra[@]}" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len="${max_len[$target]:-4096}" -print_final_stats=1 -artifact_prefix="$work/" >"$work/log" 2>&1
}

status=()
for i in "${!targets[@]}"; do
  run_one "${targets[$i]}" &
  pids[$i]=$!
  # Keep at most $jobs running: wait for the oldest once the window is full.
  if (( i + 1 >= jobs )); then
    oldest=$(( i + 1 - jobs ))
    wait "${pids[$oldest]}" && status[$oldest]=0 || status[$oldest]=$?
  fi
done
for i in "${!targets[@]}"; do
  [[ -n ${status[$i]:-} ]] && continue
  wait "${pids[$i]}" && status[$i]=0 || status[$i]=$?
done
trap - EXIT

failed=0
for i in "${!targets[@]}"; do
  target=${targets[$i]} work=$build/run/${targets[$i]}
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$work/log" | tail -n 1 || true)
  if [[ ${status[$i]} -eq 0 ]]; then
    printf 'run_fuzzers: %-20s ok    %ss, %s inputs, %s\n' "$target" "$seconds" "${runs:-?}" "${cov:-cov: ?}"
    continue
  fi
  failed=1
  printf 'run_fuzzers: %-20s FAILED (exit %s); log: %s\n' "$target" "${status[$i]}" "$work/log" >&2
  grep -E -A 40 '^==[0-9]+==ERROR|runtime error|^INFO: a leak|ALARM|out-of-memory|deadly signal' "$work/log" | head -n 60 >&2 || true
  for input in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* "$work"/slow-unit-*; do
    [[ -e $input ]] && echo "run_fuzzers: reproduce with: $build/$target $input" >&2
  done
done
exit "$failed"
