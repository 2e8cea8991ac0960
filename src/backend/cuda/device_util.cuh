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

}  // namespace seam::cuda
