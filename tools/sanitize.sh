#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer and UndefinedBehaviorSanitizer (leaks
# included): builds build-asan/ without the CUDA backend and runs every test that needs no
# GPU. tools/test.sh runs it after the normal suite, so CI does too. Any report fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
build=${SEAM_ASAN_BUILD_DIR:-build-asan}
# Without MPI: OpenMPI leaves allocations of its own at exit, many in plugins it has
# unloaded by then, which LeakSanitizer reports without a library to suppress them by.
# The ranks' collectives run in the normal suite (Dist.CollectivesAt2Ranks, ...4Ranks).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSEAM_CUDA=OFF -DSEAM_MPI=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build"
# alloc_dealloc_mismatch is off: GCC 12's libstdc++ frees std::stable_sort's temporary
# buffer (allocated with operator new) through a path ASan reports as free(), in every
# nearest-name suggestion; nothing of seam's is involved. allocator_may_return_null: the test
# that asks for a 1 PiB arena expects the failed allocation a normal allocator reports.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:alloc_dealloc_mismatch=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir "$build" --output-on-failure -LE gpu -j"$(nproc)"
