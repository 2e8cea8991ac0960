// CUDA kernels of softmax and log_softmax along any axis, and their gradients (which read
// only the forward output). Same formulas as the CPU reference (src/backend/cpu/softmax.cpp).
//
// The tensor is seen as [outer, len, inner]; a lane is the `len` elements of one (outer,
// inner) pair. Three strategies:
//   inner == 1, len <= 1024: one warp per row, the row held in registers (N per lane);
//   inner == 1, len >  1024: one block per row, passes over the row through L1;
//   inner >  1:              one thread per lane, looping over len with stride inner.
// Forward passes subtract the lane's max before exp, so large logits do not overflow.
// Every operand is stored as T (f32, bf16 or f16); values are loaded into float, the
// math is that of f32, and each result is rounded to T once, when stored.
#include <cmath>

#include "backend/cuda/check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/storage.cuh"

namespace seam::cuda {

namespace {

enum class Kind { softmax, log_softmax, softmax_grad, log_softmax_grad };

constexpr bool is_forward(Kind k) { return k == Kind::softmax || k == Kind::log_softmax; }

constexpr int kWarpBlock = 256;   // warp path: 8 rows in flight per block
constexpr int kRowBlock = 512;    // block path: one row per block
constexpr int kLaneBlock = 256;   // strided path
constexpr int kMaxWarpLen = 1024; // longest row the warp path holds in registers (32 per lane)

// Precision: log_softmax_grad computes exp(y) * sum(dy), which for long rows nearly cancels
// against dy, so an error of one f32 ulp in y (1e-6 at |y| ~ 10) shows in dx. So the
// log_softmax output is made as exact as the CPU's: sum(exp(x - m)) in double with a
// double exp, and (x - m) - log(s) formed in double (x - m is exact there) and rounded
// once. The gradients' sums accumulate in double and dx is formed in double.

// One warp per row of `len` contiguous elements; lane l holds elements l, l + 32, ...
// Forward: a = x. Backward: a = dy, b = y. Every branch below is warp-uniform (the row
// index depends only on the warp), so the full-mask shuffles are safe.
template <Kind K, int N, class T>
__global__ void __launch_bounds__(kWarpBlock)
    warp_rows(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t rows, int len) {
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = blockDim.x >> 5;
  const int64_t stride = int64_t{gridDim.x} * warps_per_block;
  for (int64_t r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < rows; r += stride) {
    const T* ar = a + r * len;
    T* orow = out + r * len;
    float va[N];
    if constexpr (is_forward(K)) {
      float m = -INFINITY;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const int j = lane + 32 * k;
        va[k] = j < len ? to_float(ar[j]) : -INFINITY;
        m = fmaxf(m, va[k]);
      }
      m = warp_max(m);
      if constexpr (K == Kind::softmax) {
        float s = 0.f;  // va becomes exp(x - m)
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const int j = lane + 32 * k;
          va[k] = j < len ? expf(va[k] - m) : 0.f;
          s += va[k];
        }
        s = warp_sum(s);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const int j = lane + 32 * k;
          if (j < len) orow[j] = from_float<T>(va[k] / s);
        }
      } else {
        double s = 0;  // va stays x
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const int j = lane + 32 * k;
          if (j < len) s += exp(static_cast<double>(va[k]) - m);
        }
        const double ls = log(warp_sum(s));
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const int j = lane + 32 * k;
          if (j < len) orow[j] = from_float<T>(static_cast<float>((static_cast<double>(va[k]) - m) - ls));
        }
      }
    } else {
      const T* br = b + r * len;
      float vb[N];
      double acc = 0;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const int j = lane + 32 * k;
        va[k] = j < len ? to_float(ar[j]) : 0.f;
        vb[k] = j < len ? to_float(br[j]) : 0.f;
        if constexpr (K == Kind::softmax_grad) acc += static_cast<double>(va[k]) * vb[k];  // sum(dy * y)
        else acc += va[k];                                                                // sum(dy)
      }
      acc = warp_sum(acc);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const int j = lane + 32 * k;
        if (j < len) {
          if constexpr (K == Kind::softmax_grad) orow[j] = from_float<T>(static_cast<float>(vb[k] * (va[k] - acc)));
          else orow[j] = from_float<T>(static_cast<float>(va[k] - expf(vb[k]) * acc));
        }
      }
    }
  }
}

