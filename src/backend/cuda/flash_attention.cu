// seam's tiled attention kernels (attention.h): FlashAttention-2's algorithm on the tensor
// cores (mma.sync m16n8k16, bf16 or f16 operands, f32 accumulators), for head sizes 64 and
// 128 with Dv = D.
//
// A block is four warps and owns 64 rows (16 a warp); it walks tiles of N rows of the
// other operand, staged in shared memory by cp.async two tiles ahead of use (zero-filled
// past the end). Scores stay in registers: the accumulator layout of two m16n8 tiles is
// the operand layout of one m16k16 tile, so P (and dS) feed the next product without
// leaving the thread.
//   forward: a block per 64 queries; S = Q K^T, the online softmax in base 2, O += P V.
//   dq:      a block per 64 queries; S, P from lse, dP = dO V^T, dS = P (dP - rowsum),
//            dQ += dS K.
//   dk, dv:  a block per 64 keys; S^T = K Q^T, dV += P^T dO, dP^T = V dO^T, dK += dS^T Q.
// The backward recomputes S in both kernels (seven products instead of five) so that no
// sum is shared between blocks: no atomics, the same bits every run. Dropout of the
// probabilities draws each (query, key) pair's Philox number as the CPU does: P's row sums
// stay undropped, the products take P times the factor, and dP is the product's gradient
// times it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/attention.h"
#include "backend/cuda/check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/storage.cuh"
#include "common/philox.h"

namespace seam::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kM = 16 * kWarps;  // rows a block owns
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory rows are D + 8 elements apart: consecutive rows then start 16 bytes apart
// modulo 128, so the eight row addresses of an ldmatrix hit eight distinct bank groups.
template <int D>
constexpr int kStride = D + 8;

struct FlashGeom {
  int h, tq, tk;
  Rows q, k, v, o;  // o's also do's; each gradient its operand's
  float scale, scale2;  // scale2 = scale * log2(e): exponents in base 2
  bool causal;
  float drop;  // 0: no dropout
  uint32_t stream;
  const DeviceCounters* counters;
};

// The dropout factor of query `row`, key `col` of head bh: 0 or 1 / (1 - p).
struct FlashKeep {
  uint64_t seed = 0, step = 0;
  float scale = 1.f;
  __device__ explicit FlashKeep(const FlashGeom& g) {
    if (g.drop == 0.f) return;
    seed = g.counters->seed;
    step = static_cast<uint64_t>(g.counters->step);
    scale = 1.f / (1.f - g.drop);
  }
  __device__ float operator()(const FlashGeom& g, int64_t bh, int row, int col) const {
    const uint64_t index = (static_cast<uint64_t>(bh) * static_cast<uint64_t>(g.tq) + static_cast<uint64_t>(row)) *
                               static_cast<uint64_t>(g.tk) + static_cast<uint64_t>(col);
    return dropout_uniform(seed, step, g.stream, index) >= g.drop ? scale : 0.f;
  }
};

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldsm4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// Two floats as one register of two 16-bit values, lo in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Rows [row0, row0 + R) of an [n, D] matrix whose rows are ld elements apart into a
// shared tile; rows >= n zero.
template <class T, int D, int R>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t ld, int row0, int n) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < R * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = row0 + r < n;
    cp16(s + r * kStride<D> + col, valid ? g + int64_t{row0 + r} * ld + col : g, valid);
  }
}

// The A operand of rows [r0, r0 + 16) and columns [c0, c0 + 16) of a shared tile.
template <int D, class T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* s, int r0, int c0) {
  const int lane = threadIdx.x & 31;
  ldsm4(a, s + (r0 + (lane & 15)) * kStride<D> + c0 + (lane >> 4) * 8);
}

// B operands of the n8 tiles at n0 and n0 + 8 over k in [k0, k0 + 16): b[0..1] and
// b[2..3]. From a tile stored [n][k] (the rows are B's columns) ...
template <int D, class T>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const T* s, int n0, int k0) {
  const int lane = threadIdx.x & 31;
  ldsm4(b, s + (n0 + (lane & 7) + (lane >> 4) * 8) * kStride<D> + k0 + ((lane >> 3) & 1) * 8);
}
// ... or stored [k][n], transposed on the way.
template <int D, class T>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const T* s, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  ldsm4_t(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride<D> + n0 + (lane >> 4) * 8);
}

