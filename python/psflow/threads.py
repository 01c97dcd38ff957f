"""The compute threads of a Python task: exactly --intra_op_threads, whatever library does the math.

Debian's torch computes with its own intra-op pool (OpenMP, which oneDNN shares) and calls
OpenBLAS (openblas-pthread: a thread pool of its own, as many threads as cores by default) for
matrix products. Left alone, two workers on two cores run 2 + 2·cores threads and fight. This
module sets every pool to `n`:
  * the environment (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS) for libraries not yet
    loaded and for child processes (`psflow local` sets the same for the processes it starts);
  * torch.set_num_threads(n) (ATen's pool, and omp_set_num_threads, which oneDNN follows);
  * openblas_set_num_threads(n) in every OpenBLAS already loaded into this process (ctypes).
Called by psflow.parse_flags and by WorkerSession before its first op; idempotent. Owns nothing.
"""
import ctypes
import os
import sys

_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _loaded_openblas():
    """Paths of the OpenBLAS libraries mapped into this process."""
    paths = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split()
                if len(parts) >= 6 and "openblas" in os.path.basename(parts[5]) and ".so" in parts[5]:
                    paths.add(parts[5])
    except OSError:
        pass
    return sorted(paths)


def openblas_threads():
    """{path: threads} of every OpenBLAS loaded in this process (openblas_get_num_threads)."""
    out = {}
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
            out[path] = int(lib.openblas_get_num_threads())
        except (OSError, AttributeError):
            continue
    return out


def set_compute_threads(n, import_torch=True):
    """Every compute pool of this process (and of its children) to `n` threads. With
    import_torch=False and torch not imported yet, only the environment is set (torch and OpenBLAS
    read it when they load)."""
    n = int(n)
    if n < 1:
        raise ValueError(f"compute threads must be at least 1, got {n}")
    for name in _ENV:
        os.environ[name] = str(n)
    if not import_torch and "torch" not in sys.modules:
        return
    import torch  # loads OpenBLAS, so that the call below finds it

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    for path in _loaded_openblas():
        try:
            ctypes.CDLL(path).openblas_set_num_threads(ctypes.c_int(n))
        except (OSError, AttributeError):
            continue  # not an OpenBLAS with that entry point