// One block per row (grid-stride over rows; the loop is block-uniform, so the block
// reductions' barriers are reached by every thread).
template <Kind K, class T>
__global__ void __launch_bounds__(kRowBlock)
    block_rows(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t rows, int64_t len) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* ar = a + r * len;
    T* orow = out + r * len;
    if constexpr (is_forward(K)) {
      float m = -INFINITY;
#pragma unroll 4
      for (int64_t j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, to_float(ar[j]));
      m = block_max(m);
      if constexpr (K == Kind::softmax) {
        float s = 0.f;
#pragma unroll 4
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x) s += expf(to_float(ar[j]) - m);
        s = block_sum(s);
#pragma unroll 4
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x) orow[j] = from_float<T>(expf(to_float(ar[j]) - m) / s);
      } else {
        double s = 0;
#pragma unroll 4
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x) s += exp(static_cast<double>(to_float(ar[j])) - m);
        const double ls = log(block_sum(s));
#pragma unroll 4
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
          orow[j] = from_float<T>(static_cast<float>((static_cast<double>(to_float(ar[j])) - m) - ls));
      }
    } else {
      const T* br = b + r * len;
      double acc = 0;
#pragma unroll 4
      for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
        if constexpr (K == Kind::softmax_grad) acc += static_cast<double>(to_float(ar[j])) * to_float(br[j]);
        else acc += to_float(ar[j]);
      }
      acc = block_sum(acc);
#pragma unroll 4
      for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
        const float dy = to_float(ar[j]), y = to_float(br[j]);
        if constexpr (K == Kind::softmax_grad) orow[j] = from_float<T>(static_cast<float>(y * (dy - acc)));
        else orow[j] = from_float<T>(static_cast<float>(dy - expf(y) * acc));
      }
    }
  }
}

// One thread per (outer, inner) pair; element j of the lane is at base + j * inner, so
// neighbouring threads read neighbouring addresses. Sums run sequentially over len, in
// double so that long lanes keep f32 accuracy.
template <Kind K, class T>
__global__ void __launch_bounds__(kLaneBlock)
    strided_lanes(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t outer, int64_t len,
                  int64_t inner) {
  const int64_t pairs = outer * inner;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < pairs; p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = p / inner, i = p - o * inner;
    const int64_t base = o * len * inner + i;
    if constexpr (is_forward(K)) {
      float m = -INFINITY;
#pragma unroll 4
      for (int64_t j = 0; j < len; ++j) m = fmaxf(m, to_float(a[base + j * inner]));
      double s = 0;
      if constexpr (K == Kind::softmax) {
#pragma unroll 4
        for (int64_t j = 0; j < len; ++j) s += static_cast<double>(expf(to_float(a[base + j * inner]) - m));
        const float sf = static_cast<float>(s);
#pragma unroll 4
        for (int64_t j = 0; j < len; ++j)
          out[base + j * inner] = from_float<T>(expf(to_float(a[base + j * inner]) - m) / sf);
      } else {
#pragma unroll 4
        for (int64_t j = 0; j < len; ++j) s += exp(static_cast<double>(to_float(a[base + j * inner])) - m);
        const double ls = log(s);
#pragma unroll 4
        for (int64_t j = 0; j < len; ++j)
          out[base + j * inner] =
              from_float<T>(static_cast<float>((static_cast<double>(to_float(a[base + j * inner])) - m) - ls));
      }
    } else {
      double acc = 0;
#pragma unroll 4
      for (int64_t j = 0; j < len; ++j) {
        const int64_t k = base + j * inner;
        if constexpr (K == Kind::softmax_grad)
          acc += static_cast<double>(to_float(a[k])) * static_cast<double>(to_float(b[k]));
        else acc += static_cast<double>(to_float(a[k]));
      }
#pragma unroll 4
      for (int64_t j = 0; j < len; ++j) {
        const int64_t k = base + j * inner;
        const float dy = to_float(a[k]), y = to_float(b[k]);
        if constexpr (K == Kind::softmax_grad) out[k] = from_float<T>(static_cast<float>(y * (dy - acc)));
        else out[k] = from_float<T>(static_cast<float>(dy - expf(y) * acc));
      }
    }
  }
}