// acc (16 x N) += rows [r0, r0 + 16) of tile a (16 x D) times tile b (N x D) transposed.
template <class T, int D, int N>
__device__ __forceinline__ void mma_abt(float (&acc)[N / 8][4], const T* a, int r0, const T* b) {
#pragma unroll
  for (int kk = 0; kk < D; kk += 16) {
    uint32_t af[4];
    load_a<D>(af, a, r0, kk);
#pragma unroll
    for (int n = 0; n < N; n += 16) {
      uint32_t bf[4];
      load_b_nk<D>(bf, b, n, kk);
      mma<T>(acc[n / 8], af, bf[0], bf[1]);
      mma<T>(acc[n / 8 + 1], af, bf[2], bf[3]);
    }
  }
}

// acc (16 x D) += p (16 x N, accumulator layout, rounded to T) times tile b (N x D).
template <class T, int D, int N>
__device__ __forceinline__ void mma_pb(float (&acc)[D / 8][4], const float (&p)[N / 8][4], const T* b) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    const uint32_t af[4] = {pack<T>(p[2 * kk][0], p[2 * kk][1]), pack<T>(p[2 * kk][2], p[2 * kk][3]),
                            pack<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                            pack<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < D; n += 16) {
      uint32_t bf[4];
      load_b_kn<D>(bf, b, kk * 16, n);
      mma<T>(acc[n / 8], af, bf[0], bf[1]);
      mma<T>(acc[n / 8 + 1], af, bf[2], bf[3]);
    }
  }
}

// Element e of an accumulator tile: row g (+8 for e >= 2), column 2 * (lane % 4) + e % 2.
__device__ __forceinline__ int acc_row(int e) { return ((threadIdx.x & 31) >> 2) + (e >> 1) * 8; }
__device__ __forceinline__ int acc_col(int e) { return (threadIdx.x & 3) * 2 + (e & 1); }

// Stores rows [r0, r0 + 16) (those < n) of a 16 x D accumulator, times f[row half], to
// rows ld elements apart.
template <class T, int D>
__device__ __forceinline__ void store_rows(T* g, int64_t ld, const float (&acc)[D / 8][4], int r0, int n,
                                           const float (&f)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + acc_row(2 * h);
    if (r >= n) continue;
#pragma unroll
    for (int t = 0; t < D / 8; ++t)
      *reinterpret_cast<uint32_t*>(g + int64_t{r} * ld + t * 8 + acc_col(0)) =
          pack<T>(acc[t][2 * h] * f[h], acc[t][2 * h + 1] * f[h]);
  }
}

// Sum and maximum over the four lanes that hold one accumulator row.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Starts loading the next tiles of two operands into the other stage (where there are
// more), then waits for the current stage's and makes them visible to the block.
template <class T, int D, int N>
__device__ __forceinline__ void next_stage(T* a, const T* ga, int64_t lda, T* b, const T* gb, int64_t ldb, int st,
                                           int next_row, int n, bool more) {
  if (more) {
    load_tile<T, D, N>(a + (st ^ 1) * N * kStride<D>, ga, lda, next_row, n);
    load_tile<T, D, N>(b + (st ^ 1) * N * kStride<D>, gb, ldb, next_row, n);
    cp_commit();
    cp_wait<1>();
  } else {
    cp_wait<0>();
  }
  __syncthreads();
}

// Key tiles a block of queries [m0, m0 + kM) needs: all, or those up to its last query.
template <int N>
__device__ __forceinline__ int key_tiles(const FlashGeom& g, int m0) {
  const int all = ceil_div(g.tk, N);
  return g.causal ? min(all, ceil_div(m0 + kM, N)) : all;
}

