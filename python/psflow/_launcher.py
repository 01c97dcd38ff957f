"""The `psflow` command of a pip-installed psflow: runs the psflow binary bundled in this package
(psflow/_bin/psflow, built by setup.py with the project's CMake) with the same arguments."""
import os
import sys


def main():
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "psflow")
    if not os.access(binary, os.X_OK):
        print(f"psflow: error: {binary} is missing: this psflow package was not installed by pip "
              "(pip install --no-build-isolation . in the psflow source tree)", file=sys.stderr)
        return 1
    os.execv(binary, ["psflow"] + sys.argv[1:])  # the binary finds itself through /proc/self/exe


if __name__ == "__main__":
    sys.exit(main())
