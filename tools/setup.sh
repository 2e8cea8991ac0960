#!/usr/bin/env bash
# Installs what seam needs to build and test on Debian or Ubuntu: compiler, CMake,
# Ninja, OpenBLAS, GoogleTest, CLI11, nlohmann/json, zlib, the Fashion-MNIST data, a text
# corpus (Debian's fortunes, for the language-model path; docs/data.md), protobuf with
# ONNX's schema and the ONNX backend node tests (the importer, docs/onnx.md), OpenMPI (the
# ranks of data-parallel runs) (and, for a CUDA build, cudnn-frontend's headers).
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libopenblas-dev libgtest-dev googletest
          libcli11-dev nlohmann-json3-dev zlib1g-dev dataset-fashion-mnist fortunes python3-pip
          python3-venv libprotobuf-dev protobuf-compiler libonnx-dev libonnx-testdata libopenmpi-dev openmpi-bin)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Where a CUDA compiler is (CMake then builds the CUDA backend), its convolutions need
# cudnn-frontend's headers, from PyPI.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  "$(dirname "$0")/fetch_cudnn_frontend.sh"
fi