template <class T, int D, int N, bool Drop>
__global__ void __launch_bounds__(kThreads) flash_fwd(const T* __restrict__ q, const T* __restrict__ k,
                                                      const T* __restrict__ v, T* __restrict__ o,
                                                      float* __restrict__ lse, FlashGeom g) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kM * kStride<D>;  // two stages each
  T* vs = ks + 2 * N * kStride<D>;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * kM;  // the longest causal rows first
  const int64_t bh = blockIdx.y;
  q += g.q.at(bh, g.h), o += g.o.at(bh, g.h), lse += bh * g.tq;
  k += g.k.at(bh, g.h), v += g.v.at(bh, g.h);
  const int r0 = (threadIdx.x >> 5) * 16;
  const int tiles = key_tiles<N>(g, m0);
  const FlashKeep keep(g);  // reads nothing without dropout
  load_tile<T, D, kM>(qs, q, g.q.row, m0, g.tq);
  load_tile<T, D, N>(ks, k, g.k.row, 0, g.tk);
  load_tile<T, D, N>(vs, v, g.v.row, 0, g.tk);
  cp_commit();
  float acc[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int j = 0; j < tiles; ++j) {
    const int st = j & 1;
    next_stage<T, D, N>(ks, k, g.k.row, vs, v, g.v.row, st, (j + 1) * N, g.tk, j + 1 < tiles);
    const T* kt = ks + st * N * kStride<D>;
    const T* vt = vs + st * N * kStride<D>;
    float s[N / 8][4] = {};
    mma_abt<T, D, N>(s, qs, r0, kt);
    const int n0 = j * N;
    const bool edge = n0 + N > g.tk || (g.causal && n0 + N - 1 > m0);
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int t = 0; t < N / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[t][e] * g.scale2;
        if (edge) {
          const int col = n0 + t * 8 + acc_col(e), row = m0 + r0 + acc_row(e);
          if (col >= g.tk || (g.causal && col > row)) x = -INFINITY;
        }
        s[t][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float base[2], corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = quad_max(mx[h]);
      base[h] = mx[h] == -INFINITY ? 0.f : mx[h];  // a row with no key yet stays at zero
      corr[h] = exp2f(m[h] - base[h]);
      m[h] = mx[h];
      l[h] *= corr[h];
    }
#pragma unroll
    for (int t = 0; t < N / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[t][e] = exp2f(s[t][e] - base[e >> 1]);
        l[e >> 1] += s[t][e];
        if constexpr (Drop) s[t][e] *= keep(g, bh, m0 + r0 + acc_row(e), n0 + t * 8 + acc_col(e));
      }
#pragma unroll
    for (int t = 0; t < D / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][e] *= corr[e >> 1];
    mma_pb<T, D, N>(acc, s, vt);
    __syncthreads();  // the next prefetch overwrites this stage
  }
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = quad_sum(l[h]);
    inv[h] = 1.f / l[h];
  }
  store_rows<T, D>(o, g.o.row, acc, m0 + r0, g.tq, inv);
  if ((threadIdx.x & 3) == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m0 + r0 + acc_row(2 * h);
      if (r < g.tq) lse[r] = (m[h] + log2f(l[h])) * kLn2;
    }
}

// rows[r] = sum over d of do[r, d] * o[r, d], one warp a row.
template <class T, int D>
__global__ void flash_rowdot(const T* __restrict__ dout, const T* __restrict__ o, float* __restrict__ rows,
                             int64_t n, FlashGeom g) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x >> 5);
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; r < n; r += warps) {
    const int64_t at = g.o.at(r / g.tq, g.h) + r % g.tq * g.o.row;
    float acc = 0.f;
#pragma unroll
    for (int e = lane; e < D; e += 32) acc = fmaf(to_float(dout[at + e]), to_float(o[at + e]), acc);
    acc = warp_sum(acc);
    if (lane == 0) rows[r] = acc;
  }
}

