// Storage types of the CUDA kernels. Values are stored as f32, bf16 or f16 and computed
// in float: a kernel templated on its storage type T loads with to_float and stores with
// from_float (round to nearest even), so one implementation serves every precision.
// Kernels that also take f64 (elementwise, reductions, pooling, casts: what an f64
// network that is not trained on tensor cores needs) compute in compute_t<T>, which is
// double for it, through to_compute and from_compute, and dispatch with dispatch_value.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/cuda.h"

namespace seam::cuda {

using bf16_t = __nv_bfloat16;
using f16_t = __half;

template <class T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return static_cast<float>(v);
}
template <class T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, bf16_t>) return __float2bfloat16_rn(v);
  else return __float2half_rn(v);
}

// Two values rounded to bf16 as the 32 bits they are stored in, and back. The way back is
// exact and one instruction a value: a bf16 is a float's top half, so the low value is
// the word shifted up and the high one the word masked (the conversion intrinsics take
// two for the high half).
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return reinterpret_cast<const uint32_t&>(v);
}
__device__ __forceinline__ float2 bf16_unpair(uint32_t bits) {
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}

// Calls f.template operator()<T>() with the storage type of a float dtype the kernels
// take (f32, bf16, f16); throws naming `what` otherwise.
template <class F>
void dispatch_storage(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f32: f.template operator()<float>(); return;
    case DType::bf16: f.template operator()<bf16_t>(); return;
    case DType::f16: f.template operator()<f16_t>(); return;
    default: fail(what, ": the CUDA kernels store f32, bf16 or f16, got ", dtype_name(t));
  }
}

// What a kernel computes in for storage type T: double for f64, float otherwise.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
__device__ __forceinline__ compute_t<T> to_compute(T v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else return to_float(v);
}
template <class T>
__device__ __forceinline__ T from_compute(compute_t<T> v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else return from_float<T>(v);
}

// dispatch_storage with f64 (double) as well, for the kernels that compute in compute_t.
template <class F>
void dispatch_value(DType t, const char* what, F&& f) {
  if (t == DType::f64) f.template operator()<double>();
  else dispatch_storage(t, what, f);
}

// The storage type of a DType, for checks (dtype_of<float>() == DType::f32).
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  else if constexpr (std::is_same_v<T, double>) return DType::f64;
  else if constexpr (std::is_same_v<T, bf16_t>) return DType::bf16;
  else return DType::f16;
}

}  // namespace seam::cuda
