// seam's weight gradient of a channels-last convolution (conv_wgrad.h says why and how).
//
// The GEMM: dw[o][j] = sum_p A[p][o] * B[p][j] with A = dy [P, K] (P = N * OH * OW output
// pixels) and B the implicit im2col of x, B[p][(r * S + s) * C + c] = x[n, oh * sh - ph +
// r * dh, ow * sw - pw + s * dw, c] (zero outside the image). A block owns a tile of
// 32 * WM rows (o) by 32 * WN columns (j) and one chunk of pixels; each warp a 32 x 32
// part of the tile as 2 x 2 WMMA fragments. Tiles of BK = 32 pixels are staged in shared
// memory as As[p][o] (the fragments' column-major A) and Bs[p][j] (row-major B), three
// stages deep: cp.async fills the next two while the warps multiply the current. Where K
// and dy's pointer allow (kVecA), dy moves in 16-byte copies, and x too where C and its
// pointer allow (kVecB); otherwise element by element (a 3-channel stem's x, say), which
// lands in the stage at once.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/conv_wgrad.h"
#include "backend/cuda/storage.cuh"

namespace seam::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kBK = 32;     // pixels per stage
constexpr int kStages = 3;  // shared-memory stages of the 16-byte copies' pipeline

// The WMMA shapes a storage type multiplies in: TF32 m16n16k8 for f32, m16n16k16 for 16-bit.
template <class T>
struct Frags {
  static constexpr int k = 16;
  using A = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
  using B = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
  using C = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
};
template <>
struct Frags<float> {
  static constexpr int k = 8;
  using A = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
  using B = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
  using C = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;
};

struct Params {
  const void* x;
  const void* dy;
  float* partial;  // [chunks][mp][np]
  int n, h, w, c, k, s, oh, ow;
  int sh, sw, ph, pw, dh, dw;
  int pixels, cols;  // P and R * S * C
  int chunk;         // pixels per chunk, a multiple of kBK
  int tiles_m;
  int mp, np;        // the partial tile grid's padded extent
};

// Row padding of a shared tile: 16 bytes, which keeps WMMA's 32-byte fragment alignment
// (every fragment starts at a multiple of 8 (TF32) or 16 (16-bit) rows) and staggers the
// rows over the banks.
template <class T>
constexpr int kPad = 16 / static_cast<int>(sizeof(T));

template <class T, int WM, int WN>
constexpr int smem_bytes() {
  return kStages * kBK * ((32 * WM + kPad<T>) + (32 * WN + kPad<T>)) * static_cast<int>(sizeof(T));
}

