// CUDA kernels of layer_norm's gradient (its forward: norm.cu; what both use: norm.cuh).
// dx row by row, and the column sums dgamma = sum_rows dy * xhat, dbeta = sum_rows dy
// deterministically: each chunk of rows (D <= 1024: the rows of one block of the dx kernel
// where a lane holds at most kMaxColsN values, else a column kernel over a fixed chunk;
// D > 1024: the rows of one block) is added in a fixed order into its own slice of scratch
// ([chunks][2][D], double), then a last kernel sums the slices in chunk order. No atomics.
// With dx_sums (bias_grads_into_norm_grads) the column sums of dx as stored are a third:
// in the dx kernel's slices ([chunks][3][D]) where it sums, else a sum step over dx. With
// from_output (norm_grads_from_outputs) xhat comes from the output, (y - beta) / gamma.
#include <algorithm>
#include <cmath>

#include "backend/cuda/norm.cuh"

namespace seam::cuda::ln {

namespace {

// The column sums add one term per row. In f32 the rounding of each term (xhat, dy * xhat)
// alone, summed over thousands of rows, shows as an error of 1e-3 or more relative to a
// column whose sum nearly cancels. So the terms of dgamma are formed from
// (x - mean) * rstd (from the output: (y - beta) / gamma) in double and every column sum accumulates in double, as the CPU
// does; the row sums of dx stay in f32.

// Rows of up to 1024: dx by a warp per row, the row's dy * gamma and xhat held in
// registers between the row sums and the write. With dr (sum_into_norm_grads), dx = the
// layer norm's own input gradient + dr, added in float and stored once; dr is loaded with
// x and dy, so that a row waits on memory once.
// S > 0 (N <= kMaxColsN): S column sums come from the same read: dgamma (dy * xhat),
// dbeta (dy) and, with S = 3, dx as stored (dx_sums: a linear layer's bias gradient).
// Each warp adds its rows' terms in float into its own slice of shared memory, then the
// block adds its warps' slices in warp order, in double, into its slice of partial
// ([blocks][S][D]). A slice is [S][N / Q][32][Q] floats: lane l's values in chunks of Q
// neighbours (value c Q + e at [c][l][e]), Q = 4 with 16-byte packs (one 16-byte load and
// store a chunk, a warp's 512 bytes contiguous: no bank conflicts), else 1. A column is
// only ever touched by the lane that owns it: no barrier until the end. A sum's update
// costs 3 instructions a chunk instead of 3 a value: the row loop's 1106 -> 962 at D = 768
// (bf16, with dx's sums); W6's step on an H100 did not change with it (the kernel waits on
// memory latency there, 16 warps an SM), the H200 at its power cap counts instructions.
// Without column sums (wider rows) ln_grad_params reads dy and x a second time.
// S > 0 asks for two blocks an SM (16 rows in flight).
// From the output (beta given), xhat = (y - beta) / gamma. With 16-bit data each block
// first forms a column's 1 / gamma and beta / gamma into shared memory after the column
// sums' slices (reporting a zero gamma there, once a column), and a value's xhat is one
// FMA, y / gamma - beta / gamma: the per-value division, beta's loads and gamma's test
// made this path ~6 us a call slower than the input's at W6 (H100). The two forms differ
// by an f32 ulp or two, which 16-bit dx and its sums do not resolve; f32 data divides
// exactly, value by value (its tests resolve an ulp in a cancelling column sum).
constexpr int kMaxColsN = 24;
template <class T>
constexpr bool kGammaTable = sizeof(T) == 2;
template <int N, int V, int S, class T, class P>
__global__ void __launch_bounds__(kWarpBlock, S > 0 ? 2 : 1)
    ln_grad_dx(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
               const float* __restrict__ rstd, const P* __restrict__ gamma, const P* __restrict__ beta,
               const T* __restrict__ dr, T* __restrict__ dx, double* __restrict__ partial, int64_t rows, int dim,
               DeviceError* err, int step) {
  static_assert(N % V == 0);
  static_assert(S == 0 || (S >= 2 && S <= 3 && N <= kMaxColsN));
  constexpr int kPacks = N / V;
  constexpr int kQ = V > 1 ? 4 : 1;  // floats of a chunk
  constexpr int kChunks = N / kQ;    // a sum's chunks a lane
  extern __shared__ float4 col_words[];  // S > 0: [kWarps][S][kChunks][32][kQ] floats; the table
  float* cols = reinterpret_cast<float*>(col_words);
  float* inv_gamma = cols + (S > 0 ? kWarps * S * N * 32 : 0);  // from the output, 16-bit data: [dim]
  float* shift = inv_gamma + dim;                                // beta / gamma, [dim]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (kGammaTable<T> && beta) {
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
      const float gc = to_float(gamma[c]);
      if (gc == 0.f) report_error(err, step, kZeroGamma, c, 0, 0);
      inv_gamma[c] = 1.f / gc;
      shift[c] = to_float(beta[c]) / gc;
    }
    __syncthreads();
  }
  float* mine = cols + warp * (S * N * 32) + lane * kQ;  // sum k's chunk c at mine + (k kChunks + c) 32 kQ
  if constexpr (S > 0)  // each lane its own chunks: no lane reads what another wrote
    for (int c = 0; c < S * kChunks; ++c)
      for (int e = 0; e < kQ; ++e) mine[c * 32 * kQ + e] = 0.f;
  const int64_t stride = int64_t{gridDim.x} * kWarps;
  // x, dy, mean and rstd of the warp's next row are loaded while this row is computed
  // (a warp's rows were otherwise a wait on memory each), dr at the row's start: it is
  // used last.
  RawPack<V, T> next_x[kPacks], next_dy[kPacks];
  float next_m = 0.f, next_s = 0.f;
  auto fetch = [&](int64_t r) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = (lane + 32 * p) * V;
      if (j >= dim) continue;
      next_x[p].load(x + r * dim + j);
      next_dy[p].load(dy + r * dim + j);
    }
    next_m = beta ? 0.f : mean[r];
    next_s = rstd[r];
  };
  int64_t r = blockIdx.x * int64_t{kWarps} + warp;
  if (r < rows) fetch(r);
  for (; r < rows; r += stride) {
    const float m = next_m, s = next_s;
    float g[kPacks][V], xh[kPacks][V];
    RawPack<V, T> rd[kPacks];
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = (lane + 32 * p) * V;
      if (j >= dim) continue;
      next_x[p].to(xh[p]);
      next_dy[p].to(g[p]);
      if (dr) rd[p].load(dr + r * dim + j);
    }
    if (r + stride < rows) fetch(r + stride);
    float g_sum = 0.f, gx_sum = 0.f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = (lane + 32 * p) * V;
      if (j >= dim) continue;
      float gm[V];
      load_pack<V>(gamma + j, gm);
      if (!beta) {
#pragma unroll
        for (int i = 0; i < V; ++i) xh[p][i] = (xh[p][i] - m) * s;
      } else if constexpr (kGammaTable<T>) {  // x is the norm's output y (from_output)
        float ig[V], sh[V];
        if constexpr (V % 4 == 0) {  // 16-byte loads: j and dim are multiples of V
#pragma unroll
          for (int c = 0; c < V; c += 4) {
            const float4 a = *reinterpret_cast<const float4*>(inv_gamma + j + c);
            const float4 b = *reinterpret_cast<const float4*>(shift + j + c);
            ig[c] = a.x, ig[c + 1] = a.y, ig[c + 2] = a.z, ig[c + 3] = a.w;
            sh[c] = b.x, sh[c + 1] = b.y, sh[c + 2] = b.z, sh[c + 3] = b.w;
          }
        } else {
#pragma unroll
          for (int i = 0; i < V; ++i) ig[i] = inv_gamma[j + i], sh[i] = shift[j + i];
        }
#pragma unroll
        for (int i = 0; i < V; ++i) xh[p][i] = fmaf(xh[p][i], ig[i], -sh[i]);
      } else {  // f32 data: exactly, value by value
        float bt[V];
        load_pack<V>(beta + j, bt);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          if (gm[i] == 0.f) report_error(err, step, kZeroGamma, j + i, 0, 0);
          xh[p][i] = (xh[p][i] - bt[i]) / gm[i];
        }
      }
      if constexpr (S > 0) {
#pragma unroll
        for (int c = p * V / kQ; c < (p + 1) * V / kQ; ++c) {  // the pack's chunks
          update_floats<kQ>(mine + c * 32 * kQ, [&](int e, float& a) {
            const int i = (c * kQ + e) % V;
            a = fmaf(g[p][i], xh[p][i], a);
          });
          update_floats<kQ>(mine + (kChunks + c) * 32 * kQ, [&](int e, float& a) { a += g[p][(c * kQ + e) % V]; });
        }
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        g[p][i] *= gm[i];
        g_sum += g[p][i];
        gx_sum += g[p][i] * xh[p][i];
      }
    }
    const float g_mean = warp_sum(g_sum) / static_cast<float>(dim);
    const float gx_mean = warp_sum(gx_sum) / static_cast<float>(dim);
    T* dxr = dx + r * dim;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = (lane + 32 * p) * V;
      if (j >= dim) continue;
      float d[V];
      if (dr) {
        rd[p].to(d);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) d[i] = 0.f;
      }
