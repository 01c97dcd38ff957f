#!/bin/bash
# One binary for every CPU (issue 12.3): the default (portable) psflow build must train on older
# x86-64 CPUs than the build machine's. Runs `psflow train` under qemu-user emulating a Haswell
# (AVX2, no AVX-512) and a Nehalem (SSE4.2, no AVX) CPU: a build using instructions the emulated
# CPU lacks dies with SIGILL (exit 132) here. Tiny run (softmax, Adam, a few steps) since qemu is
# slow. Exit 77 (CTest: skipped) when qemu-x86_64 is not installed (scripts/setup.sh installs
# Debian's qemu-user).
#   tests/portable/qemu_cpus_test.sh BUILD_DIR DATA_DIR
set -u
build=${1:?usage: qemu_cpus_test.sh BUILD_DIR DATA_DIR}
data=${2:?usage: qemu_cpus_test.sh BUILD_DIR DATA_DIR}
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
  echo "SKIPPED: qemu-x86_64 not found (install Debian's qemu-user: scripts/setup.sh does)"
  exit 77
fi
if grep -q 'PSFLOW_NATIVE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "SKIPPED: $build was configured with -DPSFLOW_NATIVE=ON (-march=native: runs only on this CPU family)"
  exit 77
fi
# Let every library detect the emulated CPU itself, as it would on a real host of that family:
# OPENBLAS_CORETYPE makes OpenBLAS's DYNAMIC_ARCH load the named kernel set without checking the
# CPU has its instructions (with OPENBLAS_CORETYPE=Haswell in the environment, as on some build
# machines, sgemm_beta_HASWELL dies with SIGILL under -cpu Nehalem although psflow is portable);
# ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA cap oneDNN's ISA, which would hide a wrong detection.
unset OPENBLAS_CORETYPE ONEDNN_MAX_CPU_ISA DNNL_MAX_CPU_ISA
status=0
for cpu in Haswell Nehalem; do
  out=$(mktemp)
  timeout 300 qemu-x86_64 -cpu "$cpu" "$build/psflow" train --model=softmax --optimizer=adam \
    --train_steps=20 --batch_size=50 --log_every=10 --intra_op_threads=1 --data_dir="$data" >"$out" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: psflow train under qemu-x86_64 -cpu $cpu exited $rc (132 = SIGILL: an instruction this CPU lacks)"
    tail -5 "$out"
    status=1
  elif ! grep -q "test_accuracy=" "$out"; then
    echo "FAIL: psflow train under -cpu $cpu exited 0 but printed no test accuracy:"
    tail -5 "$out"
    status=1
  else
    echo "ok: -cpu $cpu: $(grep -o "test_accuracy=[0-9.]*" "$out" | head -1)"
  fi
  rm -f "$out"
done
exit $status
