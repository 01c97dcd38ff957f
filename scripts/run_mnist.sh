#!/usr/bin/env bash
# The main job: set up, then train the seed MNIST mlp on a local cluster (1 ps + 2 workers as
# separate processes on 127.0.0.1) and print the final summary. Extra flags go to `psflow local`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
exec build/psflow local --ps=1 --workers=2 --model=mlp --train_steps=10000 --batch_size=100 \
  --optimizer=adam --learning_rate=0.01 --data_dir=data/mnist "$@"
