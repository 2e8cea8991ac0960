// CUDA kernels of layer_norm (over the last dim D) and its gradient. Same formulas as the
// CPU reference (src/backend/cpu/norm.cpp): biased variance from a second, centred pass;
// outputs y, mean [rows], rstd [rows].
//
//   D <= 1024: a group of ceil(D / 256) warps per row, the row in registers (at most 8
//              values a lane), in 16-byte packs where the row allows (with_rows);
//   D >  1024: one block per row, passes over the row through L1.
// The backward computes dx row by row and the column sums dgamma = sum_rows dy * xhat,
// dbeta = sum_rows dy deterministically: the rows of each block (D <= 1024: each lane's
// in registers, then the block's row groups in order; D > 1024: the block's rows) are
// added in a fixed order into the block's own slice of scratch ([blocks][2][D], double),
// then a last kernel sums the slices in block order. No atomics. With dx_sums
// (bias_grads_into_norm_grads) the column sums of dx as stored are a third: in the dx
// kernel's slices ([blocks][3][D]) on rows of up to 1024, else a sum step over dx.
//
// x, y, dy and dx are stored as T (f32, bf16 or f16), gamma, beta, dgamma and dbeta as P
// (f32, or T), mean and rstd as f32; everything computes in float (the column sums in
// double, past each lane's float sum of its few rows in the dx kernel), one template for
// every storage type.
#include <cmath>

#include <type_traits>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/storage.cuh"

