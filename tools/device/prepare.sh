#!/usr/bin/env bash
# Prepares what the GPU machine needs and lacks (it has no package manager and no
# network): builds seam with CUDA for sm_90a (+ PTX) here, without OpenBLAS (the GPU
# machine has none; the CPU reference kernels then use their plain GEMM), and copies the
# binaries and the Fashion-MNIST files into .deps/, an ignored folder that travels with
# the source tree (`carry: [".deps"]`). Then tools/device/run.sh runs there.
#
#   tools/device/prepare.sh           the binaries, the data
#   tools/device/prepare.sh python    also the Python package's wheel with its CUDA backend,
#                                     for the GPU machine's Python ($SEAM_DEVICE_PYTHON, a
#                                     3.12 interpreter here: gpu-facts.md) -> .deps/py/
#   tools/device/prepare.sh pack NAME the checked-out tree's seam and GPU tests alone, packed
#                                     as .deps/packs/NAME.tar.xz (~17 MB) with its commit, for
#                                     run.sh's `ab` step: check out each build to compare, pack
#                                     it, and carry [".deps/packs"] (three fit the 64 MiB carry)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = pack ]; then
  name=${2:?prepare.sh pack NAME}
  build=build-gpu
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSEAM_CUDA=ON -DSEAM_BLAS=OFF >/dev/null
  cmake --build "$build" --target seam seam_gpu_tests
  tmp=$(mktemp -d)
  mkdir -p "$tmp/bin" .deps/packs
  cp "$build/seam" "$build/tests/seam_gpu_tests" "$tmp/bin/"
  strip "$tmp/bin/"*
  tar -C "$tmp" -cJf ".deps/packs/$name.tar.xz" bin
  rm -rf "$tmp"
  { git rev-parse --short HEAD; git diff --quiet && git diff --cached --quiet || echo "+uncommitted"; } |
    paste -sd ' ' > ".deps/packs/$name.commit"
  du -ch .deps/packs/*.tar.xz  # each pack, and the total to carry
  exit 0
fi
tools/setup.sh
if [ "${1:-}" = python ]; then
  py=${SEAM_DEVICE_PYTHON:-}
  if [ -z "$py" ]; then  # a 3.12 that runs (a pyenv shim may name one it cannot run)
    for c in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3; do
      if "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then py=$c; break; fi
    done
  fi
  [ -n "$py" ] || { echo "prepare: no Python 3.12 here to build the GPU machine's wheel (set SEAM_DEVICE_PYTHON)"; exit 1; }
  rm -rf .deps/py && mkdir -p .deps/py
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$py" -m pip wheel . --no-deps -w .deps/py -C cmake.define.SEAM_BLAS=OFF \
    -C build-dir=build-py/cuda312
  du -sh .deps/py/*
fi
build=build-gpu
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSEAM_CUDA=ON -DSEAM_BLAS=OFF >/dev/null
cmake --build "$build" --target seam seam_gpu_tests seam_tests seam_wgmma_bench
rm -rf .deps/bin .deps/bin.tar.xz && mkdir -p .deps/bin .deps/fashion-mnist
cp "$build/seam" "$build/tests/seam_gpu_tests" "$build/tests/seam_tests" "$build/seam_wgmma_bench" .deps/bin/
strip .deps/bin/*
# The kernels' fatbins (sm_90a cubins and PTX for three storage types) compress about
# sixfold: the binaries travel packed, within the carry limit, and run.sh unpacks them.
tar -C .deps -cJf .deps/bin.tar.xz bin && rm -rf .deps/bin
cp /usr/share/datasets/fashion-mnist/*.gz .deps/fashion-mnist/
# The language models' corpus (run.sh lm): Debian's fortunes as byte tokens (5 MB).
rm -rf .deps/fortunes
"$build/seam" tokenize $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort) \
  --out .deps/fortunes >/dev/null
# The ONNX backend node tests (27 MB, 4 MB packed; run.sh's onnx step unpacks them).
tar -czf .deps/onnx-node.tgz -C /usr/share/libonnx-testdata/data node
git rev-parse --short HEAD > .deps/commit
git diff --quiet && git diff --cached --quiet || echo "+uncommitted" >> .deps/commit
du -sh .deps