#pragma unroll
      for (int i = 0; i < V; ++i) d[i] += s * (g[p][i] - g_mean - xh[p][i] * gx_mean);
      store_pack<V, T, S == 3>(dxr + j, d);  // S = 3: d then holds the values stored, which the sum adds
      if constexpr (S == 3) {
#pragma unroll
        for (int c = p * V / kQ; c < (p + 1) * V / kQ; ++c)
          update_floats<kQ>(mine + (2 * kChunks + c) * 32 * kQ, [&](int e, float& a) { a += d[(c * kQ + e) % V]; });
      }
    }
  }
  if constexpr (S > 0) {
    __syncthreads();
    double* out = partial + blockIdx.x * (S * int64_t{dim});
    for (int k = threadIdx.x; k < S * N * 32; k += blockDim.x) {
      // k: sum `sum_of`, chunk c, lane l, element k % kQ: the lane's value v, of pack v / V
      const int sum_of = k / (N * 32), c = k % (N * 32) / (32 * kQ), l = k / kQ % 32;
      const int v = c * kQ + k % kQ;
      const int j = (l + 32 * (v / V)) * V + v % V;
      if (j >= dim) continue;
      double sum = 0.0;
      for (int w = 0; w < kWarps; ++w) sum += cols[w * (S * N * 32) + k];  // in warp order: the same sums every run
      out[sum_of * dim + j] = sum;
    }
  }
}

