// seam's tiled attention kernels (attention.h): FlashAttention-2's algorithm on the tensor
// cores (mma.sync m16n8k16, bf16 or f16 operands, f32 accumulators), for head sizes 64 and
// 128 with Dv = D.
//
// A block is four warps; each warp owns 16 rows, or two tiles of 16 (kFwdMT, kKvMT), and
// walks tiles of N rows of the other operand, staged in shared memory by cp.async one tile
// ahead of use (zero-filled past the end), one barrier a tile. Scores stay in registers:
// the accumulator layout of two m16n8 tiles is the operand layout of one m16k16 tile, so P
// (and dS) feed the next product without leaving the thread. Only tiles that cross the
// mask's edge run the mask code. Blocks run in the order of their linear index, heads
// varying fastest (blockIdx.x), so that under a causal mask every head's longest blocks
// start first and the shortest fill the end.
//   forward: a block per 64 or 128 queries; S = Q K^T, the online softmax in base 2,
//            O += P V.
//   dq:      a block per 64 queries; S, P from lse, dP = dO V^T, dS = P (dP - rowsum),
//            dQ += dS K.
//   dk, dv:  a block per 64 or 128 keys; S^T = K Q^T, dV += P^T dO, dP^T = V dO^T,
//            dK += dS^T Q.
// Two backwards: the deterministic one (ModelOptions::deterministic) recomputes S in both
// kernels (seven products instead of five) so that no sum is shared between blocks, and
// repeats its bits; the default one has the key-block kernel also form dQ's share of its
// keys, dS K (dS^T through shared memory, read transposed), and add it to f32 sums with
// atomics: five products, FlashAttention-2's backward, then one pass scales the sums into
// dq. Dropout of the probabilities draws each (query, key) pair's Philox number as the CPU
// does: P's row sums stay undropped, the products take P times the factor, and dP is the
// product's gradient times it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <climits>

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
  static_assert(R * kChunks % kThreads == 0, "whole rounds of 16-byte copies");
#pragma unroll
  for (int i = 0; i < R * kChunks / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads, r = c / kChunks, col = (c % kChunks) * 8;
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

// ... or from a tile stored [k][m] (dS^T for dQ = dS K), transposed on the way.
template <int S, class T>
__device__ __forceinline__ void load_a_km(uint32_t (&a)[4], const T* s, int r0, int c0) {
  const int lane = threadIdx.x & 31;
  ldsm4_t(a, s + (c0 + (lane & 7) + ((lane >> 4) & 1) * 8) * kStride<S> + r0 + ((lane >> 3) & 1) * 8);
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

// acc (16 MT x N) += rows [r0, r0 + 16 MT) of tile a (D wide) times tile b (N x D)
// transposed: each B fragment serves the MT row tiles.
template <class T, int D, int N, int MT>
__device__ __forceinline__ void mma_abt(float (&acc)[MT][N / 8][4], const T* a, int r0, const T* b) {
#pragma unroll
  for (int kk = 0; kk < D; kk += 16) {
    uint32_t af[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) load_a<D>(af[m], a, r0 + 16 * m, kk);
#pragma unroll
    for (int n = 0; n < N; n += 16) {
      uint32_t bf[4];
      load_b_nk<D>(bf, b, n, kk);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma<T>(acc[m][n / 8], af[m], bf[0], bf[1]);
        mma<T>(acc[m][n / 8 + 1], af[m], bf[2], bf[3]);
      }
    }
  }
}

// The A operand of 16 rows and k in [2 kk 8, 2 kk 8 + 16) from an accumulator tile row
// (16 x N), rounded to T.
template <class T, int N>
__device__ __forceinline__ void acc_as_a(uint32_t (&a)[4], const float (&p)[N / 8][4], int kk) {
  a[0] = pack<T>(p[2 * kk][0], p[2 * kk][1]);
  a[1] = pack<T>(p[2 * kk][2], p[2 * kk][3]);
  a[2] = pack<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
  a[3] = pack<T>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

// acc (16 MT x D) += p (16 MT x N, accumulator layout, rounded to T) times tile b (N x D).
template <class T, int D, int N, int MT>
__device__ __forceinline__ void mma_pb(float (&acc)[MT][D / 8][4], const float (&p)[MT][N / 8][4], const T* b) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    uint32_t af[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc_as_a<T, N>(af[m], p[m], kk);
#pragma unroll
    for (int n = 0; n < D; n += 16) {
      uint32_t bf[4];
      load_b_kn<D>(bf, b, kk * 16, n);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma<T>(acc[m][n / 8], af[m], bf[0], bf[1]);
        mma<T>(acc[m][n / 8 + 1], af[m], bf[2], bf[3]);
      }
    }
  }
}