template <class T, int D, int N, bool Drop>
__global__ void __launch_bounds__(kThreads) flash_bwd_dq(const T* __restrict__ dout, const T* __restrict__ q,
                                                         const T* __restrict__ k, const T* __restrict__ v,
                                                         const float* __restrict__ lse,
                                                         const float* __restrict__ rows, T* __restrict__ dq,
                                                         FlashGeom g) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* dos = qs + kM * kStride<D>;
  T* ks = dos + kM * kStride<D>;  // two stages each
  T* vs = ks + 2 * N * kStride<D>;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * kM;
  const int64_t bh = blockIdx.y;
  q += g.q.at(bh, g.h), dout += g.o.at(bh, g.h), dq += g.q.at(bh, g.h), lse += bh * g.tq, rows += bh * g.tq;
  k += g.k.at(bh, g.h), v += g.v.at(bh, g.h);
  const int r0 = (threadIdx.x >> 5) * 16;
  const int tiles = key_tiles<N>(g, m0);
  load_tile<T, D, kM>(qs, q, g.q.row, m0, g.tq);
  load_tile<T, D, kM>(dos, dout, g.o.row, m0, g.tq);
  load_tile<T, D, N>(ks, k, g.k.row, 0, g.tk);
  load_tile<T, D, N>(vs, v, g.v.row, 0, g.tk);
  cp_commit();
  const FlashKeep keep(g);  // reads nothing without dropout
  float lse2[2], dr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = m0 + r0 + acc_row(2 * h);
    lse2[h] = r < g.tq ? lse[r] * kLog2e : 0.f;
    dr[h] = r < g.tq ? rows[r] : 0.f;
  }
  float acc[D / 8][4] = {};
  for (int j = 0; j < tiles; ++j) {
    const int st = j & 1;
    next_stage<T, D, N>(ks, k, g.k.row, vs, v, g.v.row, st, (j + 1) * N, g.tk, j + 1 < tiles);
    const T* kt = ks + st * N * kStride<D>;
    const T* vt = vs + st * N * kStride<D>;
    float s[N / 8][4] = {}, dp[N / 8][4] = {};
    mma_abt<T, D, N>(s, qs, r0, kt);
    mma_abt<T, D, N>(dp, dos, r0, vt);
    const int n0 = j * N;
    const bool edge = n0 + N > g.tk || (g.causal && n0 + N - 1 > m0);
#pragma unroll
    for (int t = 0; t < N / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2f(s[t][e] * g.scale2 - lse2[e >> 1]);
        const int col = n0 + t * 8 + acc_col(e), row = m0 + r0 + acc_row(e);
        if (edge && (col >= g.tk || (g.causal && col > row))) p = 0.f;
        float f = 1.f;
        if constexpr (Drop) f = keep(g, bh, row, col);
        s[t][e] = p * (dp[t][e] * f - dr[e >> 1]);  // dS, unscaled
      }
    mma_pb<T, D, N>(acc, s, kt);
    __syncthreads();
  }
  const float f[2] = {g.scale, g.scale};
  store_rows<T, D>(dq, g.q.row, acc, m0 + r0, g.tq, f);
}