// Shared memory of ln_grad_dx with s column sums, n values a lane.
size_t ln_grad_cols_bytes(int s, int n) { return static_cast<size_t>(kWarps) * s * n * 32 * sizeof(float); }

// The chunk blockIdx.y of rows (`chunk` rows each) for 32 * V columns, V neighbouring
// columns a thread (V > 1: 16-byte loads, where D is a multiple of V: 4 f32 values or 8
// 16-bit ones): thread row ty adds rows ty, ty + kColRows, ... in double, then thread
// row 0 adds the kColRows sums in order into partial[chunk][0][j] (dgamma) and
// partial[chunk][1][j] (dbeta).
constexpr int kColRows = 8;
template <int V, class T, class P>
__global__ void __launch_bounds__(32 * kColRows)
    ln_grad_params(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                   const float* __restrict__ rstd, const P* __restrict__ gamma, const P* __restrict__ beta,
                   double* __restrict__ partial, int64_t rows, int64_t dim, int64_t chunk) {
  static_assert(V == 1 || V == kVec<T>);
  using Vec = std::conditional_t<V == 1, T, std::conditional_t<std::is_same_v<T, float>, float4, Pack8<T>>>;
  __shared__ double sums[2][V][kColRows][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = (blockIdx.x * int64_t{32} + tx) * V;
  const int64_t r0 = blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  double acc_g[V] = {}, acc_b[V] = {};
  double shift[V] = {}, scale[V] = {};  // from_output: xhat = (y - beta) / gamma, the same for every row
  if (beta && j < dim)
    for (int v = 0; v < V; ++v) {
      shift[v] = to_float(beta[j + v]);
      scale[v] = 1.0 / static_cast<double>(to_float(gamma[j + v]));
    }
  if (j < dim) {
#pragma unroll 4
    for (int64_t r = r0 + ty; r < r1; r += kColRows) {
      const Vec dv = *reinterpret_cast<const Vec*>(dy + r * dim + j);
      const Vec xv = *reinterpret_cast<const Vec*>(x + r * dim + j);
      const double m = beta ? 0.0 : mean[r], s = beta ? 0.0 : rstd[r];
      const T* d = reinterpret_cast<const T*>(&dv);
      const T* xs = reinterpret_cast<const T*>(&xv);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const float dj = to_float(d[v]);
        const double xv = to_float(xs[v]);
        acc_g[v] += static_cast<double>(dj) * (beta ? (xv - shift[v]) * scale[v] : (xv - m) * s);
        acc_b[v] += dj;
      }
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v) {
    sums[0][v][ty][tx] = acc_g[v];
    sums[1][v][ty][tx] = acc_b[v];
  }
  __syncthreads();
  if (ty != 0 || j >= dim) return;
  double* p = partial + blockIdx.y * (2 * dim);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    double sg = 0, sb = 0;
    for (int k = 0; k < kColRows; ++k) {
      sg += sums[0][v][k][tx];
      sb += sums[1][v][k][tx];
    }
    p[j + v] = sg;
    p[dim + j + v] = sb;
  }
}