// A warp's one row tile of accumulators as the products' MT = 1 operand.
template <int C>
__device__ __forceinline__ float (&one_tile(float (&a)[C][4]))[1][C][4] {
  return reinterpret_cast<float(&)[1][C][4]>(a);
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

// 2^x by the special-function unit alone, results below 2^-126 flushed to zero: exp2f
// spends three more instructions an element on subnormal results, and a probability that
// small is zero beside its row's largest, which is 1. The element-wise work between the
// products is what limits these kernels' issue rate.
__device__ __forceinline__ float exp2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
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

// Scores of a 16-row accumulator tile (rows from row0, columns from col0) outside the
// mask set to -inf, so that their probabilities are 0. transposed: rows are keys and
// columns queries (the dk/dv kernel's S^T). Keys past the end are masked too: their rows
// of K and V are zero, but exp(-lse) could still overflow and make 0 * inf of dS K.
template <int N>
__device__ __forceinline__ void mask_scores(float (&s)[N / 8][4], const FlashGeom& g, int row0, int col0,
                                            bool transposed) {
#pragma unroll
  for (int t = 0; t < N / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + acc_row(e), col = col0 + t * 8 + acc_col(e);
      const int query = transposed ? col : row, key = transposed ? row : col;
      if (query >= (transposed ? g.tq : INT_MAX) || key >= g.tk || (g.causal && key > query)) s[t][e] = -INFINITY;
    }
}

// Waits for the current stage's tiles and makes them visible to the block; then, the
// block having also finished with the other stage (read one tile earlier), starts loading
// the next tiles of two operands (and what also(stage) adds) into it where there are
// more. One barrier a tile.
template <class T, int D, int N, class Also = void (*)(int)>
__device__ __forceinline__ void next_stage(T* a, const T* ga, int64_t lda, T* b, const T* gb, int64_t ldb, int st,
                                           int next_row, int n, bool more, Also also = [](int) {}) {
  cp_wait<0>();
  __syncthreads();
  if (more) {
    load_tile<T, D, N>(a + (st ^ 1) * N * kStride<D>, ga, lda, next_row, n);
    load_tile<T, D, N>(b + (st ^ 1) * N * kStride<D>, gb, ldb, next_row, n);
    also(st ^ 1);
    cp_commit();
  }
}

// Key tiles a block of queries [m0, m0 + M) needs: all, or those up to its last query.
template <int N, int M = kM>
__device__ __forceinline__ int key_tiles(const FlashGeom& g, int m0) {
  const int all = ceil_div(g.tk, N);
  return g.causal ? min(all, ceil_div(m0 + M, N)) : all;
}

// A warp owns MT tiles of 16 query rows: each K and V fragment it loads serves all of them.
template <class T, int D, int N, int MT, bool Drop>
__global__ void __launch_bounds__(kThreads) flash_fwd(const T* __restrict__ q, const T* __restrict__ k,
                                                      const T* __restrict__ v, T* __restrict__ o,
                                                      float* __restrict__ lse, FlashGeom g) {
  constexpr int M = kM * MT;  // rows a block owns
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + M * kStride<D>;  // two stages each
  T* vs = ks + 2 * N * kStride<D>;
  const int m0 = (gridDim.y - 1 - blockIdx.y) * M;  // the longest causal rows first
  const int64_t bh = blockIdx.x;
  q += g.q.at(bh, g.h), o += g.o.at(bh, g.h), lse += bh * g.tq;
  k += g.k.at(bh, g.h), v += g.v.at(bh, g.h);
  const int r0 = (threadIdx.x >> 5) * 16 * MT;
  const int tiles = key_tiles<N, M>(g, m0);
  const FlashKeep keep(g);  // reads nothing without dropout
  load_tile<T, D, M>(qs, q, g.q.row, m0, g.tq);
  load_tile<T, D, N>(ks, k, g.k.row, 0, g.tk);
  load_tile<T, D, N>(vs, v, g.v.row, 0, g.tk);
  cp_commit();
  float acc[MT][D / 8][4] = {};
  float m[MT][2], l[MT][2] = {};
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY;
  for (int j = 0; j < tiles; ++j) {
    const int st = j & 1;
    next_stage<T, D, N>(ks, k, g.k.row, vs, v, g.v.row, st, (j + 1) * N, g.tk, j + 1 < tiles);
    const T* kt = ks + st * N * kStride<D>;
    const T* vt = vs + st * N * kStride<D>;
    float s[MT][N / 8][4] = {};
    mma_abt<T, D, N, MT>(s, qs, r0, kt);
    const int n0 = j * N;
    const bool edge = n0 + N > g.tk || (g.causal && n0 + N - 1 > m0);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int row0 = m0 + r0 + 16 * mt;
      // The maxima of the raw scores (the scale is positive), then one fused multiply-add
      // an element scales and shifts them; m is kept scaled, in base 2.
      if (edge) mask_scores<N>(s[mt], g, row0, n0, false);
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int t = 0; t < N / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][t][e]);
      float base[2], corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float now = fmaxf(m[mt][h], quad_max(mx[h]) * g.scale2);
        base[h] = now == -INFINITY ? 0.f : now;  // a row with no key yet stays at zero
        corr[h] = exp2_ftz(m[mt][h] - base[h]);
        m[mt][h] = now;
        l[mt][h] *= corr[h];
      }
