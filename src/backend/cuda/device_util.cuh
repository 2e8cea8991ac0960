// Device-side helpers shared by the CUDA kernels: error reports, warp and block sums.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda.h"

namespace seam::cuda {

// Records the first error of a run; later ones are dropped.
__device__ inline void report_error(DeviceError* e, int step, int code, int64_t a, int64_t b, int64_t c) {
  if (atomicCAS(&e->code, kNoError, code) == kNoError) {
    e->step = step;
    e->a = a;
    e->b = b;
    e->c = c;
  }
}

template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T>
__device__ inline T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block whose size is a multiple of 32 (at most 1024); every thread gets it.
template <class T>
__device__ inline T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? partial[lane] : T(0);
  return warp_sum(v);
}

template <class T>
__device__ inline T block_max(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? partial[lane] : partial[0];
  return warp_max(v);
}

// Division by a divisor fixed at launch, for index arithmetic: a 32-bit division is a
// few dozen instructions, this a multiply-high, an add and a shift (the round-up method
// of Granlund and Montgomery). Exact for dividends in [0, 2^31) and divisors in [1, 2^31].
struct FastDivisor {
  uint32_t d = 1, magic = 1, shift = 0;
  FastDivisor() = default;
  explicit FastDivisor(uint32_t divisor) : d(divisor) {
    while ((uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ int32_t div(int32_t n) const {
    const uint32_t u = static_cast<uint32_t>(n);
    return static_cast<int32_t>((__umulhi(u, magic) + u) >> shift);
  }
};

}  // namespace seam::cuda
