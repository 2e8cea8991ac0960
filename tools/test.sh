#!/usr/bin/env bash
# Sets up, builds and runs every test that needs no GPU. Tests labelled `gpu` are
# excluded here and reported as skipped; tools/device/run.sh runs them on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
build=${SEAM_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build"
gpu_tests=$(ctest --test-dir "$build" -N -L gpu | awk '/Total Tests:/ {print $3}')
if [ "${gpu_tests:-0}" != "0" ]; then
  echo "test: skipping ${gpu_tests} gpu-labelled tests (no GPU here; they run through tools/device/run.sh)"
fi
ctest --test-dir "$build" --output-on-failure -LE gpu -j"$(nproc)"
# The Python package as a user installs it (pip install . into a virtual environment,
# the CPU backend: the CUDA one is built by the CMake build above where nvcc is), then its
# tests and the PyTorch twin's (which skip themselves without torch).
venv="$build/venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q numpy pytest safetensors tqdm
"$venv/bin/pip" install -q . -C cmake.define.SEAM_CUDA=OFF -C build-dir="$build/python"
SEAM_BIN="$build/seam" "$venv/bin/python" -m pytest -q tests/python
# The CPU suite again under AddressSanitizer and UBSan (docs/reliability.md).
if [ -z "${SEAM_SKIP_SANITIZED:-}" ]; then
  tools/sanitize.sh
fi