namespace seam::cuda {

namespace {

constexpr int kRowBlock = 512;   // block path
constexpr int kMaxRowDim = 1024;  // row path (ln_rows, ln_grad_rows) up to here

// Rows in registers: a lane holds N values of its row in N / V packs of V neighbouring
// values (their places: RowGroup). V = 1 reads one value at
// a time; V = kVec<T> (4 f32 or 8 16-bit values) reads 16 bytes at a time, where the row
// length is a multiple of V and every operand is 16-byte aligned: a warp then has a whole
// row's loads in flight at once instead of 2 bytes a lane.
template <class T>
constexpr int kVec = std::is_same_v<T, float> ? 4 : 8;

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
        const S* v = reinterpret_cast<const S*>(&w[c]);
#pragma unroll
        for (int i = 0; i < kPer16; ++i) out[c * kPer16 + i] = to_float(v[i]);
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

template <int V, class S>
__device__ __forceinline__ void store_pack(S* __restrict__ p, const float (&in)[V]) {
  if constexpr (V == 1) {
    p[0] = from_float<S>(in[0]);
  } else {
    constexpr int kPer16 = 16 / sizeof(S);
#pragma unroll
    for (int c = 0; c < V / kPer16; ++c) {
      uint4 raw;
      S* v = reinterpret_cast<S*>(&raw);
#pragma unroll
      for (int i = 0; i < kPer16; ++i) v[i] = from_float<S>(in[c * kPer16 + i]);
      reinterpret_cast<uint4*>(p)[c] = raw;
    }
  }
}

// ---- forward ----

// Rows of up to 1024 (the row path): a group of W = ceil(D / 256) warps per row, each lane
// N <= 8 values of it (N / V packs of V neighbouring values, pack p of the group's lane l
// at columns (l + 32 W p) V ... + V - 1). A lane's share of the row, of gamma and beta
// and, in the backward, of the column sums then fits in registers with room for many
// warps an SM: with the whole row a warp's (24 values a lane at D = 768) an SM held 16 to
// 24 warps and each waited on its own long chains. A block holds `groups` rows in flight.
constexpr int kMaxGroups = 16;

// The lane's place in its row group, the group's place in the block.
template <int W>
struct RowGroup {
  int lane, group;
  __device__ RowGroup() : lane(threadIdx.x % (32 * W)), group(threadIdx.x / (32 * W)) {}
  __device__ int col(int p) const { return lane + 32 * W * p; }  // pack p's index along the row
};

// Sums over the row group's W warps of K values each warp has summed already: lane 0 of
// each writes its own into slot ([K][W] floats, this row's parity: a warp may run one
// row ahead), the group meets at its own named barrier, every lane adds the W values in
// warp order: the same floats in every warp of the group.
template <int W, int K>
__device__ __forceinline__ void group_sum(float (&v)[K], float* slot, int group) {
  if constexpr (W > 1) {
    const int w = threadIdx.x / 32 % W;
    if (threadIdx.x % 32 == 0)
#pragma unroll
      for (int k = 0; k < K; ++k) slot[k * W + w] = v[k];
    asm volatile("bar.sync %0, %1;\n" ::"r"(group + 1), "r"(32 * W) : "memory");
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float t = 0.f;
#pragma unroll
      for (int i = 0; i < W; ++i) t += slot[k * W + i];
      v[k] = t;
    }
  }
}

// A warp's rows, read kAhead rows ahead of their use. With 16-byte packs (V > 1) each lane
// copies its own packs into its own slots of shared memory (cp.async): no lane waits on
// another, and no registers hold the rows in flight, so an SM keeps several rows a warp in
// flight at the occupancy of a few registers. Rows of no 16-byte packs (V = 1) are read
// where used. Arrays: x (and dy, dr in the backward).
constexpr int kAhead = 4;

template <int V, int kPacks, int kArrays, class T>
struct Staged {
  static constexpr int kWords = V > 1 ? kAhead * kArrays * kPacks * 32 : 0;  // 16-byte words a warp
  static constexpr int kStage = kArrays * kPacks * 32;
  uint4* slots;  // this lane's first of its warp's [kAhead][kArrays][kPacks][32]
  __device__ explicit Staged(uint4* warp_slots) : slots(warp_slots + (threadIdx.x & 31)) {}
  __device__ uint4* at(int stage, int a, int p) const { return slots + stage * kStage + (a * kPacks + p) * 32; }
  __device__ void fetch(int stage, int a, int p, const T* g) const {
    if constexpr (V > 1) cp16(at(stage, a, p), g, true);
  }
  __device__ void take(int stage, int a, int p, const T* g, float (&out)[V]) const {
    if constexpr (V > 1) {
      RawPack<V, T> raw;
      raw.w[0] = *at(stage, a, p);
      raw.to(out);
    } else {
      load_pack<1>(g, out);
    }
  }
};

template <int W, int N, int V, class T, class P>
__global__ void __launch_bounds__(512)
    ln_rows(const T* __restrict__ x, const P* __restrict__ gamma, const P* __restrict__ beta, T* __restrict__ y,
            float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows, int dim, double eps) {
  static_assert(N % V == 0 && (W == 1 || N <= 8));
  constexpr bool kHold = N <= 8;  // gamma and beta in registers, else read (from L1) each row
  constexpr int kPacks = N / V;
  using Rows = Staged<V, kPacks, 1, T>;
  extern __shared__ uint4 stage_words[];  // [warps][Rows::kWords]
  __shared__ float slots[kMaxGroups][2][2][W];  // [group][row parity][mean, variance][warp]
  const RowGroup<W> rg;
  const Rows staged(stage_words + (threadIdx.x >> 5) * Rows::kWords);
  const int groups = blockDim.x / (32 * W);
  const int64_t stride = int64_t{gridDim.x} * groups;
  float g[kHold ? kPacks : 1][V], b[kHold ? kPacks : 1][V];  // the lane's columns are the same in every row
  if constexpr (kHold)
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = rg.col(p) * V;
      if (j < dim) {
        load_pack<V>(gamma + j, g[p]);
        load_pack<V>(beta + j, b[p]);
      }
    }
  // Rows by their first element's offset: the group's rows are `step` elements apart.
  const int64_t step = stride * dim;
  auto fetch = [&](int64_t r, int64_t off, int stage) {  // a copy group every time: cp_wait counts them
    if (r < rows)
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        const int j = rg.col(p) * V;
        if (j < dim) staged.fetch(stage, 0, p, x + off + j);
      }
    if constexpr (V > 1) cp_commit();
  };
  int64_t r = blockIdx.x * int64_t{groups} + rg.group, off = r * dim;