template <Kind K, int N, class T>
void launch_warp_rows(cudaStream_t s, unsigned blocks, const T* a, const T* b, T* out, int64_t rows, int len) {
  warp_rows<K, N, T><<<blocks, kWarpBlock, 0, s>>>(a, b, out, rows, len);
  SEAM_CUDA_LAUNCH_CHECK();
}

// The warp kernel with the fewest 32-element groups per lane (N) that covers len.
template <Kind K, class T>
void launch_warp(cudaStream_t s, unsigned blocks, const T* a, const T* b, T* out, int64_t rows, int len) {
  if (len <= 32) launch_warp_rows<K, 1>(s, blocks, a, b, out, rows, len);
  else if (len <= 64) launch_warp_rows<K, 2>(s, blocks, a, b, out, rows, len);
  else if (len <= 128) launch_warp_rows<K, 4>(s, blocks, a, b, out, rows, len);
  else if (len <= 256) launch_warp_rows<K, 8>(s, blocks, a, b, out, rows, len);
  else if (len <= 384) launch_warp_rows<K, 12>(s, blocks, a, b, out, rows, len);
  else if (len <= 512) launch_warp_rows<K, 16>(s, blocks, a, b, out, rows, len);
  else if (len <= 768) launch_warp_rows<K, 24>(s, blocks, a, b, out, rows, len);
  else launch_warp_rows<K, 32>(s, blocks, a, b, out, rows, len);
}

template <Kind K, class T>
Launch prepare_as(const StepArgs& a) {
  const Shape& s = a.in[0].shape();  // x, or dy (y has the same shape)
  const auto axis = static_cast<size_t>(normalize_axis(a.step.attrs.i("axis"), s.size()));
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= s[d];
  for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t len = s.empty() ? 1 : s[axis];
  const T* in0 = a.in[0].as<const T>();
  const T* in1 = is_forward(K) ? nullptr : a.in[1].as<const T>();
  T* out = a.out[0].as<T>();
  const int sms = std::max(a.ctx.sm_count, 1);
  if (a.in[0].numel() == 0) return [](cudaStream_t) {};
  if (inner == 1 && len <= kMaxWarpLen) {
    const int64_t rows = outer;
    const unsigned blocks = blocks_for(rows, kWarpBlock / 32, sms * 16);
    const int l = static_cast<int>(len);
    return [=](cudaStream_t st) { launch_warp<K, T>(st, blocks, in0, in1, out, rows, l); };
  }
  if (inner == 1) {
    const int64_t rows = outer;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{sms} * 4));
    return [=](cudaStream_t st) {
      block_rows<K, T><<<blocks, kRowBlock, 0, st>>>(in0, in1, out, rows, len);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  }
  const unsigned blocks = blocks_for(outer * inner, kLaneBlock, sms * 8);
  return [=](cudaStream_t st) {
    strided_lanes<K, T><<<blocks, kLaneBlock, 0, st>>>(in0, in1, out, outer, len, inner);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// One storage type for every operand.
template <Kind K>
Launch prepare(const StepArgs& a) {
  const DType t = expect_one_stored_dtype(a);
  Launch l;
  dispatch_storage(t, op_name(a.step.op), [&]<class T>() { l = prepare_as<K, T>(a); });
  return l;
}

}  // namespace

void register_softmax(PreparerTable& t) {
  set(t, Op::softmax, prepare<Kind::softmax>);
  set(t, Op::log_softmax, prepare<Kind::log_softmax>);
  set(t, Op::softmax_grad, prepare<Kind::softmax_grad>);
  set(t, Op::log_softmax_grad, prepare<Kind::log_softmax_grad>);
}

}  // namespace seam::cuda
