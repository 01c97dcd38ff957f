"""Builds the psflow wheel with the project's CMake (pyproject.toml has the metadata).

build_py configures and builds the targets `psflow` (the binary) and `psflow_python` (the
extension psflow._psflow) in a CMake tree, then copies the extension next to the package's Python
files and the binary to psflow/_bin/psflow (run by the `psflow` console command, _launcher.py).

The tree is PSFLOW_BUILD_DIR when set (an existing tree, e.g. the README's `build`: only what
changed is rebuilt), else `build-pip` beside `build`. It sits at the same depth as `build`, and
CCACHE_BASEDIR is set to the source's parent for the build (unless already set), so ccache
(which the top-level CMakeLists.txt uses when installed) serves every object `build` or another
clone at the same depth compiled already. setuptools' own files go to build-wheel/.
"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

SOURCE = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(SOURCE, "build-wheel"), exist_ok=True)  # egg_base must exist


def project_version():
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        return re.search(r"project\(psflow VERSION ([0-9.]+)", f.read()).group(1)


def run_logged(cmd, env, log_path):
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        r = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        with open(log_path) as log:
            tail = log.read().splitlines()[-40:]
        sys.stderr.write("\n".join(tail) + "\n")
        raise SystemExit(f"psflow: `{' '.join(cmd)}` failed (log: {log_path})")


class CMakeBuildPy(build_py):
    def run(self):
        super().run()  # the package's .py files into build_lib
        tree = os.path.abspath(os.environ.get("PSFLOW_BUILD_DIR") or os.path.join(SOURCE, "build-pip"))
        os.makedirs(tree, exist_ok=True)
        env = dict(os.environ)
        env.setdefault("CCACHE_BASEDIR", os.path.dirname(SOURCE))
        log = os.path.join(tree, "pip-build.log")
        print(f"psflow: building psflow and psflow_python in {tree} (log: {log})", flush=True)
        if not os.path.exists(os.path.join(tree, "CMakeCache.txt")):
            run_logged(["cmake", "-S", SOURCE, "-B", tree, "-DCMAKE_BUILD_TYPE=Release"], env, log)
        run_logged(["cmake", "--build", tree, f"-j{os.cpu_count() or 1}", "--target", "psflow", "psflow_python"],
                   env, log)
        package = os.path.join(self.build_lib, "psflow")
        built = os.path.join(tree, "python", "psflow")
        extensions = [f for f in os.listdir(built) if f.startswith("_psflow") and f.endswith(".so")]
        if len(extensions) != 1:
            raise SystemExit(f"psflow: expected one _psflow*.so in {built}, found {extensions}")
        shutil.copy2(os.path.join(built, extensions[0]), package)
        os.makedirs(os.path.join(package, "_bin"), exist_ok=True)
        shutil.copy2(os.path.join(tree, "psflow"), os.path.join(package, "_bin", "psflow"))


class BinaryDistribution(Distribution):
    """A platform wheel (linux_x86_64, this Python): it carries a compiled extension and binary."""

    def has_ext_modules(self):
        return True


setup(
    version=project_version(),
    cmdclass={"build_py": CMakeBuildPy},
    distclass=BinaryDistribution,
    options={"build": {"build_base": os.path.join(SOURCE, "build-wheel")},
             "egg_info": {"egg_base": os.path.join(SOURCE, "build-wheel")}},
)