#pragma unroll
      for (int t = 0; t < N / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p = exp2_ftz(fmaf(s[mt][t][e], g.scale2, -base[e >> 1]));
          l[mt][e >> 1] += p;
          if constexpr (Drop) p *= keep(g, bh, row0 + acc_row(e), n0 + t * 8 + acc_col(e));
          s[mt][t][e] = p;
        }
#pragma unroll
      for (int t = 0; t < D / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][t][e] *= corr[e >> 1];
    }
    mma_pb<T, D, N, MT>(acc, s, vt);
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int row0 = m0 + r0 + 16 * mt;
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[mt][h] = quad_sum(l[mt][h]);
      inv[h] = 1.f / l[mt][h];
    }
    store_rows<T, D>(o, g.o.row, acc[mt], row0, g.tq, inv);
    if ((threadIdx.x & 3) == 0)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + acc_row(2 * h);
        if (r < g.tq) lse[r] = (m[mt][h] + log2f(l[mt][h])) * kLn2;
      }
  }
}

// Two 16-bit values of one register as floats.
template <class T>
__device__ __forceinline__ float2 unpack(uint32_t v) {
  if constexpr (std::is_same_v<T, bf16_t>) return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
  else return __half22float2(*reinterpret_cast<__half2*>(&v));
}

// The element kernels around the backward: a block of 256 threads per chunk of rows of
// one head (blockIdx.y = b * H + h), 8 elements (16 bytes) a thread, so D / 8 threads a
// row, and the row's base computed once a thread.
constexpr int kRowThreads = 256;

// rows[r] = sum over d of do[r, d] * o[r, d]; and row r of dq's f32 sums zeroed where the
// backward adds into them.
template <class T, int D>
__global__ void __launch_bounds__(kRowThreads) flash_rowdot(const T* __restrict__ dout, const T* __restrict__ o,
                                                            float* __restrict__ rows, float* __restrict__ dq_sums,
                                                            FlashGeom g) {
  constexpr int kPer = D / 8;  // threads a row, of one warp
  const int64_t bh = blockIdx.y;
  const int r = static_cast<int>((int64_t{blockIdx.x} * kRowThreads + threadIdx.x) / kPer);
  const int col = static_cast<int>(threadIdx.x % kPer) * 8;
  const bool valid = r < g.tq;  // whole rows are invalid together: the shuffles below stay in step
  float acc = 0.f;
  if (valid) {
    const int64_t at = g.o.at(bh, g.h) + int64_t{r} * g.o.row + col;
    const uint4 a = *reinterpret_cast<const uint4*>(dout + at), b = *reinterpret_cast<const uint4*>(o + at);
    const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 x = unpack<T>(av[e]), y = unpack<T>(bv[e]);
      acc = fmaf(x.x, y.x, fmaf(x.y, y.y, acc));
    }
  }
