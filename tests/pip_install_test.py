#!/usr/bin/env python3
"""pip install and wheel (pyproject.toml, setup.py; docs/pytorch.md#install-with-pip), as a user
does it from a fresh copy of the sources in a temporary directory:

  1. python3 -m venv --system-site-packages V1; V1/bin/pip install --no-build-isolation --no-index SRC
  2. python3 -m build --wheel --no-isolation SRC; a second venv V2; V2/bin/pip install --no-index WHEEL

In each venv `import psflow` must come from that venv (not from the .pth file setup writes for
Debian's python3), the `psflow` command must be the venv's, and two short jobs must exit 0 with the
target step: `psflow local --ps=1 --workers=1 --train_steps=50` (C++ workers) and the same with the
venv's python running examples/pytorch/mnist_mlp.py as the worker (psflow.WorkerSession). The copy's
CMake build compiles through ccache, so it reuses the objects of the build this test belongs to; the
install times are printed (no assertion on them). Everything is removed at the end.

    tests/pip_install_test.py --source . --data_dir data/mnist
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

PYTHON = "/usr/bin/python3"  # Debian's: its torch and numpy reach the venvs via --system-site-packages


def run(cmd, env, cwd, timeout=1800):
    print("$", " ".join(cmd), flush=True)
    start = time.monotonic()
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    secs = time.monotonic() - start
    if r.returncode != 0:
        print("--- stdout\n" + r.stdout[-6000:] + "\n--- stderr\n" + r.stderr[-6000:], flush=True)
        raise AssertionError(f"`{' '.join(cmd)}` exited {r.returncode}")
    return r, secs


def check_venv(venv, env, data_dir, work, source_copy):
    """Import, command and two short training jobs from one venv."""
    py = os.path.join(venv, "bin", "python")
    r, _ = run([py, "-c", "import psflow, sys; print(psflow.__file__); print(psflow.__version__)"], env, work)
    where = r.stdout.splitlines()[0]
    assert where.startswith(os.path.realpath(venv) + os.sep) or where.startswith(venv + os.sep), \
        f"import psflow found {where}, not the package installed in {venv}"
    command = os.path.join(venv, "bin", "psflow")
    r, _ = run([command, "--version"], env, work)
    assert r.stdout.startswith("psflow "), r.stdout
    r, _ = run([command, "local", "--ps=1", "--workers=1", "--train_steps=50", f"--data_dir={data_dir}"], env, work)
    assert re.search(r"workers=1 ps=1 global_step=50\b", r.stdout), r.stdout[-3000:]
    # The worker is the venv's python running a PyTorch script through psflow.WorkerSession.
    r, _ = run([command, "local", "--ps=1", "--workers=1", "--train_steps=50", f"--data_dir={data_dir}", "--",
                py, os.path.join(source_copy, "examples", "pytorch", "mnist_mlp.py")], env, work)
    assert re.search(r"global_step=50\b", r.stdout), r.stdout[-3000:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--data_dir", default=None)
    args = ap.parse_args()
    source = os.path.abspath(args.source)
    data_dir = os.path.abspath(args.data_dir or os.path.join(source, "data", "mnist"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TF_CONFIG", "PSFLOW_FLAGS", "PSFLOW_BUILD_DIR", "CCACHE_BASEDIR")
           and not k.startswith("SLURM_")}
    tmp = tempfile.mkdtemp(prefix="psflow_pip_")
    try:
        # A fresh copy of the sources, as a clone would be (no build trees, no data).
        src = os.path.join(tmp, "psflow")
        def ignore(directory, names):
            top = os.path.abspath(directory) == source
            return [n for n in names if n in (".git", "__pycache__") or n.endswith(".egg-info") or
                    (top and (n.startswith("build") or n in ("data", "dist")))]
        shutil.copytree(source, src, symlinks=True, ignore=ignore)

        v1 = os.path.join(tmp, "venv")
        run([PYTHON, "-m", "venv", "--system-site-packages", v1], env, tmp)
        _, pip_secs = run([os.path.join(v1, "bin", "pip"), "install", "--no-build-isolation", "--no-index", src],
                          env, tmp)
        check_venv(v1, env, data_dir, tmp, src)

        dist = os.path.join(tmp, "dist")
        _, wheel_build_secs = run([PYTHON, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, src], env, tmp)
        wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
        assert len(wheels) == 1 and re.match(r"psflow-[0-9.]+-cp3\d+-cp3\d+-linux_\w+\.whl$", wheels[0]), wheels
        v2 = os.path.join(tmp, "venv2")
        run([PYTHON, "-m", "venv", "--system-site-packages", v2], env, tmp)
        _, wheel_install_secs = run([os.path.join(v2, "bin", "pip"), "install", "--no-index",
                                     os.path.join(dist, wheels[0])], env, tmp)
        check_venv(v2, env, data_dir, tmp, src)
        print(f"install times: pip install of a fresh source copy into a venv {pip_secs:.1f} s "
              f"(CMake build through ccache); python3 -m build --wheel {wheel_build_secs:.1f} s (same tree, "
              f"incremental); pip install of the wheel into another venv {wheel_install_secs:.1f} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("pip_install_test: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