template <class T, int WM, int WN, bool kVecA, bool kVecB>
__global__ void __launch_bounds__(32 * WM * WN) wgrad_kernel(Params p) {
  constexpr int BM = 32 * WM, BN = 32 * WN, kThreads = 32 * WM * WN;
  constexpr int kWide = 16 / static_cast<int>(sizeof(T));
  constexpr int VA = kVecA ? kWide : 1, VB = kVecB ? kWide : 1;  // elements a copy moves
  constexpr int LDA = BM + kPad<T>, LDB = BN + kPad<T>;
  // A thread copies one column vector of each tile, in rows spaced kThreads / (width / V)
  // apart, so its column (and so its tap and channel) is fixed for the whole chunk.
  // (A's tile may have fewer vectors than the block has threads: the rest copy none.)
  // B's element-wise copies go the other way: a thread keeps one row (pixel) and walks
  // the columns, whose taps and channels a table in shared memory holds.
  constexpr int kStepA = kThreads / (BM / VA), kRowsA = (kBK + kStepA - 1) / kStepA;
  constexpr int kStepB = kThreads / (BN / VB), kRowsB = kVecB ? kBK / kStepB : 1;
  constexpr int kColsB = kVecB ? 1 : BN / (kThreads / kBK);
  static_assert(kThreads % (BM / VA) == 0, "a thread's A column must stay fixed");
  static_assert(!kVecB || (kThreads % (BN / VB) == 0 && kBK % kStepB == 0), "B's copies must tile it");
  static_assert(kThreads % kBK == 0 && BN % (kThreads / kBK) == 0, "B's element-wise copies must tile it");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* As = reinterpret_cast<T*>(smem_raw);  // [kStages][kBK][LDA]
  T* Bs = As + kStages * kBK * LDA;        // [kStages][kBK][LDB]
  __shared__ int col_tab[kVecB ? 1 : 3][kVecB ? 1 : BN];  // channel (-1: no column), tap row, tap column

  const int tid = static_cast<int>(threadIdx.x);
  const int m0 = static_cast<int>(blockIdx.x) % p.tiles_m * BM;
  const int n0 = static_cast<int>(blockIdx.x) / p.tiles_m * BN;
  const int first = static_cast<int>(blockIdx.y) * p.chunk;
  const int last = min(p.pixels, first + p.chunk);
  const int iters = (last - first + kBK - 1) / kBK;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);

  const int a_col = m0 + tid % (BM / VA) * VA, a_row = tid / (BM / VA);
  const bool a_ok = a_col < p.k;
  // kVecB: this thread's column; otherwise its row and first column.
  const int b_col = kVecB ? n0 + tid % (BN / VB) * VB : tid / kBK;
  const int b_row = kVecB ? tid / (BN / VB) : tid % kBK;
  auto tap_of = [&](int col, int& c, int& h, int& w) {  // column -> channel, tap offsets
    c = col % p.c;
    const int tap = col / p.c;
    h = tap / p.s * p.dh - p.ph;
    w = tap % p.s * p.dw - p.pw;
  };
  const bool b_ok = !kVecB || b_col < p.cols;
  int b_c = 0, b_h = 0, b_w = 0;
  if constexpr (kVecB) {
    if (b_ok) tap_of(b_col, b_c, b_h, b_w);
  } else {
    for (int j = tid; j < BN; j += kThreads) {
      int c = -1, h = 0, w = 0;
      if (n0 + j < p.cols) tap_of(n0 + j, c, h, w);
      col_tab[0][j] = c, col_tab[1][j] = h, col_tab[2][j] = w;
    }
    __syncthreads();
  }
  const int plane = p.oh * p.ow;

  // The output pixel of each of this thread's B rows in the next tile to load, as
  // (image, row, column): tiles load in order, so it steps kBK pixels a tile instead of
  // dividing anew (divisions made the kernel issue-bound).
  int r_img[kRowsB], r_oy[kRowsB], r_ox[kRowsB];