#pragma unroll
  for (int m = kPer / 2; m > 0; m /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (!valid) return;
  const int64_t row = bh * g.tq + r;
  if (col == 0) rows[row] = acc;
  if (dq_sums) {
    float4* z = reinterpret_cast<float4*>(dq_sums + row * D + col);
    z[0] = z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// dq = scale * its f32 sums ([B * H, Tq, D], contiguous), through q's strides.
template <class T, int D>
__global__ void __launch_bounds__(kRowThreads) flash_dq_store(const float* __restrict__ dq_sums, T* __restrict__ dq,
                                                              FlashGeom g) {
  constexpr int kPer = D / 8;
  const int64_t bh = blockIdx.y;
  const int r = static_cast<int>((int64_t{blockIdx.x} * kRowThreads + threadIdx.x) / kPer);
  const int col = static_cast<int>(threadIdx.x % kPer) * 8;
  if (r >= g.tq) return;
  const float4* v = reinterpret_cast<const float4*>(dq_sums + (bh * g.tq + r) * D + col);
  const float4 a = v[0], b = v[1];
  const float f = g.scale;
  *reinterpret_cast<uint4*>(dq + g.q.at(bh, g.h) + int64_t{r} * g.q.row + col) =
      make_uint4(pack<T>(a.x * f, a.y * f), pack<T>(a.z * f, a.w * f), pack<T>(b.x * f, b.y * f),
                 pack<T>(b.z * f, b.w * f));
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
  const int m0 = (gridDim.y - 1 - blockIdx.y) * kM;
  const int64_t bh = blockIdx.x;
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
    mma_abt<T, D, N, 1>(one_tile(s), qs, r0, kt);
    mma_abt<T, D, N, 1>(one_tile(dp), dos, r0, vt);
    const int n0 = j * N;
    if (n0 + N > g.tk || (g.causal && n0 + N - 1 > m0)) mask_scores<N>(s, g, m0 + r0, n0, false);
#pragma unroll
    for (int t = 0; t < N / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2_ftz(fmaf(s[t][e], g.scale2, -lse2[e >> 1]));
        const int col = n0 + t * 8 + acc_col(e), row = m0 + r0 + acc_row(e);
        float f = 1.f;
        if constexpr (Drop) f = keep(g, bh, row, col);
        s[t][e] = p * (dp[t][e] * f - dr[e >> 1]);  // dS, unscaled
      }
    mma_pb<T, D, N, 1>(one_tile(acc), one_tile(s), kt);
  }
  const float f[2] = {g.scale, g.scale};
  store_rows<T, D>(dq, g.q.row, acc, m0 + r0, g.tq, f);
}

// dq_sums (rows of N queries from q0, D columns) += dS K over the block's keys: dS^T
// [kM][N] and K [kM][D] in shared memory. The warps split the rows in 16s and D in what
// remains; each adds its 16 x D / (kWarps * 16 / N) share with f32 pair atomics.
template <class T, int D, int N, int KB>
__device__ __forceinline__ void add_dq_share(float* dq_sums, const T* dst, const T* ks, int q0, int tq) {
  constexpr int kRowGroups = N / 16, kCols = D * kRowGroups / kWarps;
  static_assert(kWarps % kRowGroups == 0 && kCols % 16 == 0, "a warp's share of dQ is whole m16n16 tiles");
  const int w = threadIdx.x >> 5, r0 = (w % kRowGroups) * 16, c0 = (w / kRowGroups) * kCols;
  float acc[kCols / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < KB; kk += 16) {
    uint32_t af[4];
    load_a_km<N>(af, dst, r0, kk);
#pragma unroll
    for (int n = 0; n < kCols; n += 16) {
      uint32_t bf[4];
      load_b_kn<D>(bf, ks, kk, c0 + n);
      mma<T>(acc[n / 8], af, bf[0], bf[1]);
      mma<T>(acc[n / 8 + 1], af, bf[2], bf[3]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = q0 + r0 + acc_row(2 * h);
    if (r >= tq) continue;
#pragma unroll
    for (int t = 0; t < kCols / 8; ++t)
      atomicAdd(reinterpret_cast<float2*>(dq_sums + int64_t{r} * D + c0 + t * 8 + acc_col(0)),
                make_float2(acc[t][2 * h], acc[t][2 * h + 1]));
  }
}

// AtomicQ: also dq's f32 sums (flash_rowdot zeroed them), [B * H, Tq, D]; else dq_sums
// is unused and flash_bwd_dq forms dq.
template <class T, int D, int N, int MT, bool Drop, bool AtomicQ>
__global__ void __launch_bounds__(kThreads) flash_bwd_dkv(const T* __restrict__ dout, const T* __restrict__ q,
                                                          const T* __restrict__ k, const T* __restrict__ v,
                                                          const float* __restrict__ lse,
                                                          const float* __restrict__ rows, T* __restrict__ dk,
                                                          T* __restrict__ dv, float* __restrict__ dq_sums,
                                                          FlashGeom g) {
  constexpr int KB = kM * MT;  // keys a block owns, 16 MT a warp
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + KB * kStride<D>;
  T* qs = vs + KB * kStride<D>;  // two stages each
  T* dos = qs + 2 * N * kStride<D>;
  T* dst = dos + 2 * N * kStride<D>;  // AtomicQ: dS^T, [KB][N], two stages
  float* stats = reinterpret_cast<float*>(dst + (AtomicQ ? 2 * KB * kStride<N> : 0));  // lse, rows: two stages
  const int n0 = blockIdx.y * KB;  // causal: the first key blocks see the most queries
  const int64_t bh = blockIdx.x;
  q += g.q.at(bh, g.h), dout += g.o.at(bh, g.h), lse += bh * g.tq, rows += bh * g.tq;
  if constexpr (AtomicQ) dq_sums += bh * g.tq * D;
  k += g.k.at(bh, g.h), v += g.v.at(bh, g.h), dk += g.k.at(bh, g.h), dv += g.v.at(bh, g.h);
  const int r0 = (threadIdx.x >> 5) * 16 * MT;
  const int first = g.causal ? n0 / N : 0, tiles = ceil_div(g.tq, N);
  // The query tile's lse and rowsum(do * o) staged beside it, an element a copy (a head's
  // rows of them need not be 16-byte aligned); zeros past the end.
  auto load_stats = [&](int st, int row0) {
#pragma unroll
    for (int c = threadIdx.x; c < 2 * N; c += kThreads) {
      const int r = c % N;
      const float* from = c < N ? lse : rows;
      const bool valid = row0 + r < g.tq;
      cp4(stats + st * 2 * N + c, valid ? from + row0 + r : from, valid);
    }
  };
  load_tile<T, D, KB>(ks, k, g.k.row, n0, g.tk);
  load_tile<T, D, KB>(vs, v, g.v.row, n0, g.tk);
  load_tile<T, D, N>(qs, q, g.q.row, first * N, g.tq);
  load_tile<T, D, N>(dos, dout, g.o.row, first * N, g.tq);
  load_stats(0, first * N);
  cp_commit();
  const FlashKeep keep(g);  // reads nothing without dropout
  float dk_acc[MT][D / 8][4] = {}, dv_acc[MT][D / 8][4] = {};
  for (int i = first; i < tiles; ++i) {
    const int st = (i - first) & 1;
    next_stage<T, D, N>(qs, q, g.q.row, dos, dout, g.o.row, st, (i + 1) * N, g.tq, i + 1 < tiles,
                        [&](int next) { load_stats(next, (i + 1) * N); });
    // The previous tile's share of dq, now that its dS^T is visible to the block: no
    // barrier of its own, and its atomics drain while this tile's products run.
    if constexpr (AtomicQ)
      if (i > first) add_dq_share<T, D, N, KB>(dq_sums, dst + (st ^ 1) * KB * kStride<N>, ks, (i - 1) * N, g.tq);
    const T* qt = qs + st * N * kStride<D>;
    const T* dot = dos + st * N * kStride<D>;
    const float* lse_t = stats + st * 2 * N;
    const float* rows_t = lse_t + N;
    float s[MT][N / 8][4] = {}, dp[MT][N / 8][4] = {};
    const int q0 = i * N;
    // Under a causal mask a warp whose keys all follow the tile's queries has P = dS = 0.
    if (!(g.causal && q0 + N <= n0 + r0)) {
      mma_abt<T, D, N, MT>(s, ks, r0, qt);
      mma_abt<T, D, N, MT>(dp, vs, r0, dot);
      if (q0 + N > g.tq || (g.causal && q0 < n0 + r0 + 16 * MT - 1) || n0 + r0 + 16 * MT > g.tk)
#pragma unroll
        for (int m = 0; m < MT; ++m) mask_scores<N>(s[m], g, n0 + r0 + 16 * m, q0, true);
#pragma unroll
      for (int t = 0; t < N / 8; ++t)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = q0 + t * 8 + acc_col(c);  // a query
          const float l2 = lse_t[t * 8 + acc_col(c)] * kLog2e, r = rows_t[t * 8 + acc_col(c)];
#pragma unroll
          for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int e = 2 * h + c;
              const int key = n0 + r0 + 16 * m + acc_row(e);
              const float p = exp2_ftz(fmaf(s[m][t][e], g.scale2, -l2));
              float f = 1.f;
              if constexpr (Drop) f = keep(g, bh, col, key);
              s[m][t][e] = p * f;
              dp[m][t][e] = p * (dp[m][t][e] * f - r);  // dS^T, unscaled
            }
        }
      mma_pb<T, D, N, MT>(dv_acc, s, dot);
      mma_pb<T, D, N, MT>(dk_acc, dp, qt);
    }
    if constexpr (AtomicQ) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int t = 0; t < N / 8; ++t)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            *reinterpret_cast<uint32_t*>(dst + (st * KB + r0 + 16 * m + acc_row(2 * h)) * kStride<N> + t * 8 +
                                         acc_col(0)) = pack<T>(dp[m][t][2 * h], dp[m][t][2 * h + 1]);
    }
  }
  if (AtomicQ && tiles > first) {
    __syncthreads();
    add_dq_share<T, D, N, KB>(dq_sums, dst + ((tiles - 1 - first) & 1) * KB * kStride<N>, ks, (tiles - 1) * N, g.tq);
  }
  const float one[2] = {1.f, 1.f}, f[2] = {g.scale, g.scale};
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    store_rows<T, D>(dk, g.k.row, dk_acc[m], n0 + r0 + 16 * m, g.tk, f);
    store_rows<T, D>(dv, g.v.row, dv_acc[m], n0 + r0 + 16 * m, g.tk, one);
  }
}

