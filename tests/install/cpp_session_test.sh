#!/bin/bash
# The out-of-tree C++ program (examples/cpp_session, docs/cpp-session.md) built the two ways a user
# builds it, then trained on a local cluster:
#   1. against an installed psflow: `cmake --install` into a temporary prefix, find_package(psflow);
#      its build must compile its own source only (one object file: none of psflow's sources);
#   2. through add_subdirectory(psflow): psflow's libraries and binary built alongside, without
#      psflow's tests, benchmarks, examples or Python package.
# Runs: alone (an in-process ps task); async 1 ps + 2 workers with checkpoints every 100 steps to 300 (the final checkpoint saved
# and logged once), then sync resumed from it to 400; the model must beat predicting the mean.
# ctr_fm (a model with embedding tables) on 2 ps + 2 workers: tests/ctr_fm_example_test.py (it
# learns, eviction bounds its dynamic table, sync checkpoints with tables resume), with the
# installed build; with the add_subdirectory build, its first case.
# Usage: cpp_session_test.sh SOURCE_DIR BUILD_DIR. Prints the configure+build times it measured.
set -euo pipefail
src=$1
build=$(cd "$2" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/psflow_install_test.XXXXXX")
# psflow's build tree for case 2 sits beside BUILD_DIR at the same depth, so that ccache
# (base_dir) sees the same relative paths and reuses BUILD_DIR's objects instead of compiling again.
subdir_psflow="${build}_subdir"
rm -rf "$subdir_psflow"
trap 'rm -rf "$work" "$subdir_psflow"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }

# --- 1. installed ---------------------------------------------------------------------------------
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
for f in lib/cmake/psflow/psflowConfig.cmake lib/cmake/psflow/psflowConfigVersion.cmake \
         include/psflow/train/session.h include/psflow/cli/flags.h lib/libpsflow_core.a bin/psflow; do
  [[ -e "$work/prefix/$f" ]] || fail "cmake --install did not install $f"
done
[[ -z "$(find "$work/prefix/include" -name '*.h' -path '*src*')" ]] || fail "internal headers installed"
t0=$(now)
cmake -S "$src/examples/cpp_session" -B "$work/installed" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/installed.configure.log" 2>&1 \
  || { cat "$work/installed.configure.log"; fail "configuring against the installed psflow failed"; }
cmake --build "$work/installed" > "$work/installed.build.log" 2>&1 \
  || { cat "$work/installed.build.log"; fail "building against the installed psflow failed"; }
t1=$(now)
objects=$(find "$work/installed" -name '*.o' | sed "s|$work/installed/||" | sort | tr '\n' ' ')
[[ "$objects" == "CMakeFiles/ctr_fm.dir/ctr_fm.cc.o CMakeFiles/regression.dir/regression.cc.o " ]] \
  || fail "the build against the installed psflow compiled more than ctr_fm.cc and regression.cc: $objects"
echo "installed: configure+build $(echo "$t1 - $t0" | bc) s, objects: $objects"

psflow="$work/prefix/bin/psflow"
app="$work/installed/regression"
# The summary counts the workers that pushed: in a job this short one worker may push none (the
# other took every step), and the chief then says so.
pushers() { grep -q "never pushed a gradient; the summary counts the 1 worker(s) that did" "$1" && echo 1 || echo 2; }
run() {  # run LOG ARGS...: the cluster, its output in LOG and on stdout
  local log=$1; shift
  "$psflow" local --ps=1 --workers=2 "$@" > "$log" 2>&1 || { cat "$log"; fail "psflow local $* exited non-zero"; }
  cat "$log"
}
ckpt="$work/ckpt"
run "$work/async.log" --train_steps=300 --log_every=100 --checkpoint_dir="$ckpt" --save_checkpoint_steps=100 -- "$app"
final=$(grep -o "final: model=regression mode=async workers=$(pushers "$work/async.log") ps=1 global_step=[0-9]*" \
        "$work/async.log") \
  || fail "no async summary line for the regression"
[[ ${final##*=} -ge 300 ]] || fail "async run stopped at ${final##*=} < 300"
[[ $(grep -c "saved checkpoint .*model.ckpt-300\." "$work/async.log") -eq 1 ]] \
  || fail "the final checkpoint (step 300) was not saved exactly once"
mse=$(grep -o " test_mse=[0-9.e-]*" "$work/async.log" | cut -d= -f2)
base=$(grep -o " test_mse_of_mean=[0-9.e-]*" "$work/async.log" | cut -d= -f2)
[[ -n "$mse" && -n "$base" ]] || fail "no test_mse / test_mse_of_mean in the summary"
python3 -c "import sys; sys.exit(0 if $mse < 0.5 * $base else 1)" \
  || fail "test_mse=$mse is not below half of predicting the mean ($base): the program did not learn"
run "$work/sync.log" --train_steps=400 --log_every=50 --checkpoint_dir="$ckpt" --save_checkpoint_steps=100 --sync_replicas -- "$app"
grep -q "restored .*model.ckpt-300.* at global step 300" "$work/sync.log" || fail "the sync run did not resume from step 300"
grep -q "final: model=regression mode=sync workers=2 ps=1 global_step=400" "$work/sync.log" \
  || fail "no sync summary line at global step 400"
# Alone (no psflow local, no cluster flags, no TF_CONFIG): an in-process ps task, and it learns.
env -u TF_CONFIG -u PSFLOW_FLAGS "$app" --train_steps=300 > "$work/alone.log" 2>&1 \
  || { cat "$work/alone.log"; fail "the regression alone exited non-zero"; }
grep -q "standalone: no cluster flags and no TF_CONFIG" "$work/alone.log" || fail "no standalone line when alone"
grep -q "final: model=regression mode=async workers=1 ps=1 global_step=300" "$work/alone.log" \
  || { cat "$work/alone.log"; fail "no summary line at global step 300 when alone"; }
mse=$(grep -o " test_mse=[0-9.e-]*" "$work/alone.log" | cut -d= -f2)
base=$(grep -o " test_mse_of_mean=[0-9.e-]*" "$work/alone.log" | cut -d= -f2)
python3 -c "import sys; sys.exit(0 if $mse < 0.5 * $base else 1)" \
  || fail "alone: test_mse=$mse is not below half of predicting the mean ($base)"
/usr/bin/python3 "$src/tests/ctr_fm_example_test.py" --psflow "$psflow" --binary "$work/installed/ctr_fm" \
  || fail "ctr_fm built against the installed psflow"

# --- 2. add_subdirectory --------------------------------------------------------------------------
t0=$(now)
cmake -S "$src/examples/cpp_session" -B "$work/subdir" -DCMAKE_BUILD_TYPE=Release -DPSFLOW_SOURCE_DIR="$src" \
      -DPSFLOW_BINARY_DIR="$subdir_psflow" > "$work/subdir.configure.log" 2>&1 \
  || { cat "$work/subdir.configure.log"; fail "configuring with add_subdirectory(psflow) failed"; }
cmake --build "$work/subdir" -j2 > "$work/subdir.build.log" 2>&1 \
  || { tail -50 "$work/subdir.build.log"; fail "building with add_subdirectory(psflow) failed"; }
t1=$(now)
echo "add_subdirectory: configure+build $(echo "$t1 - $t0" | bc) s"
extra=$(find "$subdir_psflow" -type f -perm -u+x \( -name '*_test' -o -name '*_bench' -o -name custom_model -o -name ctr_fm \
         -o -name custom_op -o -name '_psflow*.so' -o -name psflow_ctr_dump \) | sed "s|$subdir_psflow/||")
[[ -z "$extra" ]] || fail "add_subdirectory built psflow's tests/benchmarks/examples/python: $extra"
ctest --test-dir "$work/subdir" -N | grep -q "Total Tests: 0" || fail "add_subdirectory registered psflow's tests"
[[ -x "$subdir_psflow/psflow" ]] || fail "add_subdirectory did not build the psflow binary"
psflow="$subdir_psflow/psflow"
app="$work/subdir/regression"
run "$work/subdir.log" --train_steps=100 --log_every=50 -- "$app"
grep -q "final: model=regression mode=async workers=$(pushers "$work/subdir.log") ps=1 global_step=1[0-9][0-9]" \
        "$work/subdir.log" \
  || fail "no summary line from the add_subdirectory build"
/usr/bin/python3 "$src/tests/ctr_fm_example_test.py" --psflow "$psflow" --binary "$work/subdir/ctr_fm" \
    CtrFmExampleTest.test_learns_with_eviction || fail "ctr_fm built with add_subdirectory(psflow)"
echo "PASS"
