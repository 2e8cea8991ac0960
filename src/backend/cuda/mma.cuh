// Tensor-core products of one warp (mma.sync, sm_80 and up) on fragments held in
// registers, for the kernels that place operands themselves (flash attention, the
// convolution weight gradient's band kernel). Fragment layouts (PTX ISA, "Matrix
// fragments for mma.m16n8k16 / m16n8k8"), with g = lane / 4 and t = lane % 4:
//   16-bit, m16n8k16: a0 (row g, cols 2t, 2t+1), a1 (row g+8), a2 (row g, cols 2t+8, 2t+9),
//     a3 (row g+8, cols 2t+8, 2t+9); b0 (rows 2t, 2t+1, col g), b1 (rows 2t+8, 2t+9).
//   TF32, m16n8k8: a0 (row g, col t), a1 (row g+8), a2 (row g, col t+4), a3 (row g+8,
//     col t+4); b0 (row t, col g), b1 (row t+4).
//   The f32 accumulator, both: c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/storage.cuh"

namespace seam::cuda {

// c += a b for one m16n8k16 tile of bf16 or f16 operands (T says which).
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>, "16-bit operands");
  if constexpr (std::is_same_v<T, bf16_t>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// c += a b for one m16n8k8 tile of TF32 operands (registers from to_tf32).
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// An f32 rounded to TF32 (to nearest, ties away: what cuBLAS and cuDNN's TF32 do).
__device__ __forceinline__ uint32_t to_tf32(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return r;
}

// Two 16-bit values' bits as one register, lo in the low half.
__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

}  // namespace seam::cuda
