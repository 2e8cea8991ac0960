// Layer norm's kernels, forward (norm.cu) and backward (norm_grad.cu), share these: the
// launch shapes, a row's values in registers as 16-byte packs, the dispatch over the
// register-row widths and storage types, and the operands' checks.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/storage.cuh"

namespace seam::cuda::ln {

constexpr int kWarpBlock = 256;  // warp path: 8 warps (rows in flight) per block
constexpr int kWarps = kWarpBlock / 32;
constexpr int kRowBlock = 512;   // block path
constexpr int kMaxWarpDim = 1024;

// Eight 16-bit values: one 16-byte load, as a float4 is for f32.
template <class T>
struct alignas(16) Pack8 {
  T v[8];
};

// Rows in registers: a lane holds N values of its row, N / V packs of V neighbouring
// values, pack p of lane l at columns (l + 32 p) V ... + V - 1. V = 1 reads one value at
// a time; V = kVec<T> (4 f32 or 8 16-bit values) reads 16 bytes at a time, where the row
// length is a multiple of V and every operand is 16-byte aligned: a warp then has a whole
// row's loads in flight at once instead of 2 bytes a lane.
template <class T>
constexpr int kVec = std::is_same_v<T, float> ? 4 : 8;

// The eight bf16 of a 16-byte word as floats (bf16_unpair a 32-bit word).
__device__ __forceinline__ void bf16_words(const uint4& w, float* out) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = bf16_unpair(u[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// V values of a row as stored, loaded ahead of their use (the next row's, while this one
// is computed): 16-byte words, or one value where V = 1.
template <int V, class S>
struct RawPack {
  static_assert(V == 1 || V * sizeof(S) % 16 == 0);
  static constexpr int kWords = V == 1 ? 1 : V * static_cast<int>(sizeof(S)) / 16;
  std::conditional_t<V == 1, S, uint4> w[kWords];
  __device__ __forceinline__ void load(const S* __restrict__ p) {
    if constexpr (V == 1) w[0] = p[0];
    else
#pragma unroll
      for (int c = 0; c < kWords; ++c) w[c] = reinterpret_cast<const uint4*>(p)[c];
  }
  __device__ __forceinline__ void to(float (&out)[V]) const {
    if constexpr (V == 1) {
      out[0] = to_float(w[0]);
    } else {
      constexpr int kPer16 = 16 / sizeof(S);
#pragma unroll
      for (int c = 0; c < kWords; ++c) {
        if constexpr (std::is_same_v<S, bf16_t>) {
          bf16_words(w[c], out + c * kPer16);
        } else {
          const S* v = reinterpret_cast<const S*>(&w[c]);
#pragma unroll
          for (int i = 0; i < kPer16; ++i) out[c * kPer16 + i] = to_float(v[i]);
        }
      }
    }
  }
};

// V values of a row from p (S: the storage type, or the parameters' f32).
template <int V, class S>
__device__ __forceinline__ void load_pack(const S* __restrict__ p, float (&out)[V]) {
  RawPack<V, S> raw;
  raw.load(p);
  raw.to(out);
}

// Stores V values as S; with kStored, in[] then holds the values as stored (rounded to S),
// from the same conversion.
template <int V, class S, bool kStored = false>
__device__ __forceinline__ void store_pack(S* __restrict__ p, float (&in)[V]) {
  if constexpr (V == 1) {
    const S v = from_float<S>(in[0]);
    p[0] = v;
    if constexpr (kStored) in[0] = to_float(v);  // from the register, not read back from memory
  } else {
    constexpr int kPer16 = 16 / sizeof(S);
#pragma unroll
    for (int c = 0; c < V / kPer16; ++c) {
      uint4 raw;
      S* v = reinterpret_cast<S*>(&raw);
#pragma unroll
      for (int i = 0; i < kPer16; ++i) v[i] = from_float<S>(in[c * kPer16 + i]);
      reinterpret_cast<uint4*>(p)[c] = raw;
      if constexpr (kStored && std::is_same_v<S, bf16_t>) {
        bf16_words(raw, in + c * kPer16);
      } else if constexpr (kStored) {
#pragma unroll
        for (int i = 0; i < kPer16; ++i) in[c * kPer16 + i] = to_float(v[i]);
      }
    }
  }
}

// Adds to kQ neighbouring floats of shared memory in one load and one store (16 bytes
// where kQ = 4): f(e, value e).
template <int kQ, class F>
__device__ __forceinline__ void update_floats(float* at, F&& f) {
  static_assert(kQ == 1 || kQ == 4);
  using Words = std::conditional_t<kQ == 4, float4, float>;
  Words w = *reinterpret_cast<const Words*>(at);
  float* v = reinterpret_cast<float*>(&w);
#pragma unroll
  for (int e = 0; e < kQ; ++e) f(e, v[e]);
  *reinterpret_cast<Words*>(at) = w;
}

// Calls f(std::integral_constant<int, N>{}) for the register-row width N = lane_groups.
template <class F>
void with_lane_groups(int n, F&& f) {
  switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 12: f(std::integral_constant<int, 12>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 24: f(std::integral_constant<int, 24>{}); break;
    default: f(std::integral_constant<int, 32>{}); break;
  }
}

// The warp kernels at N values a lane (lane_groups), in packs of 16 bytes where `vec`
// (N then rounded up to a multiple of the pack: 12 -> 16 for 16-bit values), else one
// value at a time.
template <class T, class F>
void with_packs(int n, bool vec, F&& f) {
  auto go = [&](auto w) {
    constexpr int kN = decltype(w)::value;
    if constexpr (kN % kVec<T> == 0) {
      if (vec) return f(std::integral_constant<int, kN>{}, std::integral_constant<int, kVec<T>>{});
    }
    f(std::integral_constant<int, kN>{}, std::integral_constant<int, 1>{});
  };
  if (vec && n % kVec<T> != 0) n = n < kVec<T> ? kVec<T> : n + kVec<T> - n % kVec<T>;
  with_lane_groups(n, go);
}

// The operands of layer_norm(_grad): `data` (x, y, dy, dx) share x's dtype, `params`
// (gamma, beta, dgamma, dbeta) are f32 or x's dtype, all one, and `stats` (mean, rstd)
// are f32.
inline void expect_ln_dtypes(const StepArgs& a, std::initializer_list<const DeviceTensor*> data,
                      std::initializer_list<const DeviceTensor*> params,
                      std::initializer_list<const DeviceTensor*> stats) {
  const DType t = (*data.begin())->dtype();
  for (const DeviceTensor* d : data) expect_dtype(a, *d, d == *data.begin() ? kStored : std::initializer_list{t});
  const DType p = (*params.begin())->dtype();
  for (const DeviceTensor* d : params) {
    if (d != *params.begin()) expect_dtype(a, *d, {p});
    else if (t == DType::f32) expect_dtype(a, *d, {DType::f32});
    else expect_dtype(a, *d, {DType::f32, t});
  }
  for (const DeviceTensor* d : stats) expect_dtype(a, *d, {DType::f32});
}

// Calls f.template operator()<T, P>() with x's storage type T and gamma's P (f32 or T).
template <class F>
void dispatch_ln(const StepArgs& a, DType x, DType gamma, F&& f) {
  dispatch_storage(x, op_name(a.step.op), [&]<class T>() {
    if (gamma == DType::f32) f.template operator()<T, float>();
    else f.template operator()<T, T>();
  });
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

Launch prepare_layer_norm_grad(const StepArgs& a);  // norm_grad.cu

}  // namespace seam::cuda::ln