template <class T, int D, int N, bool Drop>
__global__ void __launch_bounds__(kThreads) flash_bwd_dkv(const T* __restrict__ dout, const T* __restrict__ q,
                                                          const T* __restrict__ k, const T* __restrict__ v,
                                                          const float* __restrict__ lse,
                                                          const float* __restrict__ rows, T* __restrict__ dk,
                                                          T* __restrict__ dv, FlashGeom g) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kM * kStride<D>;
  T* qs = vs + kM * kStride<D>;  // two stages each
  T* dos = qs + 2 * N * kStride<D>;
  const int n0 = blockIdx.x * kM;  // causal: the first key blocks see the most queries
  const int64_t bh = blockIdx.y;
  q += g.q.at(bh, g.h), dout += g.o.at(bh, g.h), lse += bh * g.tq, rows += bh * g.tq;
  k += g.k.at(bh, g.h), v += g.v.at(bh, g.h), dk += g.k.at(bh, g.h), dv += g.v.at(bh, g.h);
  const int r0 = (threadIdx.x >> 5) * 16;
  const int first = g.causal ? n0 / N : 0, tiles = ceil_div(g.tq, N);
  load_tile<T, D, kM>(ks, k, g.k.row, n0, g.tk);
  load_tile<T, D, kM>(vs, v, g.v.row, n0, g.tk);
  load_tile<T, D, N>(qs, q, g.q.row, first * N, g.tq);
  load_tile<T, D, N>(dos, dout, g.o.row, first * N, g.tq);
  cp_commit();
  const FlashKeep keep(g);  // reads nothing without dropout
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  for (int i = first; i < tiles; ++i) {
    const int st = (i - first) & 1;
    next_stage<T, D, N>(qs, q, g.q.row, dos, dout, g.o.row, st, (i + 1) * N, g.tq, i + 1 < tiles);
    const T* qt = qs + st * N * kStride<D>;
    const T* dot = dos + st * N * kStride<D>;
    float s[N / 8][4] = {}, dp[N / 8][4] = {};
    mma_abt<T, D, N>(s, ks, r0, qt);
    mma_abt<T, D, N>(dp, vs, r0, dot);
    const int q0 = i * N;
    const bool edge = q0 + N > g.tq || (g.causal && q0 < n0 + kM - 1);
#pragma unroll
    for (int t = 0; t < N / 8; ++t)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = q0 + t * 8 + acc_col(c);  // a query
        const bool in = col < g.tq;
        const float l2 = in ? lse[col] * kLog2e : 0.f, r = in ? rows[col] : 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int e = 2 * h + c;
          const int key = n0 + r0 + acc_row(e);
          float p = exp2f(s[t][e] * g.scale2 - l2);
          if (edge && (!in || (g.causal && col < key))) p = 0.f;
          float f = 1.f;
          if constexpr (Drop) f = keep(g, bh, col, key);
          s[t][e] = p * f;
          dp[t][e] = p * (dp[t][e] * f - r);  // dS^T, unscaled
        }
      }
    mma_pb<T, D, N>(dv_acc, s, dot);
    mma_pb<T, D, N>(dk_acc, dp, qt);
    __syncthreads();
  }
  const float one[2] = {1.f, 1.f}, f[2] = {g.scale, g.scale};
  store_rows<T, D>(dk, g.k.row, dk_acc, n0 + r0, g.tk, f);
  store_rows<T, D>(dv, g.v.row, dv_acc, n0 + r0, g.tk, one);
}

// Tile widths: 64 rows of the other operand, but 32 where the dk/dv kernel's two D = 128
// accumulators would leave too few registers for 64.
template <int D>
constexpr int kFwdN = 64;
template <int D>
constexpr int kKvN = D > 64 ? 32 : 64;

// Calls f.template operator()<T, D, Drop>() for the storage types, head sizes and
// dropout served (the kernels without dropout keep their registers).
template <class F>
void dispatch_flash(DType t, int64_t d, bool drop, F&& f) {
  auto by_drop = [&]<class T, int D>() {
    if (drop) f.template operator()<T, D, true>();
    else f.template operator()<T, D, false>();
  };
  auto by_d = [&]<class T>() {
    if (d == 64) by_drop.template operator()<T, 64>();
    else by_drop.template operator()<T, 128>();
  };
  if (t == DType::bf16) by_d.template operator()<bf16_t>();
  else by_d.template operator()<f16_t>();
}

FlashGeom flash_geom(const AttentionGeom& g) {
  return {static_cast<int>(g.h), static_cast<int>(g.tq), static_cast<int>(g.tk), g.q, g.k, g.v, g.o, g.scale,
          g.scale * kLog2e, g.causal, g.dropout, g.stream, g.counters};
}