#pragma unroll
  for (int i = 0; i < kRowsB; ++i) {
    const int pix = first + b_row + i * kStepB, img = pix / plane, rest = pix - img * plane;
    r_img[i] = img;
    r_oy[i] = rest / p.ow;
    r_ox[i] = rest - r_oy[i] * p.ow;
  }

  auto load = [&](int stage, int base) {
    T* as = As + stage * kBK * LDA;
    T* bs = Bs + stage * kBK * LDB;
#pragma unroll
    for (int i = 0; i < kRowsA; ++i) {
      const int row = a_row + i * kStepA, pix = base + row;
      if (kBK % kStepA != 0 && row >= kBK) break;
      const bool ok = a_ok && pix < last;
      const T* src = dy + (ok ? static_cast<int64_t>(pix) * p.k + a_col : 0);
      T* dst = as + row * LDA + (a_col - m0);
      if constexpr (kVecA) cp16(dst, src, ok);
      else *dst = ok ? *src : from_float<T>(0.f);
    }
#pragma unroll
    for (int i = 0; i < kRowsB; ++i) {
      const int row = b_row + i * kStepB, pix = base + row;
      const int img = r_img[i], oy = r_oy[i], ox = r_ox[i];
      for (r_ox[i] += kBK; r_ox[i] >= p.ow; r_ox[i] -= p.ow)
        if (++r_oy[i] == p.oh) r_oy[i] = 0, ++r_img[i];
      const int ih0 = oy * p.sh, iw0 = ox * p.sw;
      const int64_t img_at = static_cast<int64_t>(img) * p.h;
      if constexpr (kVecB) {
        const int ih = ih0 + b_h, iw = iw0 + b_w;
        const bool ok = b_ok && pix < last && ih >= 0 && ih < p.h && iw >= 0 && iw < p.w;
        const T* src = x + (ok ? ((img_at + ih) * p.w + iw) * p.c + b_c : 0);
        cp16_l1(bs + row * LDB + (b_col - n0), src, ok);
      } else {
#pragma unroll 4
        for (int j = 0; j < kColsB; ++j) {
          const int col = b_col + j * (kThreads / kBK), c = col_tab[0][col];
          const int ih = ih0 + col_tab[1][col], iw = iw0 + col_tab[2][col];
          const bool ok = c >= 0 && pix < last && ih >= 0 && ih < p.h && iw >= 0 && iw < p.w;
          bs[row * LDB + col] = ok ? x[((img_at + ih) * p.w + iw) * p.c + c] : from_float<T>(0.f);
        }
      }
    }
  };

  using F = Frags<T>;
  typename F::C acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  const int warp = tid / 32, wm = warp % WM, wn = warp / WM;

  auto multiply = [&](int stage) {
    const T* as = As + stage * kBK * LDA + wm * 32;
    const T* bs = Bs + stage * kBK * LDB + wn * 32;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += F::k) {
      typename F::A a[2];
      typename F::B b[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(a[i], as + kk * LDA + i * 16, LDA);
        wmma::load_matrix_sync(b[i], bs + kk * LDB + i * 16, LDB);
        if constexpr (std::is_same_v<T, float>) {
          for (int e = 0; e < a[i].num_elements; ++e) a[i].x[e] = wmma::__float_to_tf32(a[i].x[e]);
          for (int e = 0; e < b[i].num_elements; ++e) b[i].x[e] = wmma::__float_to_tf32(b[i].x[e]);
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
  };

  if constexpr (kVecA || kVecB) {
    // kStages - 1 tiles in flight ahead of the one multiplied (element-wise copies land
    // at once, into a stage no warp reads until the barrier that follows them).
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
      if (t < iters) load(t, first + t * kBK);
      cp_commit();
    }
    for (int it = 0; it < iters; ++it) {
      cp_wait<kStages - 2>();  // tile `it` has landed
      __syncthreads();         // for every thread, and every warp is done with tile it - 1
      const int next = it + kStages - 1;
      if (next < iters) load(next % kStages, first + next * kBK);  // into tile it - 1's stage
      cp_commit();
      multiply(it % kStages);
    }
  } else {
    for (int it = 0; it < iters; ++it) {
      load(0, first + it * kBK);
      __syncthreads();
      multiply(0);
      __syncthreads();
    }
  }

  float* out = p.partial + static_cast<int64_t>(blockIdx.y) * p.mp * p.np;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(out + static_cast<int64_t>(m0 + wm * 32 + i * 16) * p.np + n0 + wn * 32 + j * 16,
                              acc[i][j], p.np, wmma::mem_row_major);
}

// dw[o][j] = the chunks' partials added in a fixed order, rounded once. A block takes
// `outs` consecutive outputs (a warp's loads coalesce over them) and cuts the chunks into
// blockDim.x / outs slices: slice t adds chunks t, t + slices, ... in order, then one
// thread adds the slices' sums in order. No atomics: the same bits every run.
template <class O>
__global__ void wgrad_sum_kernel(const float* __restrict__ partial, O* __restrict__ dw, int k, int cols, int mp,
                                 int np, int chunks, int outs) {
  __shared__ float sums[256];
  const int lane = static_cast<int>(threadIdx.x) % outs, slice = static_cast<int>(threadIdx.x) / outs;
  const int slices = static_cast<int>(blockDim.x) / outs;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * outs + lane, total = static_cast<int64_t>(k) * cols;
  const int64_t plane = static_cast<int64_t>(mp) * np;
  float sum = 0.f;
  if (i < total) {
    const int64_t o = i / cols;
    const float* src = partial + o * np + (i - o * cols);
#pragma unroll 4
    for (int c = slice; c < chunks; c += slices) sum += src[c * plane];
  }
  sums[threadIdx.x] = sum;
  __syncthreads();
  if (slice == 0 && i < total) {
    float t = 0.f;
    for (int s = 0; s < slices; ++s) t += sums[s * outs + lane];
    dw[i] = from_float<O>(t);
  }
}