#pragma unroll
  for (int k = 0; k + 1 < kAhead; ++k) fetch(r + k * stride, off + k * step, k);
  for (int it = 0; r < rows; r += stride, off += step, ++it) {
    const int stage = it % kAhead;
    fetch(r + (kAhead - 1) * stride, off + (kAhead - 1) * step, (it + kAhead - 1) % kAhead);
    if constexpr (V > 1) cp_wait<kAhead - 1>();
    float* slot = slots[rg.group][it & 1][0];
    float v[kPacks][V];
    float s[1] = {0.f};
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = rg.col(p) * V;
      if (j < dim) staged.take(stage, 0, p, x + off + j, v[p]);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        if (j >= dim) v[p][i] = 0.f;
        s[0] += v[p][i];
      }
    }
    s[0] = warp_sum(s[0]);
    group_sum<W>(s, slot, rg.group);
    const float mean = s[0] / static_cast<float>(dim);
    float sq[1] = {0.f};
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = rg.col(p) * V;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        v[p][i] = j < dim ? v[p][i] - mean : 0.f;
        sq[0] += v[p][i] * v[p][i];
      }
    }
    sq[0] = warp_sum(sq[0]);
    group_sum<W>(sq, slot + W, rg.group);
    const float var = sq[0] / static_cast<float>(dim);
    const float rstd = static_cast<float>(1.0 / sqrt(static_cast<double>(var) + eps));
    T* yr = y + off;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = rg.col(p) * V;
      if (j >= dim) continue;
      const int q = kHold ? p : 0;
      if constexpr (!kHold) {
        load_pack<V>(gamma + j, g[0]);
        load_pack<V>(beta + j, b[0]);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) v[p][i] = fmaf(v[p][i] * rstd, g[q][i], b[q][i]);
      store_pack<V>(yr + j, v[p]);
    }
    if (rg.lane == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
  if constexpr (V > 1) cp_wait<0>();  // copies past the last row are none, but leave no group behind
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

// ---- backward ----

// The column sums add one term per row. In f32 the rounding of each term (xhat, dy * xhat)
// alone, summed over thousands of rows, shows as an error of 1e-3 or more relative to a
// column whose sum nearly cancels. So the terms of dgamma are formed from
// (x - mean) * rstd in double and every column sum accumulates in double, as the CPU
// does; the row sums of dx stay in f32.

// Rows of up to 1024: dx by a row group (W warps, as in ln_rows), the row's dy * gamma
// and xhat held in registers between the row sums and the write. With dr
// (sum_into_norm_grads), dx = the layer norm's own input gradient + dr, added in float and
// stored once; dr is loaded with x and dy, so that a row waits on memory once.
// S column sums come from the same read: dgamma (dy * xhat), dbeta (dy) and, with S = 3,
// dx as stored (dx_sums: a linear layer's bias gradient). A lane adds its rows' terms in
// float in registers (its columns are the same in every row); at the end each group puts
// its sums in shared memory ([groups][S][D]) and the block adds them in group order, in
// double, into its slice of partial ([blocks][S][D]): the same sums every run.
template <int W, int N, int V, int S, class T, class P>
__global__ void __launch_bounds__(512, 2)
    ln_grad_rows(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                 const float* __restrict__ rstd, const P* __restrict__ gamma, const T* __restrict__ dr,
                 T* __restrict__ dx, double* __restrict__ partial, int64_t rows, int dim) {
  static_assert(N % V == 0 && N <= 8 && S >= 2 && S <= 3);
  constexpr int kPacks = N / V;
  using Rows = Staged<V, kPacks, 3, T>;  // x, dy, dr
  // [warps][Rows::kWords] 16-byte words, then (V > 1) [warps][kAhead][mean, rstd][32]
  // floats; once the rows are done, the groups' column sums [groups][S][dim] floats.
  extern __shared__ uint4 stage_words[];
  __shared__ float slots[kMaxGroups][2][2][W];  // [group][row parity][g, g xhat][warp]
  const RowGroup<W> rg;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const Rows staged(stage_words + warp * Rows::kWords);
  float* stats = reinterpret_cast<float*>(stage_words + warps * Rows::kWords) + warp * (kAhead * 2 * 32) + lane;
  const int groups = blockDim.x / (32 * W);
  const int64_t stride = int64_t{gridDim.x} * groups;
  float sums[S][kPacks][V];
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
#pragma unroll
    for (int i = 0; i < V; ++i)
#pragma unroll
      for (int k = 0; k < S; ++k) sums[k][p][i] = 0.f;
  const int64_t step = stride * dim;  // elements between the group's rows
  auto fetch = [&](int64_t r, int64_t off, int stage) {  // a copy group every time: cp_wait counts them
    if constexpr (V > 1) {
      if (r < rows) {
#pragma unroll
        for (int p = 0; p < kPacks; ++p) {
          const int j = rg.col(p) * V;
          if (j >= dim) continue;
          staged.fetch(stage, 0, p, x + off + j);
          staged.fetch(stage, 1, p, dy + off + j);
          if (dr) staged.fetch(stage, 2, p, dr + off + j);
        }
        cp4(stats + stage * 64, mean + r, true);
        cp4(stats + stage * 64 + 32, rstd + r, true);
      }
      cp_commit();
    }
  };
  int64_t r = blockIdx.x * int64_t{groups} + rg.group, off = r * dim;
#pragma unroll
  for (int k = 0; k + 1 < kAhead; ++k) fetch(r + k * stride, off + k * step, k);
  for (int it = 0; r < rows; r += stride, off += step, ++it) {
    const int stage = it % kAhead;
    fetch(r + (kAhead - 1) * stride, off + (kAhead - 1) * step, (it + kAhead - 1) % kAhead);
    float m, s;
    if constexpr (V > 1) {
      cp_wait<kAhead - 1>();
      m = stats[stage * 64];
      s = stats[stage * 64 + 32];
    } else {
      m = mean[r];
      s = rstd[r];
    }
    float g[kPacks][V], xh[kPacks][V];
    float row[2] = {0.f, 0.f};  // sums of g and of g xhat
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = rg.col(p) * V;
      if (j >= dim) continue;
      staged.take(stage, 0, p, x + off + j, xh[p]);
      staged.take(stage, 1, p, dy + off + j, g[p]);
      float gm[V];  // from L1 each row: registers for two blocks an SM
      load_pack<V>(gamma + j, gm);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        xh[p][i] = (xh[p][i] - m) * s;
        sums[0][p][i] = fmaf(g[p][i], xh[p][i], sums[0][p][i]);
        sums[1][p][i] += g[p][i];
        g[p][i] *= gm[i];
        row[0] += g[p][i];
        row[1] += g[p][i] * xh[p][i];
      }
    }
    row[0] = warp_sum(row[0]);
    row[1] = warp_sum(row[1]);
    group_sum<W>(row, slots[rg.group][it & 1][0], rg.group);
    const float g_mean = row[0] / static_cast<float>(dim);
    const float gx_mean = row[1] / static_cast<float>(dim);
    T* dxr = dx + off;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int j = rg.col(p) * V;
      if (j >= dim) continue;
      float d[V];
      if (dr) {
        staged.take(stage, 2, p, dr + off + j, d);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) d[i] = 0.f;
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        d[i] += s * (g[p][i] - g_mean - xh[p][i] * gx_mean);
        if constexpr (S == 3) {
          d[i] = to_float(from_float<T>(d[i]));  // the value stored, which the sum adds
          sums[2][p][i] += d[i];
        }
      }
      store_pack<V>(dxr + j, d);
    }
  }
  if constexpr (V > 1) cp_wait<0>();
  __syncthreads();  // the column sums take the rows' shared memory
  float* cols = reinterpret_cast<float*>(stage_words);
  float* mine = cols + rg.group * (S * dim);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int j = rg.col(p) * V;
    if (j >= dim) continue;
