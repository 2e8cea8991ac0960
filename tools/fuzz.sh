#!/usr/bin/env bash
# Fuzzes the ONNX importer with libFuzzer (clang, AddressSanitizer, UBSan):
#   tools/fuzz.sh [SECONDS]   (default 1800)
# Builds build-fuzz/ with -DSEAM_FUZZ=ON, seeds the corpus with the ONNX backend node
# tests' models (libonnx-testdata), runs for SECONDS on one core, and copies every input
# that crashed into tests/fuzz/onnx_regressions/, which the test suite replays
# (Onnx.FuzzRegressionsAreRefusedOrImported) in every build.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-1800}
tools/setup.sh
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSEAM_FUZZ=ON \
  -DSEAM_CUDA=OFF -DSEAM_TESTS=OFF >/dev/null
cmake --build build-fuzz --target seam_onnx_fuzz
corpus=build-fuzz/onnx_corpus
mkdir -p "$corpus" build-fuzz/onnx_crashes
for m in /usr/share/libonnx-testdata/data/node/*/model.onnx; do
  cp "$m" "$corpus/$(basename "$(dirname "$m")").onnx"
done
cp tests/fuzz/onnx_regressions/* "$corpus/" 2>/dev/null || true
status=0
build-fuzz/seam_onnx_fuzz "$corpus" -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=65536 \
  -artifact_prefix=build-fuzz/onnx_crashes/ -print_final_stats=1 || status=$?
for f in build-fuzz/onnx_crashes/*; do
  [ -e "$f" ] || continue
  cp "$f" tests/fuzz/onnx_regressions/
  echo "fuzz: kept $(basename "$f") in tests/fuzz/onnx_regressions/"
done
exit $status