template <class T, int WM, int WN, bool kVecA, bool kVecB>
void launch_wgrad(const Params& p, int chunks, cudaStream_t st) {
  constexpr int bytes = smem_bytes<T, WM, WN>();
  static const bool attr = [] {  // above 48 KB a kernel must ask for its shared memory
    SEAM_CUDA_CHECK(cudaFuncSetAttribute(wgrad_kernel<T, WM, WN, kVecA, kVecB>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)attr;
  const dim3 grid(static_cast<unsigned>(p.tiles_m * (p.np / (32 * WN))), static_cast<unsigned>(chunks));
  wgrad_kernel<T, WM, WN, kVecA, kVecB><<<grid, 32 * WM * WN, bytes, st>>>(p);
  SEAM_CUDA_LAUNCH_CHECK();
}

// vec_a: dy in 16-byte copies; vec_b: x too (only with vec_a: the other mix is rare).
template <class T>
void launch_config(const WgradConfig& cfg, bool vec_a, bool vec_b, const Params& p, cudaStream_t st) {
  auto pick = [&]<int WM, int WN>() {
    const int chunks = static_cast<int>(cfg.chunks);
    if (vec_a && vec_b) launch_wgrad<T, WM, WN, true, true>(p, chunks, st);
    else if (vec_a) launch_wgrad<T, WM, WN, true, false>(p, chunks, st);
    else launch_wgrad<T, WM, WN, false, false>(p, chunks, st);
  };
  if (cfg.wm == 1 && cfg.wn == 2) pick.template operator()<1, 2>();
  else if (cfg.wm == 1 && cfg.wn == 4) pick.template operator()<1, 4>();
  else if (cfg.wm == 1 && cfg.wn == 9) pick.template operator()<1, 9>();
  else if (cfg.wm == 2 && cfg.wn == 2) pick.template operator()<2, 2>();
  else if (cfg.wm == 2 && cfg.wn == 4) pick.template operator()<2, 4>();
  else if (cfg.wm == 2 && cfg.wn == 9) pick.template operator()<2, 9>();
  else fail("conv2d_grad_weight: no kernel for tiles of ", 32 * cfg.wm, " x ", 32 * cfg.wn);
}

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string WgradConfig::str() const {
  if (band) return "band, " + std::to_string(chunks) + " chunks";
  return "tiles " + std::to_string(32 * wm) + "x" + std::to_string(32 * wn) + ", " + std::to_string(chunks) +
         " chunks";
}

WgradPolicy wgrad_policy() {
  const char* v = std::getenv("SEAM_CONV_WGRAD");
  const std::string s = v ? v : "";
  if (s.empty() || s == "auto") return WgradPolicy::automatic;
  if (s == "own") return WgradPolicy::own;
  if (s == "band") return WgradPolicy::band;
  if (s == "cudnn") return WgradPolicy::cudnn;
  fail("SEAM_CONV_WGRAD is '", s, "': auto, own, band or cudnn");
}

bool wgrad_forced() {
  const WgradPolicy p = wgrad_policy();
  return p == WgradPolicy::own || p == WgradPolicy::band;
}

std::optional<Launch> prepare_own_wgrad(const StepArgs& a, const WgradGeometry& g, DType dt, DType out_dt,
                                        const void* x, const void* dy, void* dw, float* ms, size_t* workspace,
                                        std::string* chose, std::string* why) {
  if (wgrad_policy() == WgradPolicy::cudnn) {
    *why = "SEAM_CONV_WGRAD=cudnn";
    return std::nullopt;
  }
  if (dt == DType::f32 && !a.ctx.tf32) {
    *why = "f32 without TF32 (its kernel multiplies on tensor cores)";
    return std::nullopt;
  }
  const int64_t pixels = g.n * g.oh * g.ow, cols = g.r * g.s * g.c;
  const int64_t x_elems = g.n * g.h * g.w * g.c;
  if (pixels >= INT32_MAX / 2 || cols >= INT32_MAX / 2 || g.k * cols >= INT32_MAX || x_elems >= (int64_t{1} << 40)) {
    *why = "the layer is beyond its 32-bit pixel and column indices";
    return std::nullopt;
  }
  const int vec_elems = 16 / static_cast<int>(dtype_size(dt));
  auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const bool vec_a = g.k % vec_elems == 0 && aligned(dy);
  const bool vec_b = vec_a && g.c % vec_elems == 0 && aligned(x);

  Params p{};
  p.x = x;
  p.dy = dy;
  p.n = static_cast<int>(g.n), p.h = static_cast<int>(g.h), p.w = static_cast<int>(g.w);
  p.c = static_cast<int>(g.c), p.k = static_cast<int>(g.k), p.s = static_cast<int>(g.s);
  p.oh = static_cast<int>(g.oh), p.ow = static_cast<int>(g.ow);
  p.sh = static_cast<int>(g.stride[0]), p.sw = static_cast<int>(g.stride[1]);
  p.ph = static_cast<int>(g.pad[0]), p.pw = static_cast<int>(g.pad[1]);
  p.dh = static_cast<int>(g.dil[0]), p.dw = static_cast<int>(g.dil[1]);
  p.pixels = static_cast<int>(pixels);
  p.cols = static_cast<int>(cols);

  // Candidates: tile shapes that do not waste most of a tile on a small K or few columns,
  // and 1 to 16 blocks per multiprocessor: a block keeps two tiles' copies in flight while
  // it multiplies a third, and only many blocks together hide the memory's latency. The
  // widest tiles (288 columns: the nine taps of 32 channels) read the taps' shifted rows
  // of x within one block, through L1, where narrower ones read each tap's rows from L2
  // in blocks of their own. A chunk spans at least four tiles of pixels.
  std::vector<WgradConfig> cands;
  const int64_t sms = std::max(a.ctx.sm_count, 1), tiles_total = ceil_div64(pixels, kBK);
  for (int wm : {1, 2}) {
    if (wm == 2 && g.k < 64) continue;
    for (int wn : {2, 4, 9}) {
      if ((wn == 4 && cols < 128) || (wn == 9 && cols < 256)) continue;
      const int64_t tiles = ceil_div64(g.k, 32 * wm) * ceil_div64(cols, 32 * wn);
      int64_t last = -1;
      for (int64_t per_sm : {1, 2, 4, 8, 16}) {
        const int64_t want = std::clamp<int64_t>(ceil_div64(sms * per_sm, tiles), 1, std::max<int64_t>(tiles_total / 4, 1));
        const int64_t chunk = ceil_div64(tiles_total, want) * kBK;
        const int64_t chunks = ceil_div64(pixels, chunk);
        if (chunks == last) continue;
        last = chunks;
        cands.push_back({wm, wn, chunks});
      }
    }
  }
  // The band kernel where the layer keeps its size under stride 1 and its channels fill
  // whole tiles: first, so that SEAM_CONV_WGRAD=band's rule takes it.
  const int64_t taps = g.r * g.s, halo = (g.r - 1) * g.dil[0] * g.w + (g.s - 1) * g.dil[1];
  const bool band = vec_b && g.stride[0] == 1 && g.stride[1] == 1 && g.oh == g.h && g.ow == g.w && taps >= 2 &&
                    taps <= kBandMaxTaps && g.c % 32 == 0 && g.k % 32 == 0 &&
                    band_smem_bytes(dt, static_cast<int>(std::min<int64_t>(halo, INT32_MAX / 2))) <= kBandMaxSmem;
  if (band) {
    const int64_t tiles = (g.k / 32) * (g.c / 32), stages = ceil_div64(pixels, kBandBK);
    std::vector<WgradConfig> bands;
    int64_t last = -1;
    for (int64_t per_sm : {1, 2, 4}) {
      const int64_t want = std::clamp<int64_t>(ceil_div64(sms * per_sm, tiles), 1, std::max<int64_t>(stages / 2, 1));
      const int64_t chunks = ceil_div64(pixels, ceil_div64(stages, want) * kBandBK);
      if (chunks == last) continue;
      last = chunks;
      bands.push_back({1, 1, chunks, true});  // 32 x 32 tiles: its partials [chunks][k][cols], as params_of says
    }
    if (wgrad_policy() == WgradPolicy::band) cands.clear();
    cands.insert(cands.begin(), bands.begin(), bands.end());
  }
  const bool fixed = a.ctx.deterministic || wgrad_forced();  // a rule's pick, not a timing's
  if (fixed) cands.resize(1);

  auto params_of = [&](const WgradConfig& cfg, void* partial) {
    Params q = p;
    q.tiles_m = static_cast<int>(ceil_div64(g.k, 32 * cfg.wm));
    q.mp = q.tiles_m * 32 * cfg.wm;
    q.np = static_cast<int>(ceil_div64(cols, 32 * cfg.wn) * 32 * cfg.wn);
    q.chunk = static_cast<int>(ceil_div64(pixels, cfg.chunks * kBK) * kBK);
    q.partial = static_cast<float*>(partial);
    return q;
  };
  auto partial_bytes = [&](const WgradConfig& cfg) {
    const Params q = params_of(cfg, nullptr);
    return static_cast<size_t>(cfg.chunks) * q.mp * q.np * sizeof(float);
  };
  BandParams bp{};
  if (band) {
    bp.x = x, bp.dy = dy;
    bp.n = p.n, bp.h = p.h, bp.w = p.w, bp.c = p.c, bp.k = p.k, bp.r = static_cast<int>(g.r), bp.s = p.s;
    bp.ph = p.ph, bp.pw = p.pw, bp.dh = p.dh, bp.dw = p.dw;
    bp.halo = static_cast<int>(halo);
    bp.pixels = p.pixels;
    bp.np = p.cols;
  }
  const int64_t outputs = g.k * cols;
  const int sum_outs = ceil_div64(outputs, 32) >= sms ? 32 : 8;
  const auto sum_blocks = static_cast<unsigned>(ceil_div64(outputs, sum_outs));
  auto make = [&](const WgradConfig& cfg) -> Launch {
    Context* ctx = &a.ctx;
    BandParams b = bp;
    b.chunk = static_cast<int>(ceil_div64(pixels, cfg.chunks * kBandBK) * kBandBK);
    return [ctx, cfg, vec_a, vec_b, dt, out_dt, dw, sum_blocks, sum_outs, q = params_of(cfg, nullptr),
            b](cudaStream_t st) {
      Params r = q;
      r.partial = static_cast<float*>(ctx->workspace());
      if (cfg.band) {
        BandParams rb = b;
        rb.partial = r.partial;
        launch_wgrad_band(dt, rb, cfg.chunks, st);
      } else {
        dispatch_storage(dt, "conv2d_grad_weight", [&]<class T>() { launch_config<T>(cfg, vec_a, vec_b, r, st); });
      }
      dispatch_storage(out_dt, "conv2d_grad_weight", [&]<class O>() {
        wgrad_sum_kernel<O><<<sum_blocks, 256, 0, st>>>(r.partial, static_cast<O*>(dw), r.k, r.cols, r.mp, r.np,
                                                       static_cast<int>(cfg.chunks), sum_outs);
        SEAM_CUDA_LAUNCH_CHECK();
      });
    };
  };

  // Partials that outweigh the operands cost more traffic than the gather they spread.
  const size_t operand_bytes = static_cast<size_t>(pixels * g.k + x_elems) * dtype_size(dt);
  std::vector<WgradConfig> light;
  for (const WgradConfig& cfg : cands)
    if (partial_bytes(cfg) <= operand_bytes) light.push_back(cfg);
  if (!light.empty()) cands = std::move(light);
  else cands.resize(1);

  size_t best_bytes = 0;
  float best_ms = -1;
  WgradConfig best;
  std::string tried;
  for (const WgradConfig& cfg : cands) {
    a.ctx.need_workspace(partial_bytes(cfg));
    Launch l = make(cfg);
    const float t = fixed ? 0.f : time_in_graph(
                                      [&](cudaStream_t st) {
                                        l(st);
                                        return true;
                                      },
                                      a.ctx.stream);
    char line[96];
    std::snprintf(line, sizeof line, "%s%s %.1f us", tried.empty() ? "" : ", ", cfg.str().c_str(), t * 1e3);
    tried += line;
    if (t >= 0 && (best_ms < 0 || t < best_ms)) {
      best_ms = t;
      best = cfg;
      best_bytes = partial_bytes(cfg);
    }
  }
  if (best_ms < 0) {
    *why = "no configuration ran";
    return std::nullopt;
  }
  if (ms) *ms = best_ms;
  *workspace = best_bytes;
  const char* copies = vec_b ? "16-byte copies" : vec_a ? "16-byte copies of dy, scalar of x" : "scalar copies";
  *chose = "seam's kernel (" + std::string(copies) + "; " + tried + "): " + best.str();
  return make(best);
}

}  // namespace seam::cuda