// One block per row (rows blockIdx.x + k * gridDim.x). Thread t owns columns t + i *
// blockDim.x and accumulates their dgamma/dbeta in registers when M > 0 (dim <= M *
// blockDim.x), else directly in its block's slice of partial (only it touches those
// addresses, so no synchronization is needed).
template <int M, class T, class P>
__global__ void __launch_bounds__(kRowBlock)
    ln_grad_block(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                  const float* __restrict__ rstd, const P* __restrict__ gamma, const P* __restrict__ beta,
                  const T* __restrict__ dr, T* __restrict__ dx, double* __restrict__ partial, int64_t rows,
                  int64_t dim, DeviceError* err, int step) {
  double* pg = partial + blockIdx.x * (2 * dim);
  double* pb = pg + dim;
  constexpr int kRegs = M > 0 ? M : 1;
  double acc_g[kRegs], acc_b[kRegs];
#pragma unroll
  for (int k = 0; k < kRegs; ++k) acc_g[k] = acc_b[k] = 0.0;
  if constexpr (M == 0)
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) pg[j] = pb[j] = 0.0;
  // xhat of column j's value v: from the input, or from the output (from_output).
  auto xhat = [&](double v, int64_t j, double m, double s) {
    if (!beta) return (v - m) * s;
    if (gamma[j] == P(0)) report_error(err, step, kZeroGamma, j, 0, 0);
    return (v - to_float(beta[j])) / to_float(gamma[j]);
  };
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float m = beta ? 0.f : mean[r], s = rstd[r];
    const T* dyr = dy + r * dim;
    const T* xr = x + r * dim;
    float g_sum = 0.f, gx_sum = 0.f;
    // Column j's terms: the row sums', and dgamma's and dbeta's into sg and sb.
    auto add_terms = [&](int64_t j, double& sg, double& sb) {
      const float d = to_float(dyr[j]);
      const double xd = xhat(to_float(xr[j]), j, m, s);
      const float g = d * to_float(gamma[j]);
      g_sum += g;
      gx_sum += g * static_cast<float>(xd);
      sg += static_cast<double>(d) * xd;
      sb += d;
    };
    if constexpr (M > 0) {
#pragma unroll
      for (int k = 0; k < M; ++k) {
        const int64_t j = threadIdx.x + int64_t{k} * blockDim.x;
        if (j < dim) add_terms(j, acc_g[k], acc_b[k]);
      }
    } else {
#pragma unroll 4
      for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) add_terms(j, pg[j], pb[j]);
    }
    const float g_mean = block_sum(g_sum) / static_cast<float>(dim);
    const float gx_mean = block_sum(gx_sum) / static_cast<float>(dim);
    T* dxr = dx + r * dim;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const auto xh = static_cast<float>(xhat(to_float(xr[j]), j, m, s));
      const float sum = dr ? to_float(dr[r * dim + j]) : 0.f;
      dxr[j] = from_float<T>(s * (to_float(dyr[j]) * to_float(gamma[j]) - g_mean - xh * gx_mean) + sum);
    }
  }
  if constexpr (M > 0) {
#pragma unroll
    for (int k = 0; k < M; ++k) {
      const int64_t j = threadIdx.x + int64_t{k} * blockDim.x;
      if (j < dim) {
        pg[j] = acc_g[k];
        pb[j] = acc_b[k];
      }
    }
  }
}

