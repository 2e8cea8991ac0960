#!/usr/bin/env bash
# Fuzzes one reader of outside bytes with libFuzzer (clang, AddressSanitizer, UBSan):
#   tools/fuzz.sh TARGET [SECONDS]     TARGET: onnx, model_file, safetensors, idx, tokens,
#                                      npy, or all (each for SECONDS; default 1800)
# Builds build-fuzz/ with -DSEAM_FUZZ=ON, seeds the corpus with tests/fuzz/corpus/TARGET
# (and, for onnx, every model of the ONNX backend node tests), runs on one core, and
# copies each input that crashed, hung, leaked or tripped a sanitizer into
# tests/fuzz/regressions/TARGET/, which the test suite replays in every build
# (tests/test_fuzz_regressions.cpp). The fuzzer's own corpus stays in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: tools/fuzz.sh TARGET [SECONDS]}
seconds=${2:-1800}
targets=(onnx model_file safetensors idx tokens npy)
if [ "$target" = all ]; then
  status=0
  for t in "${targets[@]}"; do "$0" "$t" "$seconds" || status=1; done
  exit $status
fi
case " ${targets[*]} " in *" $target "*) ;; *) echo "fuzz: no target '$target' (${targets[*]}, all)" >&2; exit 2 ;; esac
tools/setup.sh
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSEAM_FUZZ=ON \
  -DSEAM_CUDA=OFF -DSEAM_TESTS=OFF >/dev/null
cmake --build build-fuzz --target "seam_fuzz_$target"
corpus=build-fuzz/corpus/$target
crashes=build-fuzz/crashes/$target
mkdir -p "$corpus" "$crashes" "tests/fuzz/regressions/$target"
cp tests/fuzz/corpus/"$target"/* "$corpus/"
cp tests/fuzz/regressions/"$target"/* "$corpus/" 2>/dev/null || true
rm -f "$corpus/README"
if [ "$target" = onnx ]; then
  for m in /usr/share/libonnx-testdata/data/node/*/model.onnx; do
    cp "$m" "$corpus/$(basename "$(dirname "$m")").onnx"
  done
fi
status=0
"build-fuzz/seam_fuzz_$target" "$corpus" -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=10 \
  -max_len=65536 -artifact_prefix="$crashes/" -print_final_stats=1 || status=$?
for f in "$crashes"/*; do
  [ -e "$f" ] || continue
  cp "$f" "tests/fuzz/regressions/$target/"
  echo "fuzz: kept $(basename "$f") in tests/fuzz/regressions/$target/"
done
exit $status
