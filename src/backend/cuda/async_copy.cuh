// Global -> shared copies that run while the warp computes (cp.async, sm_80 and up), for
// the kernels that stage their operands' tiles in shared memory ahead of use.
#pragma once
#include <cstdint>

namespace seam::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One 16-byte chunk global -> shared, asynchronously; zeros where !valid (g is then not
// read, but must still be a valid address).
__device__ __forceinline__ void cp16(void* s, const void* g, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(s)), "l"(g), "r"(valid ? 16 : 0)
               : "memory");
}
// The same through L1 (.ca): for data that neighbouring copies of the block read again
// soon (the shifted rows of a convolution's taps).
__device__ __forceinline__ void cp16_l1(void* s, const void* g, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(s)), "l"(g), "r"(valid ? 16 : 0)
               : "memory");
}
// One 4-byte element (rows of f32 values that are not 16-byte aligned).
__device__ __forceinline__ void cp4(void* s, const void* g, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(s)), "l"(g), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace seam::cuda
