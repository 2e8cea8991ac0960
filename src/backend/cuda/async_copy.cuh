// Global -> shared copies that run while the warp computes (cp.async, sm_80 and up), for
// the kernels that stage their operands' tiles in shared memory ahead of use; and bulk
// copies (sm_90), where one thread hands a whole span to the copy engine and the block
// waits on an mbarrier that counts its bytes.
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

// An mbarrier for bulk copies: `arrivals` a phase (by default one, the thread that issues
// the copy). Initialised by one thread, then made visible to the copy engine (the async
// proxy) and, by the caller's __syncthreads, to the block.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// bytes (a multiple of 16; both addresses 16-byte aligned) global -> shared by the copy
// engine, counted on bar, whose phase then completes: called by one thread.
__device__ __forceinline__ void bulk_load(void* s, const void* g, uint32_t bytes, uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(s)),
               "l"(g), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// Waits until bar's phase of this parity (0 for its first, then 1, 0, ...) has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
}

}  // namespace seam::cuda