#pragma unroll
    for (int k = 0; k < S; ++k)
#pragma unroll
      for (int i = 0; i < V; ++i) mine[k * dim + j + i] = sums[k][p][i];
  }
  __syncthreads();
  double* out = partial + blockIdx.x * (S * int64_t{dim});
  for (int k = threadIdx.x; k < S * dim; k += blockDim.x) {
    double sum = 0.0;
    for (int w = 0; w < groups; ++w) sum += cols[w * (S * dim) + k];  // in group order
    out[k] = sum;
  }
}

// Shared memory of ln_rows (s = 0) and ln_grad_rows (s column sums) for rows of dim in
// blocks of `warps`, with V values a pack and N a lane.
size_t ln_rows_bytes(int warps, int groups, int v, int n, int s, int dim) {
  if (v == 1) return static_cast<size_t>(groups) * s * static_cast<size_t>(dim) * sizeof(float);
  const size_t arrays = s == 0 ? 1 : 3;
  size_t rows = static_cast<size_t>(warps) * kAhead * arrays * (n / v) * 32 * 16;
  if (s > 0) rows += static_cast<size_t>(warps) * kAhead * 2 * 32 * sizeof(float);
  return std::max(rows, static_cast<size_t>(groups) * s * static_cast<size_t>(dim) * sizeof(float));
}