// Blocks of ln_grad_dx with S column sums resident on an SM, for n values a lane (their
// shared memory allowed first); 0 where the row is too wide for them.
template <class T, class P>
int ln_grad_cols_resident(int n, bool vec, int s, size_t table) {
  int resident = 0;
  with_packs<T>(n, vec, [&](auto nv, auto vv) {
    constexpr int kN = decltype(nv)::value, kV = decltype(vv)::value;
    if constexpr (kN <= kMaxColsN) {
      auto occupancy = [&](auto kernel) {
        const size_t bytes = ln_grad_cols_bytes(s, kN) + table;
        SEAM_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
        SEAM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kWarpBlock, bytes));
      };
      if (s == 3) occupancy(ln_grad_dx<kN, kV, 3, T, P>);
      else occupancy(ln_grad_dx<kN, kV, 2, T, P>);
    }
  });
  return resident;
}

// Shared memory of ln_grad_dx's table of 1 / gamma and beta / gamma (from the output,
// 16-bit data), beside its column sums.
template <class T>
size_t ln_grad_table_bytes(bool from_output, int64_t dim) {
  return kGammaTable<T> && from_output ? 2 * static_cast<size_t>(dim) * sizeof(float) : 0;
}

// sums: the column sums ln_grad_dx adds into partial (2, 3 with dx's), or 0.
template <class T, class P>
void launch_ln_grad_dx(cudaStream_t st, unsigned blocks, int n, bool vec, const T* dy, const T* x, const float* mean,
                       const float* rstd, const P* gamma, const P* beta, const T* dr, T* dx, double* partial, int sums,
                       int64_t rows, int dim, DeviceError* err, int step) {
  const size_t table = ln_grad_table_bytes<T>(beta != nullptr, dim);
  with_packs<T>(n, vec, [&](auto nv, auto vv) {
    constexpr int kN = decltype(nv)::value, kV = decltype(vv)::value;
    if constexpr (kN <= kMaxColsN) {
      if (sums > 0) {
        const size_t bytes = ln_grad_cols_bytes(sums, kN) + table;
        if (sums == 3)
          ln_grad_dx<kN, kV, 3>
              <<<blocks, kWarpBlock, bytes, st>>>(dy, x, mean, rstd, gamma, beta, dr, dx, partial, rows, dim, err,
                                                  step);
        else
          ln_grad_dx<kN, kV, 2>
              <<<blocks, kWarpBlock, bytes, st>>>(dy, x, mean, rstd, gamma, beta, dr, dx, partial, rows, dim, err,
                                                  step);
        return;
      }
    }
    ln_grad_dx<kN, kV, 0>
        <<<blocks, kWarpBlock, table, st>>>(dy, x, mean, rstd, gamma, beta, dr, dx, nullptr, rows, dim, err, step);
  });
  SEAM_CUDA_LAUNCH_CHECK();
}

