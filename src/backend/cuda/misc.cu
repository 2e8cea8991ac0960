// CUDA kernels of the small ops: full, cast, copy, argmax, dropout, embedding and its
// gradient. Same results as the CPU reference (src/backend/cpu/misc.cpp), bit for bit
// where the CPU's result is exact: casts follow its rounding rules, dropout draws the
// same Philox numbers (seed and step read on the device from DeviceCounters). Float
// values are stored as T (f32, bf16 or f16, storage.cuh) and computed in float.
#include <cmath>
#include <limits>
#include <cstring>
#include <type_traits>

#include <cub/device/device_radix_sort.cuh>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/storage.cuh"
#include "common/half.h"
#include "common/philox.h"

namespace seam::cuda {

namespace {

constexpr int kThreads = 256;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- full --------------------------------------------------------------------------

template <class U>
__global__ void __launch_bounds__(kThreads) fill_kernel(U* y, U v, int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = v;
}

template <class U>
Launch fill_launch(void* y, U v, int64_t n, unsigned cap) {
  const unsigned blocks = blocks_for(n, kThreads, static_cast<int>(cap));
  U* p = static_cast<U*>(y);
  return [=](cudaStream_t stream) {
    fill_kernel<U><<<blocks, kThreads, 0, stream>>>(p, v, n);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// ---- loss_scale --------------------------------------------------------------------

__global__ void loss_scale_kernel(const DeviceCounters* c, float init, float* y) {
  *y = c->loss_scale > 0.f ? c->loss_scale : init;
}

Launch loss_scale(const StepArgs& a) {
  expect_dtype(a, a.out[0], {DType::f32});
  const DeviceCounters* c = a.ctx.counters;
  const auto init = static_cast<float>(a.step.attrs.f("init"));
  float* y = a.out[0].as<float>();
  return [=](cudaStream_t stream) {
    loss_scale_kernel<<<1, 1, 0, stream>>>(c, init, y);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// The CPU's store rules: floats round to nearest even; integers truncate toward zero and
// saturate, NaN to 0.
int32_t to_i32(double v) {
  return std::isnan(v) ? 0 : static_cast<int32_t>(std::fmax(-2147483648.0, std::fmin(2147483647.0, std::trunc(v))));
}
uint8_t to_u8(double v) {
  return std::isnan(v) ? 0 : static_cast<uint8_t>(std::fmax(0.0, std::fmin(255.0, std::trunc(v))));
}

Launch full(const StepArgs& a) {
  const double v = a.step.attrs.f("value");
  void* y = a.out[0].data;
  const int64_t n = a.out[0].numel();
  const size_t bytes = a.out[0].type.bytes();
  const unsigned cap = grid_cap(a.ctx);
  // The element's bits, converted once here.
  uint64_t bits = 0;
  switch (a.out[0].dtype()) {
    case DType::f32: {
      const auto f = static_cast<float>(v);
      std::memcpy(&bits, &f, 4);
      break;
    }
    case DType::f64: std::memcpy(&bits, &v, 8); break;
    case DType::bf16: bits = float_to_bf16(static_cast<float>(v)); break;
    case DType::f16: bits = float_to_f16(static_cast<float>(v)); break;
    case DType::i32: bits = static_cast<uint32_t>(to_i32(v)); break;
    case DType::u8: bits = to_u8(v); break;
  }
  const size_t es = dtype_size(a.out[0].dtype());
  if (bits == 0 || es == 1) {
    const int byte = static_cast<int>(bits & 0xff);
    return [=](cudaStream_t stream) { SEAM_CUDA_CHECK(cudaMemsetAsync(y, byte, bytes, stream)); };
  }
  switch (es) {
    case 2: return fill_launch<uint16_t>(y, static_cast<uint16_t>(bits), n, cap);
    case 4: return fill_launch<uint32_t>(y, static_cast<uint32_t>(bits), n, cap);
    default: return fill_launch<unsigned long long>(y, static_cast<unsigned long long>(bits), n, cap);
  }
}

// ---- cast --------------------------------------------------------------------------
// Device copies of common/half.h's conversions (same bit manipulations, same results).

__device__ __forceinline__ uint16_t dev_float_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if (isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ float dev_bf16_to_float(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

__device__ __forceinline__ uint16_t dev_float_to_f16(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t mag = u & 0x7FFFFFFFu;
  if (mag >= 0x7F800000u) return static_cast<uint16_t>(sign | (mag > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (mag >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to inf
  if (mag < 0x38800000u) {  // subnormal or zero in f16: round at 2^-24 granularity
    const float v = __uint_as_float(mag) * 16777216.0f;  // in units of 2^-24, exact
    const auto q = static_cast<uint32_t>(rintf(v));      // to nearest even
    return static_cast<uint16_t>(sign | q);
  }
  const uint32_t e = ((mag >> 23) - 112) << 10;
  const uint32_t m = mag & 0x7FFFFFu;
  uint32_t h = e | (m >> 13);
  const uint32_t rest = m & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}
__device__ __forceinline__ float dev_f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) return (sign ? -1.0f : 1.0f) * static_cast<float>(m) / 16777216.0f;
  if (e == 31) return __uint_as_float(sign | 0x7F800000u | (m << 13));
  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}

__device__ __forceinline__ double load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::bf16: return dev_bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return dev_f16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

__device__ __forceinline__ void store(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::f64: static_cast<double*>(p)[i] = v; return;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = dev_float_to_bf16(static_cast<float>(v)); return;
    case DType::f16: static_cast<uint16_t*>(p)[i] = dev_float_to_f16(static_cast<float>(v)); return;
    case DType::i32:
      static_cast<int32_t*>(p)[i] = isnan(v) ? 0 : static_cast<int32_t>(fmax(-2147483648.0, fmin(2147483647.0, trunc(v))));
      return;
    case DType::u8:
      static_cast<uint8_t*>(p)[i] = isnan(v) ? 0 : static_cast<uint8_t>(fmax(0.0, fmin(255.0, trunc(v))));
      return;
  }
}

__global__ void __launch_bounds__(kThreads) cast_kernel(const void* x, DType from, void* y, DType to, int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    store(y, to, i, load(x, from, i));
}

// Eight values of T, 16-byte aligned: one or two 128-bit accesses.
template <class T>
struct alignas(16) Eight {
  T v[8];
};

// Between the stored float types (the casts of mixed precision, on every step): through
// float, 8 values a thread when both pointers are 16-byte aligned (nvec groups), then
// the scalar tail. from_float rounds to nearest even as the CPU's conversions do.
template <class From, class To>
__global__ void __launch_bounds__(kThreads) cast_stored(const From* x, To* y, int64_t n, int64_t nvec) {
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = first; i < nvec; i += stride) {
    const Eight<From> v = reinterpret_cast<const Eight<From>*>(x)[i];
    Eight<To> r;
#pragma unroll
    for (int k = 0; k < 8; ++k) r.v[k] = from_float<To>(to_float(v.v[k]));
    reinterpret_cast<Eight<To>*>(y)[i] = r;
  }
  for (int64_t i = nvec * 8 + first; i < n; i += stride) y[i] = from_float<To>(to_float(x[i]));
}

template <class From, class To>
Launch cast_stored_launch(const void* x, void* y, int64_t n, unsigned cap) {
  const int64_t nvec = aligned16(x) && aligned16(y) ? n / 8 : 0;
  const unsigned blocks = blocks_for(nvec > 0 ? nvec : n, kThreads, static_cast<int>(cap));
  const auto* xs = static_cast<const From*>(x);
  auto* ys = static_cast<To*>(y);
  return [=](cudaStream_t stream) {
    cast_stored<From, To><<<blocks, kThreads, 0, stream>>>(xs, ys, n, nvec);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

bool is_stored(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

Launch cast(const StepArgs& a) {
  const void* x = a.in[0].data;
  void* y = a.out[0].data;
  const DType from = a.in[0].dtype(), to = a.out[0].dtype();
  const int64_t n = a.out[0].numel();
  if (from == to) {
    const size_t bytes = a.out[0].type.bytes();
    return [=](cudaStream_t stream) {
      SEAM_CUDA_CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, stream));
    };
  }
  const unsigned cap = grid_cap(a.ctx);
  if (is_stored(from) && is_stored(to)) {
    Launch l;
    dispatch_storage(from, "cast", [&]<class F>() {
      dispatch_storage(to, "cast", [&]<class T>() { l = cast_stored_launch<F, T>(x, y, n, cap); });
    });
    return l;
  }
  // f64 and the integer types: the CPU's rules element by element.
  const unsigned blocks = blocks_for(n, kThreads, static_cast<int>(cap));
  return [=](cudaStream_t stream) {
    cast_kernel<<<blocks, kThreads, 0, stream>>>(x, from, y, to, n);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// ---- copy --------------------------------------------------------------------------

Launch copy(const StepArgs& a) {
  const void* x = a.in[0].data;
  void* y = a.out[0].data;
  const size_t bytes = a.out[0].type.bytes();
  return [=](cudaStream_t stream) {
    if (x != y) SEAM_CUDA_CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, stream));
  };
}

// ---- argmax ------------------------------------------------------------------------
// The CPU scans j = 1.. keeping `best` while !(x[j] > x[best]): the first index of the
// largest value, NaNs never chosen, except that a NaN at index 0 stays the answer.

// Is (v, j) ahead of (bv, bj)? Larger value first, then smaller index.
__device__ __forceinline__ bool ahead(float v, int64_t j, float bv, int64_t bj) {
  return v > bv || (v == bv && j < bj);
}

// inner == 1: one warp per row of `len` contiguous values, the first `classes` of them
// scanned, V at a time: one value (V = 1), or 16 bytes (4 f32 or 8 16-bit values) where
// rows are a multiple of that and aligned, so that a warp has 512 bytes of the row in
// flight rather than 64 (a language model's logits: 100 KB rows, read at bandwidth).
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    argmax_rows(const T* x, int32_t* y, int64_t rows, int64_t len, int64_t classes) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x >> 5);
  for (int64_t o = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5; o < rows; o += warps) {
    const T* p = x + o * len;
    float bv = -INFINITY;
    int64_t bj = INT64_MAX;  // none yet; any real element, even -inf, is ahead of it
    for (int64_t q = lane; q * V < classes; q += 32) {
      T e[V];
      if constexpr (V == 1) {
        e[0] = p[q];
      } else {
        static_assert(V * sizeof(T) == 16);
        *reinterpret_cast<uint4*>(e) = *reinterpret_cast<const uint4*>(p + q * V);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float v = to_float(e[i]);
        const int64_t j = q * V + i;
        if (j < classes && !isnan(v) && ahead(v, j, bv, bj)) bv = v, bj = j;
      }
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, s);
      const int64_t oj = __shfl_xor_sync(0xffffffffu, bj, s);
      if (ahead(ov, oj, bv, bj)) bv = ov, bj = oj;
    }
    if (lane == 0) y[o] = isnan(to_float(p[0])) ? 0 : static_cast<int32_t>(bj);
  }
}

// inner > 1: one thread per output, the CPU's loop (coalesced across the inner index).
template <class T>
__global__ void __launch_bounds__(kThreads)
    argmax_strided(const T* x, int32_t* y, int64_t outputs, int64_t len, int64_t inner, int64_t classes) {
  for (int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; o < outputs;
       o += int64_t{gridDim.x} * blockDim.x) {
    const int64_t outer = o / inner, i = o - outer * inner;
    const T* p = x + outer * len * inner + i;
    int64_t best = 0;
    float bv = to_float(p[0]);
    for (int64_t j = 1; j < classes; ++j) {
      const float v = to_float(p[j * inner]);
      if (v > bv) best = j, bv = v;
    }
    y[o] = static_cast<int32_t>(best);
  }
}

template <class T>
Launch argmax_as(const StepArgs& a) {
  const Shape& s = a.in[0].shape();
  const int axis = normalize_axis(a.step.attrs.i("axis"), s.size());
  SEAM_ASSERT(axis >= 0);
  int64_t outer = 1, len = s[static_cast<size_t>(axis)], inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t classes = a.step.attrs.i("classes") > 0 ? a.step.attrs.i("classes") : len;
  const T* x = a.in[0].as<const T>();
  int32_t* y = a.out[0].as<int32_t>();
  const unsigned cap = grid_cap(a.ctx);
  if (inner == 1 && classes >= 32) {
    const unsigned blocks = blocks_for(outer * 32, kThreads, static_cast<int>(cap));
    constexpr int kV = 16 / sizeof(T);
    const bool vec = len % kV == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    return [=](cudaStream_t stream) {
      if (vec) argmax_rows<T, kV><<<blocks, kThreads, 0, stream>>>(x, y, outer, len, classes);
      else argmax_rows<T, 1><<<blocks, kThreads, 0, stream>>>(x, y, outer, len, classes);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  }
  const int64_t outputs = outer * inner;
  const unsigned blocks = blocks_for(outputs, kThreads, static_cast<int>(cap));
  return [=](cudaStream_t stream) {
    argmax_strided<T><<<blocks, kThreads, 0, stream>>>(x, y, outputs, len, inner, classes);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

Launch argmax(const StepArgs& a) {
  expect_dtype(a, a.in[0], kStored);
  expect_dtype(a, a.out[0], {DType::i32});
  Launch l;
  dispatch_storage(a.in[0].dtype(), "argmax", [&]<class T>() { l = argmax_as<T>(a); });
  return l;
}

// ---- dropout -----------------------------------------------------------------------
// y = u >= p ? x * (1 / (1 - p)) : 0 with u = dropout_uniform(seed, step, stream, i):
// one Philox call gives the four draws of elements 4g .. 4g+3 (word i % 4 of counter
// (i / 4, step, stream)), exactly as dropout_uniform computes each. A thread's four
// values move as one access (float4, or 8 bytes of a 16-bit type) when aligned.

template <class T>
struct alignas(4 * sizeof(T)) Four {
  T v[4];
};

template <class T>
__device__ __forceinline__ T drop(float u, float p, T x, float keep_scale) {
  return from_float<T>(u >= p ? to_float(x) * keep_scale : 0.0f);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    dropout_kernel(const T* x, T* y, int64_t n, float p, float keep_scale, uint32_t stream,
                   const DeviceCounters* counters, bool vec) {
  const uint64_t seed = counters->seed;
  const auto step = static_cast<uint64_t>(counters->step);
  const auto k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; g < groups; g += int64_t{gridDim.x} * blockDim.x) {
    const auto block = static_cast<uint64_t>(g);
    const Philox4 r = philox4x32(
        {{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), static_cast<uint32_t>(step), stream}}, k0,
        k1);
    const int64_t i = g * 4;
    if (vec && i + 4 <= n) {
      Four<T> v = reinterpret_cast<const Four<T>*>(x)[g];
#pragma unroll
      for (int k = 0; k < 4; ++k) v.v[k] = drop(philox_uniform(r.v[k]), p, v.v[k], keep_scale);
      reinterpret_cast<Four<T>*>(y)[g] = v;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (i + k < n) y[i + k] = drop(philox_uniform(r.v[k]), p, x[i + k], keep_scale);
    }
  }
}

// dropout and dropout_grad: the same computation (the mask recomputed, never stored).
template <class T>
Launch dropout_as(const StepArgs& a) {
  const double p = a.step.attrs.f("p");
  const bool training = a.step.attrs.i("training") != 0;
  const auto stream_id = static_cast<uint32_t>(a.step.attrs.i("stream"));
  const T* x = a.in[0].as<const T>();
  T* y = a.out[0].as<T>();
  const int64_t n = a.out[0].numel();
  if (!training || p == 0) {
    const size_t bytes = a.out[0].type.bytes();
    return [=](cudaStream_t stream) {
      if (x != y) SEAM_CUDA_CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, stream));
    };
  }
  const auto pf = static_cast<float>(p);
  const auto keep_scale = static_cast<float>(1.0 / (1.0 - p));
  constexpr uintptr_t kAlign = alignof(Four<T>);
  const bool vec = reinterpret_cast<uintptr_t>(x) % kAlign == 0 && reinterpret_cast<uintptr_t>(y) % kAlign == 0;
  const DeviceCounters* counters = a.ctx.counters;
  const unsigned blocks = blocks_for((n + 3) / 4, kThreads, static_cast<int>(grid_cap(a.ctx)));
  return [=](cudaStream_t stream) {
    dropout_kernel<T><<<blocks, kThreads, 0, stream>>>(x, y, n, pf, keep_scale, stream_id, counters, vec);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

Launch dropout(const StepArgs& a) {
  expect_dtype(a, a.out[0], kStored);
  if (a.in[0].dtype() != a.out[0].dtype())
    fail(op_name(a.step.op), " '", a.step.name, "': input ", a.in[0].type.str(), " and output ", a.out[0].type.str(),
         " differ in dtype");
  Launch l;
  dispatch_storage(a.out[0].dtype(), op_name(a.step.op), [&]<class T>() { l = dropout_as<T>(a); });
  return l;
}

// ---- embedding ---------------------------------------------------------------------
// Thread per (position, unit of the row): rows are copied as they are stored, in units U
// of 16 bytes when rows are 16-byte multiples and aligned, else one element. A bad id is
// reported once (unit 0) and its row written as 0.

template <class U>
__global__ void __launch_bounds__(kThreads)
    embedding_kernel(const int32_t* ids, const U* w, U* y, int64_t n, int64_t rows, int64_t units,
                     DeviceError* err, int step_index) {
  const int64_t total = n * units;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / units, c = e - i * units;
    const int64_t id = ids[i];
    if (id < 0 || id >= rows) {
      if (c == 0) report_error(err, step_index, kEmbeddingId, i, id, rows);
      y[e] = U{};
    } else {
      y[e] = w[id * units + c];
    }
  }
}

template <class U>
Launch embedding_launch(const StepArgs& a, int64_t units) {
  const int32_t* ids = a.in[0].as<const int32_t>();
  const int64_t rows = a.in[1].shape()[0], n = a.in[0].numel();
  const U* w = a.in[1].as<const U>();
  U* y = a.out[0].as<U>();
  DeviceError* err = a.ctx.error;
  const int index = a.index;
  const unsigned blocks = blocks_for(n * units, kThreads, static_cast<int>(grid_cap(a.ctx)));
  return [=](cudaStream_t stream) {
    embedding_kernel<U><<<blocks, kThreads, 0, stream>>>(ids, w, y, n, rows, units, err, index);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// The output has the weight's dtype.
Launch embedding(const StepArgs& a) {
  expect_dtype(a, a.in[0], {DType::i32});
  expect_dtype(a, a.in[1], kStored);
  if (a.out[0].dtype() != a.in[1].dtype())
    fail("embedding '", a.step.name, "': output ", a.out[0].type.str(), " and weight ", a.in[1].type.str(),
         " differ in dtype");
  const int64_t dim = a.in[1].shape()[1];
  const size_t es = dtype_size(a.in[1].dtype());
  const auto row_bytes = static_cast<size_t>(dim) * es;
  if (row_bytes % 16 == 0 && aligned16(a.in[1].data) && aligned16(a.out[0].data))
    return embedding_launch<float4>(a, static_cast<int64_t>(row_bytes / 16));
  if (es == 2) return embedding_launch<uint16_t>(a, dim);
  return embedding_launch<float>(a, dim);
}

// dweight zeroed (or acc, a tied weight's other gradient), then dweight[ids[i], :] +=
// dy[i, :] with atomics (the order of adds to a repeated id's row varies from run to run,
// within float rounding). The sums are f32: an f32 dweight takes them where it is (acc
// copied in first unless it is dweight's own buffer); a 16-bit one goes through an f32
// buffer in the workspace, rounded into dweight once all are in, rather than rounding
// every add of a repeated id.
// V = 4 (dim % 4 == 0, dy and the sums 16-byte aligned at every row): a thread adds four
// consecutive values with one of sm_90's vector atomics (red.global.add.v4.f32, rounded
// as the scalar add): a quarter of the atomics, 45-46 us against 48-49 at W6 on an H100.
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    embedding_grad_kernel(const T* dy, const int32_t* ids, float* dw, int64_t n, int64_t rows, int64_t dim,
                          DeviceError* err, int step_index) {
  const int64_t per_row = dim / V, total = n * per_row;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / per_row, c = (e - i * per_row) * V;
    const int64_t id = ids[i];
    if (id < 0 || id >= rows) {
      if (c == 0) report_error(err, step_index, kEmbeddingId, i, id, rows);
    } else if constexpr (V == 4) {
      struct alignas(4 * sizeof(T)) Four { T v[4]; };
      const Four x = *reinterpret_cast<const Four*>(dy + i * dim + c);
      atomicAdd(reinterpret_cast<float4*>(dw + id * dim + c),
                float4{to_float(x.v[0]), to_float(x.v[1]), to_float(x.v[2]), to_float(x.v[3])});
    } else {
      atomicAdd(dw + id * dim + c, to_float(dy[i * dim + c]));
    }
  }
}

// The atomic adds of dy's rows into the f32 sums, four values at a time where the rows allow.
template <class T>
void launch_embedding_grad(const T* dy, const int32_t* ids, float* sums, int64_t n, int64_t rows, int64_t dim,
                           DeviceError* err, int index, int cap, cudaStream_t stream) {
  if (n == 0) return;
  const bool four = dim % 4 == 0 && reinterpret_cast<uintptr_t>(dy) % (4 * sizeof(T)) == 0 && aligned16(sums);
  if (four)
    embedding_grad_kernel<T, 4><<<blocks_for(n * dim / 4, kThreads, cap), kThreads, 0, stream>>>(dy, ids, sums, n, rows,
                                                                                                 dim, err, index);
  else
    embedding_grad_kernel<T, 1><<<blocks_for(n * dim, kThreads, cap), kThreads, 0, stream>>>(dy, ids, sums, n, rows,
                                                                                             dim, err, index);
  SEAM_CUDA_LAUNCH_CHECK();
}

template <class T, class TO>
Launch embedding_grad_as(const StepArgs& a) {
  const T* dy = a.in[0].as<const T>();
  const int32_t* ids = a.in[1].as<const int32_t>();
  const TO* acc = a.in.size() > 2 ? a.in[2].as<const TO>() : nullptr;
  TO* dw = a.out[0].as<TO>();
  const int64_t rows = a.out[0].shape()[0], dim = a.out[0].shape()[1], n = a.in[1].numel(), total = rows * dim;
  if (total == 0) return [](cudaStream_t) {};
  DeviceError* err = a.ctx.error;
  const int index = a.index;
  const int cap = static_cast<int>(grid_cap(a.ctx));
  const auto sum_bytes = static_cast<size_t>(total) * sizeof(float);
  if constexpr (std::is_same_v<TO, float>) {
    return [=](cudaStream_t stream) {
      if (!acc) SEAM_CUDA_CHECK(cudaMemsetAsync(dw, 0, sum_bytes, stream));
      else if (acc != dw) SEAM_CUDA_CHECK(cudaMemcpyAsync(dw, acc, sum_bytes, cudaMemcpyDeviceToDevice, stream));
      launch_embedding_grad(dy, ids, dw, n, rows, dim, err, index, cap, stream);
    };
  } else {
    a.ctx.need_workspace(sum_bytes);
    const Context* ctx = &a.ctx;
    const unsigned cast_blocks = blocks_for(total, kThreads, cap);
    return [=](cudaStream_t stream) {
      auto* sums = static_cast<float*>(ctx->workspace());  // the lane's, read when the step runs
      if (acc) {
        cast_stored<TO, float><<<cast_blocks, kThreads, 0, stream>>>(acc, sums, total,
                                                                     aligned16(acc) && aligned16(sums) ? total / 8 : 0);
        SEAM_CUDA_LAUNCH_CHECK();
      } else {
        SEAM_CUDA_CHECK(cudaMemsetAsync(sums, 0, sum_bytes, stream));
      }
      launch_embedding_grad(dy, ids, sums, n, rows, dim, err, index, cap, stream);
      const int64_t nvec = aligned16(sums) && aligned16(dw) ? total / 8 : 0;
      cast_stored<float, TO><<<cast_blocks, kThreads, 0, stream>>>(sums, dw, total, nvec);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  }
}

// The deterministic embedding gradient (ModelOptions::deterministic): the positions sorted
// by id (a stable radix sort, so each id's positions stay in order), each id's segment of
// the sorted list found, then every dweight element the sum over its row's segment in that
// order, in f32, added to acc (where given) and stored once. Rows no id names get zeros
// (or acc); nothing is added atomically.
__global__ void iota_kernel(int32_t* v, int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    v[i] = static_cast<int32_t>(i);
}

__global__ void segment_kernel(const int32_t* keys, const int32_t* pos, int64_t n, int64_t rows, int32_t* begin,
                               int32_t* end, DeviceError* err, int step_index) {
  for (int64_t j = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < n; j += int64_t{gridDim.x} * blockDim.x) {
    const int32_t k = keys[j];
    if (k < 0 || k >= rows) {
      report_error(err, step_index, kEmbeddingId, pos[j], k, rows);
      continue;
    }
    if (j == 0 || keys[j - 1] != k) begin[k] = static_cast<int32_t>(j);
    if (j == n - 1 || keys[j + 1] != k) end[k] = static_cast<int32_t>(j + 1);
  }
}

template <class T, class TO>
__global__ void __launch_bounds__(kThreads)
    segment_sum_kernel(const T* dy, const int32_t* pos, const int32_t* begin, const int32_t* end, const TO* acc,
                       TO* dw, int64_t rows, int64_t dim) {
  const int64_t total = rows * dim;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / dim, c = e - r * dim;
    float sum = 0.0f;
    for (int32_t t = begin[r]; t < end[r]; ++t) sum += to_float(dy[int64_t{pos[t]} * dim + c]);
    dw[e] = from_float<TO>(acc ? to_float(acc[e]) + sum : sum);
  }
}

template <class T, class TO>
Launch embedding_grad_sorted(const StepArgs& a) {
  const T* dy = a.in[0].as<const T>();
  const int32_t* ids = a.in[1].as<const int32_t>();
  const TO* acc = a.in.size() > 2 ? a.in[2].as<const TO>() : nullptr;
  TO* dw = a.out[0].as<TO>();
  const int64_t rows = a.out[0].shape()[0], dim = a.out[0].shape()[1], n = a.in[1].numel();
  if (n > std::numeric_limits<int32_t>::max() || rows > std::numeric_limits<int32_t>::max())
    fail("embedding_grad '", a.step.name, "': ", n, " ids into ", rows, " rows exceed the sort's 32-bit positions");
  size_t sort_bytes = 0;
  SEAM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
                                                  static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                  static_cast<int32_t*>(nullptr), static_cast<int>(n)));
  auto round_up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t ints = round_up(static_cast<size_t>(n) * 4), segs = round_up(static_cast<size_t>(rows) * 4);
  a.ctx.need_workspace(3 * ints + 2 * segs + round_up(sort_bytes));
  const Context* ctx = &a.ctx;
  DeviceError* err = a.ctx.error;
  const int index = a.index;
  const unsigned id_blocks = blocks_for(n, kThreads, static_cast<int>(grid_cap(a.ctx)));
  const unsigned row_blocks = blocks_for(rows * dim, kThreads, static_cast<int>(grid_cap(a.ctx)));
  return [=](cudaStream_t stream) {
    auto* base = static_cast<std::byte*>(ctx->workspace());  // the lane's, read when the step runs
    auto* order = reinterpret_cast<int32_t*>(base);
    auto* keys = reinterpret_cast<int32_t*>(base + ints);
    auto* pos = reinterpret_cast<int32_t*>(base + 2 * ints);
    auto* begin = reinterpret_cast<int32_t*>(base + 3 * ints);
    auto* end = reinterpret_cast<int32_t*>(base + 3 * ints + segs);
    void* temp = base + 3 * ints + 2 * segs;
    size_t temp_bytes = sort_bytes;
    iota_kernel<<<id_blocks, kThreads, 0, stream>>>(order, n);
    SEAM_CUDA_LAUNCH_CHECK();
    SEAM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, keys, order, pos, static_cast<int>(n), 0,
                                                    32, stream));
    SEAM_CUDA_CHECK(cudaMemsetAsync(begin, 0, 2 * segs, stream));
    segment_kernel<<<id_blocks, kThreads, 0, stream>>>(keys, pos, n, rows, begin, end, err, index);
    SEAM_CUDA_LAUNCH_CHECK();
    segment_sum_kernel<T, TO><<<row_blocks, kThreads, 0, stream>>>(dy, pos, begin, end, acc, dw, rows, dim);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// dweight has dy's dtype, or acc's: dy's or f32 (a 16-bit dy's rows summed in f32 into
// the f32 gradient of a tied weight).
Launch embedding_grad(const StepArgs& a) {
  expect_dtype(a, a.in[0], kStored);
  expect_dtype(a, a.in[1], {DType::i32});
  const DType dy = a.in[0].dtype(), to = a.out[0].dtype();
  const bool acc = a.in.size() > 2;
  if (acc ? a.in[2].dtype() != to || (to != dy && to != DType::f32) : to != dy)
    fail("embedding_grad '", a.step.name, "': dweight ", a.out[0].type.str(), " with dy ", a.in[0].type.str(),
         acc ? " and acc " + a.in[2].type.str() : std::string(), ": dweight takes dy's dtype",
         acc ? " or f32, and acc dweight's" : "");
  Launch l;
  dispatch_storage(dy, "embedding_grad", [&]<class T>() {
    if (to == dtype_of<T>())
      l = a.ctx.deterministic ? embedding_grad_sorted<T, T>(a) : embedding_grad_as<T, T>(a);
    else if constexpr (!std::is_same_v<T, float>)
      l = a.ctx.deterministic ? embedding_grad_sorted<T, float>(a) : embedding_grad_as<T, float>(a);
  });
  return l;
}

// count_equal: one block counts the positions where a == b and b >= 0.
__global__ void count_equal_kernel(const int32_t* __restrict__ a, const int32_t* __restrict__ b, int64_t n,
                                   int32_t* __restrict__ out) {
  int c = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) c += b[i] >= 0 && a[i] == b[i];
  c = block_sum(c);
  if (threadIdx.x == 0) *out = c;
}

Launch count_equal(const StepArgs& a) {
  const int32_t* x = a.in[0].as<int32_t>();
  const int32_t* y = a.in[1].as<int32_t>();
  int32_t* out = a.out[0].as<int32_t>();
  const int64_t n = a.in[0].numel();
  return [=](cudaStream_t stream) {
    count_equal_kernel<<<1, 1024, 0, stream>>>(x, y, n, out);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// accumulate: acc[i] += xs[i] into an f32 state, a handful of scalars of any number
// type (a loss may be f32 or 16-bit, a count i32), read as the CPU reads them.
constexpr int kMaxAccumulate = 8;
struct AccInputs {
  const void* p[kMaxAccumulate];
  DType dtype[kMaxAccumulate];
  int n;
};

__global__ void accumulate_kernel(float* acc, AccInputs in) {
  for (int i = 0; i < in.n; ++i) {
    const double v = load(in.p[i], in.dtype[i], 0);
    if (isfinite(v)) acc[i] += static_cast<float>(v);  // as the CPU: a skipped step's NaN is left out
  }
}

Launch accumulate(const StepArgs& a) {
  if (a.step.attrs.i("training") == 0) return [](cudaStream_t) {};
  if (a.in.size() - 1 > kMaxAccumulate) fail("accumulate '", a.step.name, "': at most ", kMaxAccumulate, " values");
  AccInputs in{};
  in.n = static_cast<int>(a.in.size() - 1);
  for (int i = 0; i < in.n; ++i) {
    const DeviceTensor& t = a.in[static_cast<size_t>(i) + 1];
    in.p[i] = t.data;
    in.dtype[i] = t.dtype();
  }
  expect_dtype(a, a.in[0], {DType::f32});
  float* acc = a.in[0].as<float>();
  return [=](cudaStream_t stream) {
    accumulate_kernel<<<1, 1, 0, stream>>>(acc, in);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

}  // namespace

void register_misc(PreparerTable& t) {
  set(t, Op::full, full);
  set(t, Op::loss_scale, loss_scale);
  set(t, Op::cast, cast);
  set(t, Op::copy, copy);
  set(t, Op::argmax, argmax);
  set(t, Op::count_equal, count_equal);
  set(t, Op::accumulate, accumulate);
  set(t, Op::dropout, dropout);
  set(t, Op::dropout_grad, dropout);
  set(t, Op::embedding, embedding);
  set(t, Op::embedding_grad, embedding_grad);
}

}  // namespace seam::cuda