// One block per row (rows blockIdx.x + k * gridDim.x). Thread t owns columns t + i *
// blockDim.x and accumulates their dgamma/dbeta in registers when M > 0 (dim <= M *
// blockDim.x), else directly in its block's slice of partial (only it touches those
// addresses, so no synchronization is needed).
template <int M, class T, class P>
__global__ void __launch_bounds__(kRowBlock)
    ln_grad_block(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                  const float* __restrict__ rstd, const P* __restrict__ gamma, const T* __restrict__ dr,
                  T* __restrict__ dx,
                  double* __restrict__ partial, int64_t rows, int64_t dim) {
  double* pg = partial + blockIdx.x * (2 * dim);
  double* pb = pg + dim;
  constexpr int kRegs = M > 0 ? M : 1;
  double acc_g[kRegs], acc_b[kRegs];
#pragma unroll
  for (int k = 0; k < kRegs; ++k) acc_g[k] = acc_b[k] = 0.0;
  if constexpr (M == 0)
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) pg[j] = pb[j] = 0.0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float m = mean[r], s = rstd[r];
    const T* dyr = dy + r * dim;
    const T* xr = x + r * dim;
    float g_sum = 0.f, gx_sum = 0.f;
    if constexpr (M > 0) {
#pragma unroll
      for (int k = 0; k < M; ++k) {
        const int64_t j = threadIdx.x + int64_t{k} * blockDim.x;
        if (j < dim) {
          const float d = to_float(dyr[j]), xv = to_float(xr[j]);
          const float xh = (xv - m) * s, g = d * to_float(gamma[j]);
          g_sum += g;
          gx_sum += g * xh;
          acc_g[k] += static_cast<double>(d) * ((static_cast<double>(xv) - m) * s);
          acc_b[k] += d;
        }
      }
    } else {
#pragma unroll 4
      for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        const float d = to_float(dyr[j]), xv = to_float(xr[j]);
        const float xh = (xv - m) * s, g = d * to_float(gamma[j]);
        g_sum += g;
        gx_sum += g * xh;
        pg[j] += static_cast<double>(d) * ((static_cast<double>(xv) - m) * s);
        pb[j] += d;
      }
    }
    const float g_mean = block_sum(g_sum) / static_cast<float>(dim);
    const float gx_mean = block_sum(gx_sum) / static_cast<float>(dim);
    T* dxr = dx + r * dim;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const float xh = (to_float(xr[j]) - m) * s;
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