// Tile widths and row tiles a warp owns. The forward and dq kernels take tiles of 64
// keys; a forward warp owns two row tiles at D = 64 without dropout (a block of 128
// queries), one at 128, whose accumulators would leave too few registers for two, and
// with dropout, whose mask arithmetic would spill.
template <int D>
constexpr int kFwdN = 64;
template <int D, bool Drop>
constexpr int kFwdMT = D > 64 || Drop ? 1 : 2;
// The dk/dv kernel at D = 64 without dropout: two row tiles a warp (blocks of 128 keys)
// over tiles of 32 queries. Against one row tile over 64 queries it halves the atomic dq
// traffic and the query tiles each key block reads, and each K, V, Q and dO fragment
// serves two products. Elsewhere one row tile: 64 queries at D = 64 with dropout, 32
// where the two D = 128 accumulators would leave too few registers for 64.
template <int D, bool Drop>
constexpr int kKvMT = D == 64 && !Drop ? 2 : 1;
template <int D, bool Drop>
constexpr int kKvN = D == 64 && Drop ? 64 : 32;

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
  if (g.bh() > 65535 || g.tq > 65535 * kM || g.tk > 65535 * kM)
    return "B * H beyond 65535 or a length beyond 65535 blocks of " + std::to_string(kM);
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
  Launch launch;
  dispatch_flash(t, g.d, g.dropout > 0, [&]<class T, int D, bool Drop>() {
    constexpr int N = kFwdN<D>, MT = kFwdMT<D, Drop>;
    const dim3 grid(static_cast<unsigned>(g.bh()), static_cast<unsigned>(ceil_div(fg.tq, kM * MT)));
    const size_t smem = size_t{kM * MT + 4 * N} * kStride<D> * sizeof(T);
    allow_smem(flash_fwd<T, D, N, MT, Drop>, smem);
    launch = [=, q = static_cast<const T*>(buf.q), k = static_cast<const T*>(buf.k), v = static_cast<const T*>(buf.v),
              o = static_cast<T*>(buf.out_o), lse = static_cast<float*>(buf.out_lse)](cudaStream_t s) {
      flash_fwd<T, D, N, MT, Drop><<<grid, kThreads, smem, s>>>(q, k, v, o, lse, fg);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

size_t flash_dq_sums_bytes(const AttentionGeom& g) {
  return static_cast<size_t>(g.bh() * g.tq * g.d) * sizeof(float);
}

Launch flash_backward(DType t, const AttentionGeom& g, const AttentionBuffers& buf, float* rows,
                      const Context* sums_in) {
  const FlashGeom fg = flash_geom(g);
  const dim3 qgrid(static_cast<unsigned>(g.bh()), static_cast<unsigned>(ceil_div(fg.tq, kM)));
  const dim3 row_grid(static_cast<unsigned>((g.tq * (g.d / 8) + kRowThreads - 1) / kRowThreads),
                      static_cast<unsigned>(g.bh()));
  Launch launch;
  dispatch_flash(t, g.d, g.dropout > 0, [&]<class T, int D, bool Drop>() {
    auto in = [&](const void* p) { return static_cast<const T*>(p); };
    auto out = [&](void* p) { return static_cast<T*>(p); };
    constexpr int NQ = kFwdN<D>, MT = kKvMT<D, Drop>, NK = kKvN<D, Drop>, KB = kM * MT;
    const size_t qsmem = size_t{2 * kM + 4 * NQ} * kStride<D> * sizeof(T);
    const size_t ksmem = size_t{2 * KB + 4 * NK} * kStride<D> * sizeof(T) + 4 * NK * sizeof(float);
    const dim3 kgrid(static_cast<unsigned>(g.bh()), static_cast<unsigned>(ceil_div(fg.tk, KB)));
    if (sums_in) {
      const size_t smem = ksmem + size_t{2 * KB} * kStride<NK> * sizeof(T);  // and dS^T
      auto* kernel = flash_bwd_dkv<T, D, NK, MT, Drop, true>;
      allow_smem(kernel, smem);
      launch = [=, dout = in(buf.dout), q = in(buf.q), k = in(buf.k), v = in(buf.v), o = in(buf.o),
                lse = static_cast<const float*>(buf.lse), dq = out(buf.dq), dk = out(buf.dk),
                dv = out(buf.dv)](cudaStream_t s) {
        auto* sums = static_cast<float*>(sums_in->workspace());
        flash_rowdot<T, D><<<row_grid, kRowThreads, 0, s>>>(dout, o, rows, sums, fg);
        SEAM_CUDA_LAUNCH_CHECK();
        kernel<<<kgrid, kThreads, smem, s>>>(dout, q, k, v, lse, rows, dk, dv, sums, fg);
        SEAM_CUDA_LAUNCH_CHECK();
        flash_dq_store<T, D><<<row_grid, kRowThreads, 0, s>>>(sums, dq, fg);
        SEAM_CUDA_LAUNCH_CHECK();
      };
      return;
    }
    auto* kv_kernel = flash_bwd_dkv<T, D, NK, MT, Drop, false>;
    auto* q_kernel = flash_bwd_dq<T, D, NQ, Drop>;
    allow_smem(q_kernel, qsmem);
    allow_smem(kv_kernel, ksmem);
    launch = [=, dout = in(buf.dout), q = in(buf.q), k = in(buf.k), v = in(buf.v), o = in(buf.o),
              lse = static_cast<const float*>(buf.lse), dq = out(buf.dq), dk = out(buf.dk),
              dv = out(buf.dv)](cudaStream_t s) {
      flash_rowdot<T, D><<<row_grid, kRowThreads, 0, s>>>(dout, o, rows, nullptr, fg);
      SEAM_CUDA_LAUNCH_CHECK();
      kv_kernel<<<kgrid, kThreads, ksmem, s>>>(dout, q, k, v, lse, rows, dk, dv, nullptr, fg);
      SEAM_CUDA_LAUNCH_CHECK();
      q_kernel<<<qgrid, kThreads, qsmem, s>>>(dout, q, k, v, lse, rows, dq, fg);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

}  // namespace seam::cuda
