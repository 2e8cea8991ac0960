#!/usr/bin/env bash
# Sets up, builds, and trains the default model (examples/fmnist_mlp.json) on
# Fashion-MNIST. Arguments go to `seam train`, e.g. `tools/train.sh examples/fmnist_cnn.json`.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
build=${SEAM_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target seam
exec "$build/seam" train "$@"