// ---- preparers ----

// Warps a row group spans (ln_rows, ln_grad_rows): a lane then holds at most 8 values;
// one where `one_warp` (the forward's choice: a row a warp, up to 32 values a lane).
int row_warps(int64_t dim, bool one_warp) { return one_warp ? 1 : static_cast<int>((dim + 255) / 256); }
// Row groups a block holds: 16 warps (the backward's column sums are added a block at a
// time, so blocks of many rows keep partial short).
int row_groups(int64_t dim, bool one_warp) { return std::max(16 / row_warps(dim, one_warp), 1); }

// Calls f(W, N, V) (std::integral_constant<int, ...>) for rows of dim (<= 1024): W warps
// a row, N values a lane (8 past one warp; else 1, 2, 4 or 8, with kOneWarp lane_groups'
// sizes up to 32, rounded up to a pack where `vec`), in packs of V: 16 bytes where `vec`,
// else one value.
template <class T, bool kOneWarp, class F>
void with_rows(int64_t dim, bool vec, F&& f) {
  using std::integral_constant;
  auto go = [&](auto w, auto n) {
    if constexpr (decltype(n)::value % kVec<T> == 0) {
      if (vec) return f(w, n, integral_constant<int, kVec<T>>{});
    }
    f(w, n, integral_constant<int, 1>{});
  };
  constexpr integral_constant<int, 1> one;
  if constexpr (kOneWarp) {
    int n = lane_groups(dim);
    if (vec && n % kVec<T> != 0) n = n < kVec<T> ? kVec<T> : n + kVec<T> - n % kVec<T>;
    switch (n) {
      case 1: return go(one, integral_constant<int, 1>{});
      case 2: return go(one, integral_constant<int, 2>{});
      case 4: return go(one, integral_constant<int, 4>{});
      case 8: return go(one, integral_constant<int, 8>{});
      case 12: return go(one, integral_constant<int, 12>{});
      case 16: return go(one, integral_constant<int, 16>{});
      case 24: return go(one, integral_constant<int, 24>{});
      default: return go(one, integral_constant<int, 32>{});
    }
  } else {
    switch (row_warps(dim, false)) {
      case 2: return go(integral_constant<int, 2>{}, integral_constant<int, 8>{});
      case 3: return go(integral_constant<int, 3>{}, integral_constant<int, 8>{});
      case 4: return go(integral_constant<int, 4>{}, integral_constant<int, 8>{});
      default: break;
    }
    int n = dim <= 32 ? 1 : dim <= 64 ? 2 : dim <= 128 ? 4 : 8;
    if (vec) n = std::max(n, kVec<T>);
    switch (n) {
      case 1: return go(one, integral_constant<int, 1>{});
      case 2: return go(one, integral_constant<int, 2>{});
      case 4: return go(one, integral_constant<int, 4>{});
      default: return go(one, integral_constant<int, 8>{});
    }
  }
}

// Allows a kernel its shared memory and returns its blocks resident on an SM (at least 1).
template <class K>
int resident_blocks(K kernel, int threads, size_t bytes) {
  SEAM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  int n = 0;
  SEAM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, bytes));
  return std::max(n, 1);
}

// ln_rows for rows of dim: its block, its blocks resident on an SM (call before launch:
// it allows the kernel its shared memory), its launch.
template <class T, class P>
struct LnRows {
  int64_t dim;
  bool vec, one_warp;
  int threads() const { return 32 * row_warps(dim, one_warp) * row_groups(dim, one_warp); }
  template <class F>
  void with_kernel(F&& f) const {
    auto go = [&](auto w, auto nv, auto v) {
      constexpr int kW = decltype(w)::value, kN = decltype(nv)::value, kV = decltype(v)::value;
      f(ln_rows<kW, kN, kV, T, P>, ln_rows_bytes(threads() / 32, 0, kV, kN, 0, 0));
    };
    if (one_warp) with_rows<T, true>(dim, vec, go);
    else with_rows<T, false>(dim, vec, go);
  }
  int resident() const {
    int n = 1;
    with_kernel([&](auto kernel, size_t bytes) { n = resident_blocks(kernel, threads(), bytes); });
    return n;
  }
  void launch(cudaStream_t st, unsigned blocks, const T* x, const P* gamma, const P* beta, T* y, float* mean,
              float* rstd, int64_t rows, double eps) const {
    with_kernel([&](auto kernel, size_t bytes) {
      kernel<<<blocks, threads(), bytes, st>>>(x, gamma, beta, y, mean, rstd, rows, static_cast<int>(dim), eps);
    });
    SEAM_CUDA_LAUNCH_CHECK();
  }
};