template <class K>
void allow_smem(K kernel, size_t bytes) {
  SEAM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace

std::string flash_unavailable(DType t, const AttentionGeom& g, const AttentionBuffers& buf) {
  if (t != DType::bf16 && t != DType::f16) return "the tiled kernels take bf16 or f16 data";
  if (g.d != g.dv || (g.d != 64 && g.d != 128)) return "the tiled kernels take D = Dv = 64 or 128";
  if (g.bh() > 65535 || g.tq >= (int64_t{1} << 30) || g.tk >= (int64_t{1} << 30))
    return "B * H beyond 65535 or a length beyond 2^30";
  for (const void* p : {buf.q, buf.k, buf.v, buf.o, buf.dout, static_cast<const void*>(buf.out_o),
                        static_cast<const void*>(buf.dq), static_cast<const void*>(buf.dk),
                        static_cast<const void*>(buf.dv)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return "an operand not 16-byte aligned";
  for (const Rows& r : {g.q, g.k, g.v, g.o})  // every row starts 16-byte aligned
    if (r.batch % 8 != 0 || r.head % 8 != 0 || r.row % 8 != 0) return "strides that are not multiples of 16 bytes";
  return {};
}

Launch flash_forward(DType t, const AttentionGeom& g, const AttentionBuffers& buf) {
  const FlashGeom fg = flash_geom(g);
  const dim3 grid(static_cast<unsigned>(ceil_div(fg.tq, kM)), static_cast<unsigned>(g.bh()));
  Launch launch;
  dispatch_flash(t, g.d, g.dropout > 0, [&]<class T, int D, bool Drop>() {
    constexpr int N = kFwdN<D>;
    const size_t smem = size_t{kM + 4 * N} * kStride<D> * sizeof(T);
    allow_smem(flash_fwd<T, D, N, Drop>, smem);
    launch = [=, q = static_cast<const T*>(buf.q), k = static_cast<const T*>(buf.k), v = static_cast<const T*>(buf.v),
              o = static_cast<T*>(buf.out_o), lse = static_cast<float*>(buf.out_lse)](cudaStream_t s) {
      flash_fwd<T, D, N, Drop><<<grid, kThreads, smem, s>>>(q, k, v, o, lse, fg);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

Launch flash_backward(DType t, const AttentionGeom& g, const AttentionBuffers& buf, float* rows) {
  const FlashGeom fg = flash_geom(g);
  const dim3 qgrid(static_cast<unsigned>(ceil_div(fg.tq, kM)), static_cast<unsigned>(g.bh()));
  const dim3 kgrid(static_cast<unsigned>(ceil_div(fg.tk, kM)), static_cast<unsigned>(g.bh()));
  const int64_t n = g.bh() * g.tq;
  const unsigned row_blocks = blocks_for((n + 7) / 8, 1);
  Launch launch;
  dispatch_flash(t, g.d, g.dropout > 0, [&]<class T, int D, bool Drop>() {
    constexpr int NQ = kFwdN<D>, NK = kKvN<D>;
    const size_t qsmem = size_t{2 * kM + 4 * NQ} * kStride<D> * sizeof(T);
    const size_t ksmem = size_t{2 * kM + 4 * NK} * kStride<D> * sizeof(T);
    allow_smem(flash_bwd_dq<T, D, NQ, Drop>, qsmem);
    allow_smem(flash_bwd_dkv<T, D, NK, Drop>, ksmem);
    launch = [=, dout = static_cast<const T*>(buf.dout), q = static_cast<const T*>(buf.q),
              k = static_cast<const T*>(buf.k), v = static_cast<const T*>(buf.v), o = static_cast<const T*>(buf.o),
              lse = static_cast<const float*>(buf.lse), dq = static_cast<T*>(buf.dq), dk = static_cast<T*>(buf.dk),
              dv = static_cast<T*>(buf.dv)](cudaStream_t s) {
      flash_rowdot<T, D><<<row_blocks, 256, 0, s>>>(dout, o, rows, n, fg);
      SEAM_CUDA_LAUNCH_CHECK();
      flash_bwd_dkv<T, D, NK, Drop><<<kgrid, kThreads, ksmem, s>>>(dout, q, k, v, lse, rows, dk, dv, fg);
      SEAM_CUDA_LAUNCH_CHECK();
      flash_bwd_dq<T, D, NQ, Drop><<<qgrid, kThreads, qsmem, s>>>(dout, q, k, v, lse, rows, dq, fg);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

}  // namespace seam::cuda