template <int M, class T, class P>
void launch_ln_grad_block(cudaStream_t st, unsigned blocks, const T* dy, const T* x, const float* mean,
                          const float* rstd, const P* gamma, const P* beta, const T* dr, T* dx, double* partial,
                          int64_t rows, int64_t dim, DeviceError* err, int step) {
  ln_grad_block<M><<<blocks, kRowBlock, 0, st>>>(dy, x, mean, rstd, gamma, beta, dr, dx, partial, rows, dim, err, step);
  SEAM_CUDA_LAUNCH_CHECK();
}

}  // namespace

// from_output: in[1] is the norm's output y and in[2] its beta (xhat = (y - beta) / gamma).
Launch prepare_layer_norm_grad(const StepArgs& a) {
  const bool from_y = a.step.attrs.i("from_output") == 1;
  if (from_y)
    expect_ln_dtypes(a, {&a.in[1], &a.in[0], &a.out[0]}, {&a.in[4], &a.in[2], &a.out[1], &a.out[2]}, {&a.in[3]});
  else expect_ln_dtypes(a, {&a.in[1], &a.in[0], &a.out[0]}, {&a.in[4], &a.out[1], &a.out[2]}, {&a.in[2], &a.in[3]});
  if (a.in.size() == 6) expect_dtype(a, a.in[5], {a.in[1].dtype()});
  const bool dx_sums = a.out.size() == 4;  // also dx's column sums (bias_grads_into_norm_grads)
  if (dx_sums) expect_dtype(a, a.out[3], {a.in[4].dtype()});
  const int64_t dim = a.in[1].shape().back();
  const int64_t rows = a.in[3].numel();
  const float* mean = from_y ? nullptr : a.in[2].as<float>();
  const float* rstd = a.in[3].as<float>();
  const int sms = std::max(a.ctx.sm_count, 1);
  if (dim == 0) return [](cudaStream_t) {};
  Launch launch;
  dispatch_ln(a, a.in[1].dtype(), a.in[4].dtype(), [&]<class T, class P>() {
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    const P* gamma = a.in[4].as<P>();
    const P* beta = from_y ? a.in[2].as<P>() : nullptr;
    DeviceError* err = a.ctx.error;
    const int step = a.index;
    const T* dr = a.in.size() == 6 ? a.in[5].as<T>() : nullptr;
    T* dx = a.out[0].as<T>();
    // Blocks (and so partial slices) fixed here: the summation order is the same every
    // run. With no rows the kernels still run: they write zero partials, so dgamma =
    // dbeta = 0.
    const bool warp_path = dim <= kMaxWarpDim;
    // Warp path: chunks of rows until about eight column blocks an SM, each chunk at
    // least 32 * V rows (4 * V a thread: shorter chunks' partials cost more than their
    // extra blocks gain). Block path: a slice per block, blocks as rows up to 2 an SM.
    // Column sums in the dx kernel (ln_grad_dx's S): one slice a block, as many blocks
    // as stay resident; elsewhere dx's sums are a sum step's over the dx written.
    constexpr int kV = kVec<T>;
    const int vec = dim % kV == 0 && aligned16(dy) && aligned16(x) ? kV : 1;
    const bool vec_dx =
        vec > 1 && aligned16(gamma) && aligned16(dx) && (!dr || aligned16(dr)) && (!beta || aligned16(beta));
    const int n = warp_path ? lane_groups(dim) : 0;
    const int cols_resident =
        warp_path ? ln_grad_cols_resident<T, P>(n, vec_dx, dx_sums ? 3 : 2, ln_grad_table_bytes<T>(from_y, dim)) : 0;
    const int in_kernel = cols_resident > 0 ? (dx_sums ? 3 : 2) : 2;  // column sums in partial's slices
    const int64_t col_tiles = (dim + 32 * vec - 1) / (32 * vec);
    const int64_t chunks =
        cols_resident > 0 ? std::clamp<int64_t>((rows + kWarps - 1) / kWarps, 1, int64_t{sms} * cols_resident)
        : warp_path       ? std::clamp<int64_t>((int64_t{sms} * 8 + col_tiles - 1) / col_tiles, 1,
                                                std::max<int64_t>((rows + 32 * vec - 1) / (32 * vec), 1))
                          : std::clamp<int64_t>(rows, 1, int64_t{sms} * 2);
    const int64_t chunk = std::max<int64_t>((rows + chunks - 1) / chunks, 1);
    const bool col_kernel = warp_path && cols_resident == 0;  // ln_grad_params' chunks
    const int parts = static_cast<int>(col_kernel ? std::max<int64_t>((rows + chunk - 1) / chunk, 1) : chunks);
    auto* partial = static_cast<double*>(
        a.ctx.scratch(static_cast<size_t>(parts) * in_kernel * static_cast<size_t>(dim) * sizeof(double)));
    PartialSums sums;
    sums.partial = partial;
    for (int i = 0; i < in_kernel; ++i) {  // dgamma, dbeta (, dx's sums)
      sums.out[i] = a.out[1 + i].data;
      sums.dtype[i] = a.out[1 + i].dtype();
      sums.scale[i] = 1.0;
    }
    sums.outputs = in_kernel;
    sums.chunks = parts;
    sums.kept = dim;
    const dim3 col_block(32, kColRows);
    const auto blocks = static_cast<unsigned>(parts);
    // dx's sums where the kernel adds none: the sum step's reduction over dx as written.
    Launch dx_sum = dx_sums && in_kernel == 2
                        ? prepare_as_step(a, Op::sum,
                                          Attrs{{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}},
                                          {DeviceTensor{a.out[0].data, TensorType{a.out[0].dtype(), {rows, dim}}}},
                                          {a.out[3]})
                        : Launch([](cudaStream_t) {});
    if (warp_path && cols_resident > 0) {
      const int d = static_cast<int>(dim);
      launch = [=](cudaStream_t st) {
        launch_ln_grad_dx(st, blocks, n, vec_dx, dy, x, mean, rstd, gamma, beta, dr, dx, partial, in_kernel, rows, d,
                          err, step);
        add_partials(sums, st);
      };
      return;
    }
    if (warp_path) {
      const int d = static_cast<int>(dim);
      const unsigned dx_blocks = blocks_for(rows, kWarps, sms * 16);
      const dim3 param_grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(parts));
      launch = [=](cudaStream_t st) {
        launch_ln_grad_dx(st, dx_blocks, n, vec_dx, dy, x, mean, rstd, gamma, beta, dr, dx, nullptr, 0, rows, d, err,
                          step);
        dx_sum(st);
        if (vec > 1)
          ln_grad_params<kV><<<param_grid, col_block, 0, st>>>(dy, x, mean, rstd, gamma, beta, partial, rows, dim,
                                                               chunk);
        else
          ln_grad_params<1><<<param_grid, col_block, 0, st>>>(dy, x, mean, rstd, gamma, beta, partial, rows, dim,
                                                              chunk);
        SEAM_CUDA_LAUNCH_CHECK();
        add_partials(sums, st);
      };
      return;
    }
    const int64_t per_thread = (dim + kRowBlock - 1) / kRowBlock;
    launch = [=](cudaStream_t st) {
      if (per_thread <= 4)
        launch_ln_grad_block<4>(st, blocks, dy, x, mean, rstd, gamma, beta, dr, dx, partial, rows, dim, err, step);
      else if (per_thread <= 8)
        launch_ln_grad_block<8>(st, blocks, dy, x, mean, rstd, gamma, beta, dr, dx, partial, rows, dim, err, step);
      else if (per_thread <= 16)
        launch_ln_grad_block<16>(st, blocks, dy, x, mean, rstd, gamma, beta, dr, dx, partial, rows, dim, err, step);
      else
        launch_ln_grad_block<0>(st, blocks, dy, x, mean, rstd, gamma, beta, dr, dx, partial, rows, dim, err, step);
      add_partials(sums, st);
      dx_sum(st);
    };
  });
  return launch;
}

}  // namespace seam::cuda::ln