// ln_grad_rows with s column sums (2, 3 with dx's) for rows of dim, as LnRows.
template <class T, class P>
struct LnGradRows {
  int64_t dim;
  bool vec;
  int s;
  int threads() const { return 32 * row_warps(dim, false) * row_groups(dim, false); }
  template <class F>
  void with_kernel(F&& f) const {
    with_rows<T, false>(dim, vec, [&](auto w, auto nv, auto v) {
      constexpr int kW = decltype(w)::value, kN = decltype(nv)::value, kV = decltype(v)::value;
      const size_t bytes = ln_rows_bytes(threads() / 32, row_groups(dim, false), kV, kN, s, static_cast<int>(dim));
      if (s == 3) f(ln_grad_rows<kW, kN, kV, 3, T, P>, bytes);
      else f(ln_grad_rows<kW, kN, kV, 2, T, P>, bytes);
    });
  }
  int resident() const {
    int n = 1;
    with_kernel([&](auto kernel, size_t bytes) { n = resident_blocks(kernel, threads(), bytes); });
    return n;
  }
  void launch(cudaStream_t st, unsigned blocks, const T* dy, const T* x, const float* mean, const float* rstd,
              const P* gamma, const T* dr, T* dx, double* partial, int64_t rows) const {
    with_kernel([&](auto kernel, size_t bytes) {
      kernel<<<blocks, threads(), bytes, st>>>(dy, x, mean, rstd, gamma, dr, dx, partial, rows, static_cast<int>(dim));
    });
    SEAM_CUDA_LAUNCH_CHECK();
  }
};

template <int M, class T, class P>
void launch_ln_grad_block(cudaStream_t st, unsigned blocks, const T* dy, const T* x, const float* mean,
                          const float* rstd, const P* gamma, const T* dr, T* dx, double* partial, int64_t rows,
                          int64_t dim) {
  ln_grad_block<M><<<blocks, kRowBlock, 0, st>>>(dy, x, mean, rstd, gamma, dr, dx, partial, rows, dim);
  SEAM_CUDA_LAUNCH_CHECK();
}

