// CUDA kernels of layer_norm (over the last dim D; its gradient: norm_grad.cu). Same
// formulas as the CPU reference (src/backend/cpu/norm.cpp): biased variance from a
// second, centred pass; outputs y, mean [rows], rstd [rows].
//
//   D <= 1024: one warp per row, the row in registers (N values per lane: ceil(D/32)
//              rounded up to 1, 2, 4, 8, 12, 16, 24 or 32), in 16-byte packs where
//              the row allows (with_packs);
//   D >  1024: one block per row, passes over the row through L1.
//
// x, y, dy and dx are stored as T (f32, bf16 or f16), gamma, beta, dgamma and dbeta as P
// (f32, or T), mean and rstd as f32; everything computes in float (the column sums in
// double, past each warp's float sum of its few rows in the dx kernel), one template for
// every storage type.
#include <cmath>

#include "backend/cuda/norm.cuh"

namespace seam::cuda {

namespace {

using namespace ln;

// ---- forward ----

template <int N, int V, class T, class P>
__global__ void __launch_bounds__(kWarpBlock)
    ln_warp(const T* __restrict__ x, const P* __restrict__ gamma, const P* __restrict__ beta, T* __restrict__ y,
            float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows, int dim, double eps) {
  static_assert(N % V == 0);
  constexpr int kPacks = N / V;
  const int lane = threadIdx.x & 31;
  const int64_t stride = int64_t{gridDim.x} * (blockDim.x >> 5);
  RawPack<V, T> next[kPacks];  // the warp's next row, loaded while this one is computed
  auto fetch = [&](int64_t r) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = (lane + 32 * p) * V;
      if (j < dim) next[p].load(x + r * dim + j);
    }
  };
  int64_t r = blockIdx.x * int64_t{blockDim.x >> 5} + (threadIdx.x >> 5);
  if (r < rows) fetch(r);
  for (; r < rows; r += stride) {
    float v[kPacks][V];
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = (lane + 32 * p) * V;
      if (j < dim) next[p].to(v[p]);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        if (j >= dim) v[p][i] = 0.f;
        s += v[p][i];
      }
    }
    if (r + stride < rows) fetch(r + stride);
    const float mean = warp_sum(s) / static_cast<float>(dim);
    float sq = 0.f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = (lane + 32 * p) * V;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        v[p][i] = j < dim ? v[p][i] - mean : 0.f;
        sq += v[p][i] * v[p][i];
      }
    }
    const float var = warp_sum(sq) / static_cast<float>(dim);
    const float rstd = static_cast<float>(1.0 / sqrt(static_cast<double>(var) + eps));
    T* yr = y + r * dim;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = (lane + 32 * p) * V;
      if (j >= dim) continue;
      float g[V], b[V];
      load_pack<V>(gamma + j, g);
      load_pack<V>(beta + j, b);
#pragma unroll
      for (int i = 0; i < V; ++i) v[p][i] = fmaf(v[p][i] * rstd, g[i], b[i]);
      store_pack<V>(yr + j, v[p]);
    }
    if (lane == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// One block per row; the row loop is block-uniform, so every thread meets the barriers
// inside block_sum.
template <class T, class P>
__global__ void __launch_bounds__(kRowBlock)
    ln_block(const T* __restrict__ x, const P* __restrict__ gamma, const P* __restrict__ beta, T* __restrict__ y,
             float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows, int64_t dim, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * dim;
    float s = 0.f;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) s += to_float(xr[j]);
    const float mean = block_sum(s) / static_cast<float>(dim);
    float sq = 0.f;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const float d = to_float(xr[j]) - mean;
      sq += d * d;
    }
    const float var = block_sum(sq) / static_cast<float>(dim);
    const float rstd = static_cast<float>(1.0 / sqrt(static_cast<double>(var) + eps));
    T* yr = y + r * dim;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      yr[j] = from_float<T>(fmaf((to_float(xr[j]) - mean) * rstd, to_float(gamma[j]), to_float(beta[j])));
    if (threadIdx.x == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// ---- preparers ----

template <class T, class P>
void launch_ln_warp(cudaStream_t st, unsigned blocks, int n, bool vec, const T* x, const P* gamma, const P* beta, T* y,
                    float* mean, float* rstd, int64_t rows, int dim, double eps) {
  with_packs<T>(n, vec, [&](auto nv, auto vv) {
    ln_warp<decltype(nv)::value, decltype(vv)::value>
        <<<blocks, kWarpBlock, 0, st>>>(x, gamma, beta, y, mean, rstd, rows, dim, eps);
  });
  SEAM_CUDA_LAUNCH_CHECK();
}

// Blocks of ln_warp resident on an SM, for n values a lane.
template <class T, class P>
int ln_warp_resident(int n, bool vec) {
  int resident = 0;
  with_packs<T>(n, vec, [&](auto nv, auto vv) {
    SEAM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &resident, ln_warp<decltype(nv)::value, decltype(vv)::value, T, P>, kWarpBlock, 0));
  });
  return std::max(resident, 1);
}

Launch prepare_layer_norm(const StepArgs& a) {
  expect_ln_dtypes(a, {&a.in[0], &a.out[0]}, {&a.in[1], &a.in[2]}, {&a.out[1], &a.out[2]});
  const int64_t dim = a.in[0].shape().back();
  const int64_t rows = a.out[1].numel();
  const double eps = a.step.attrs.f("eps");
  float* mean = a.out[1].as<float>();
  float* rstd = a.out[2].as<float>();
  const int sms = std::max(a.ctx.sm_count, 1);
  if (rows == 0 || dim == 0) return [](cudaStream_t) {};  // no row, or rows of nothing (the CPU's 0/0)
  Launch launch;
  dispatch_ln(a, a.in[0].dtype(), a.in[1].dtype(), [&]<class T, class P>() {
    const T* x = a.in[0].as<T>();
    const P* gamma = a.in[1].as<P>();
    const P* beta = a.in[2].as<P>();
    T* y = a.out[0].as<T>();
    if (dim <= kMaxWarpDim) {
      const int d = static_cast<int>(dim);
      const int n = lane_groups(dim);
      const bool vec = dim % kVec<T> == 0 && aligned16(x) && aligned16(y) && aligned16(gamma) && aligned16(beta);
      // One wave of resident blocks, each warp over several rows: its next row loads
      // while this one is computed, where a second wave would start with a wait.
      const unsigned blocks = blocks_for(rows, kWarps, sms * ln_warp_resident<T, P>(n, vec));
      launch = [=](cudaStream_t st) {
        launch_ln_warp(st, blocks, n, vec, x, gamma, beta, y, mean, rstd, rows, d, eps);
      };
      return;
    }
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{sms} * 4));
    launch = [=](cudaStream_t st) {
      ln_block<<<blocks, kRowBlock, 0, st>>>(x, gamma, beta, y, mean, rstd, rows, dim, eps);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

}  // namespace

void register_norm(PreparerTable& t) {
  set(t, Op::layer_norm, prepare_layer_norm);
  set(t, Op::layer_norm_grad, ln::prepare_layer_norm_grad);
}

}  // namespace seam::cuda