// The operands of layer_norm(_grad): `data` (x, y, dy, dx) share x's dtype, `params`
// (gamma, beta, dgamma, dbeta) are f32 or x's dtype, all one, and `stats` (mean, rstd)
// are f32.
void expect_ln_dtypes(const StepArgs& a, std::initializer_list<const DeviceTensor*> data,
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

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
    if (dim <= kMaxRowDim) {
      const bool vec = dim % kVec<T> == 0 && aligned16(x) && aligned16(y) && aligned16(gamma) && aligned16(beta);
      // One wave of resident blocks, each row group over several rows: its next row loads
      // while this one is computed, where a second wave would start with a wait.
      const bool one_warp = false;  // a row a warp (up to 32 values a lane): measured against row groups
      const LnRows<T, P> k{dim, vec, one_warp};
      const unsigned blocks = blocks_for(rows, row_groups(dim, one_warp), sms * k.resident());
      launch = [=](cudaStream_t st) { k.launch(st, blocks, x, gamma, beta, y, mean, rstd, rows, eps); };
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

Launch prepare_layer_norm_grad(const StepArgs& a) {
  expect_ln_dtypes(a, {&a.in[1], &a.in[0], &a.out[0]}, {&a.in[4], &a.out[1], &a.out[2]}, {&a.in[2], &a.in[3]});
  if (a.in.size() == 6) expect_dtype(a, a.in[5], {a.in[1].dtype()});
  const bool dx_sums = a.out.size() == 4;  // also dx's column sums (bias_grads_into_norm_grads)
  if (dx_sums) expect_dtype(a, a.out[3], {a.in[4].dtype()});
  const int64_t dim = a.in[1].shape().back();
  const int64_t rows = a.in[2].numel();
  const float* mean = a.in[2].as<float>();
  const float* rstd = a.in[3].as<float>();
  const int sms = std::max(a.ctx.sm_count, 1);
  if (dim == 0) return [](cudaStream_t) {};
  Launch launch;
  dispatch_ln(a, a.in[1].dtype(), a.in[4].dtype(), [&]<class T, class P>() {
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    const P* gamma = a.in[4].as<P>();
    const T* dr = a.in.size() == 6 ? a.in[5].as<T>() : nullptr;
    T* dx = a.out[0].as<T>();
    // Blocks (and so partial slices) fixed here: the summation order is the same every
    // run. With no rows the kernels still run: they write zero partials, so dgamma =
    // dbeta = 0.
    const bool row_path = dim <= kMaxRowDim;
    // Row path: every column sum in the dx kernel (3 with dx's), one slice a block, as many
    // blocks as stay resident. Block path: a slice per block, blocks as rows up to 2 an
    // SM; dx's sums are then a sum step's over the dx written.
    constexpr int kV = kVec<T>;
    const bool vec = dim % kV == 0 && aligned16(dy) && aligned16(x) && aligned16(gamma) && aligned16(dx) &&
                     (!dr || aligned16(dr));
    const int in_kernel = row_path && dx_sums ? 3 : 2;  // column sums in partial's slices
    const LnGradRows<T, P> k{dim, vec, in_kernel};
    const int64_t parts = row_path ? blocks_for(rows, row_groups(dim, false), sms * k.resident())
                                   : std::clamp<int64_t>(rows, 1, int64_t{sms} * 2);
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
    sums.chunks = static_cast<int>(parts);
    sums.kept = dim;
    const auto blocks = static_cast<unsigned>(parts);
    if (row_path) {
      launch = [=](cudaStream_t st) {
        k.launch(st, blocks, dy, x, mean, rstd, gamma, dr, dx, partial, rows);
        add_partials(sums, st);
      };
      return;
    }
    // dx's sums: the sum step's reduction over dx as written.
    Launch dx_sum = dx_sums
                        ? prepare_as_step(a, Op::sum, Attrs{{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}},
                                          {DeviceTensor{a.out[0].data, TensorType{a.out[0].dtype(), {rows, dim}}}}, {a.out[3]})
                        : Launch([](cudaStream_t) {});
    const int64_t per_thread = (dim + kRowBlock - 1) / kRowBlock;
    launch = [=](cudaStream_t st) {
      if (per_thread <= 4) launch_ln_grad_block<4>(st, blocks, dy, x, mean, rstd, gamma, dr, dx, partial, rows, dim);
      else if (per_thread <= 8) launch_ln_grad_block<8>(st, blocks, dy, x, mean, rstd, gamma, dr, dx, partial, rows, dim);
      else if (per_thread <= 16) launch_ln_grad_block<16>(st, blocks, dy, x, mean, rstd, gamma, dr, dx, partial, rows, dim);
      else launch_ln_grad_block<0>(st, blocks, dy, x, mean, rstd, gamma, dr, dx, partial, rows, dim);
      add_partials(sums, st);
      dx_sum(st);
    };
  });
  return launch;
}

}  // namespace

void register_norm(PreparerTable& t) {
  set(t, Op::layer_norm, prepare_layer_norm);
  set(t, Op::layer_norm_grad, prepare_layer_norm_grad);
}

}  // namespace seam::cuda
