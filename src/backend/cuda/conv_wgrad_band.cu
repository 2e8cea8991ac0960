// The band kernel of seam's weight gradient (conv_wgrad.h): for stride-1 convolutions
// whose output keeps the input's size (a ResNet's 3x3 layers), where the gather kernel
// reads every tap's shifted copy of x from L2 again.
//
// With stride 1 and OH = H, OW = W, output pixel p (flattened over N, H, W) reads under tap
// (r, s) the x pixel p + off(r, s), off = (r * dh - ph) * W + (s * dw - pw): one offset for
// all pixels (valid where the tap lands inside p's image; zero padding elsewhere). So the
// BK pixels of a stage need x pixels [p0 + off(0, 0), p0 + BK + off(R-1, S-1)): a band of
// BK + halo rows, halo = (R - 1) * dh * W + (S - 1) * dw, which the block copies once; tap
// (r, s) reads it from row r * dh * W + s * dw on. A block owns 32 output channels (o) by
// 32 input channels (c) of every tap, one warp per tap, and a chunk of pixels; each warp
// multiplies dy's tile (A[o][p]) by its tap's rows of the band (B[p][c]) with mma.sync,
// masking B where its tap falls off the image (a bit per tap and pixel, computed as the
// stage is copied). x's rows cross L2 about (BK + halo) / BK times instead of taps times.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/conv_wgrad.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/storage.cuh"

namespace seam::cuda {

namespace {

constexpr int kStages = 3;
// Row stride of the shared tiles in elements: 40 puts the fragments' loads (rows t or 2t,
// columns g) on distinct banks, and keeps rows 16-byte aligned for cp.async.
constexpr int kLd = 40;

template <class T>
constexpr int kStep = std::is_same_v<T, float> ? 8 : 16;  // pixels per mma

template <class T>
__device__ __forceinline__ uint16_t bits16(T v) {
  return *reinterpret_cast<const uint16_t*>(&v);
}

template <class T>
__global__ void __launch_bounds__(32 * kBandMaxTaps) wgrad_band_kernel(BandParams p) {
  constexpr int BK = kBandBK, V = 16 / static_cast<int>(sizeof(T)), kVecs = 32 / V;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int rows = BK + p.halo;
  const int stage_elems = (BK + rows) * kLd;
  T* tiles = reinterpret_cast<T*>(smem_raw);  // per stage: dy [BK][kLd], then the band [rows][kLd]
  uint32_t* masks = reinterpret_cast<uint32_t*>(tiles + kStages * stage_elems);  // [kStages][BK]

  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const int tiles_m = p.k / 32;
  const int o0 = static_cast<int>(blockIdx.x) % tiles_m * 32, c0 = static_cast<int>(blockIdx.x) / tiles_m * 32;
  const int first = static_cast<int>(blockIdx.y) * p.chunk;
  const int last = min(p.pixels, first + p.chunk);
  const int iters = (last - first + BK - 1) / BK;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  const int plane = p.h * p.w;
  const int64_t x_pixels = static_cast<int64_t>(p.n) * plane;
  const int off0 = p.ph * p.w + p.pw;  // x pixel of the band's row 0 is p0 - off0

  auto load = [&](int stage, int base) {
    T* as = tiles + stage * stage_elems;
    T* bs = as + BK * kLd;
    for (int i = tid; i < BK * kVecs; i += threads) {
      const int row = i / kVecs, v = i % kVecs, pix = base + row;
      const bool ok = pix < last;
      cp16(as + row * kLd + v * V, dy + (ok ? static_cast<int64_t>(pix) * p.k + o0 + v * V : 0), ok);
    }
    for (int i = tid; i < rows * kVecs; i += threads) {
      const int row = i / kVecs, v = i % kVecs;
      const int64_t q = static_cast<int64_t>(base) - off0 + row;
      const bool ok = q >= 0 && q < x_pixels;
      cp16(bs + row * kLd + v * V, x + (ok ? q * p.c + c0 + v * V : 0), ok);
    }
    uint32_t* mk = masks + stage * BK;
    for (int i = tid; i < BK; i += threads) {
      const int pix = base + i;
      uint32_t bits = 0;
      if (pix < last) {
        const int rest = pix % plane, oy = rest / p.w, ox = rest - oy * p.w;
        for (int r = 0; r < p.r; ++r) {
          const int ih = oy + r * p.dh - p.ph;
          if (ih < 0 || ih >= p.h) continue;
          for (int s = 0; s < p.s; ++s) {
            const int iw = ox + s * p.dw - p.pw;
            if (iw >= 0 && iw < p.w) bits |= 1u << (r * p.s + s);
          }
        }
      }
      mk[i] = bits;
    }
  };

  const int lane = tid % 32, tap = tid / 32, g = lane / 4, t = lane % 4;
  const int shift = tap / p.s * p.dh * p.w + tap % p.s * p.dw;  // the tap's first band row
  float acc[2][4][4] = {};

  auto multiply = [&](int stage) {
    const T* as = tiles + stage * stage_elems;
    const T* bs = as + BK * kLd + shift * kLd;
    const uint32_t* mk = masks + stage * BK;
#pragma unroll
    for (int kk = 0; kk < BK; kk += kStep<T>) {
      uint32_t a[2][4], b[4][2];
      if constexpr (std::is_same_v<T, float>) {
        const bool m0 = (mk[kk + t] >> tap) & 1, m1 = (mk[kk + t + 4] >> tap) & 1;
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          const int o = mi * 16 + g;
          a[mi][0] = to_tf32(as[(kk + t) * kLd + o]);
          a[mi][1] = to_tf32(as[(kk + t) * kLd + o + 8]);
          a[mi][2] = to_tf32(as[(kk + t + 4) * kLd + o]);
          a[mi][3] = to_tf32(as[(kk + t + 4) * kLd + o + 8]);
        }
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int c = ni * 8 + g;
          b[ni][0] = m0 ? to_tf32(bs[(kk + t) * kLd + c]) : 0u;
          b[ni][1] = m1 ? to_tf32(bs[(kk + t + 4) * kLd + c]) : 0u;
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) mma_tf32(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
      } else {
        const int k0 = kk + 2 * t;  // this thread's pixels: k0, k0 + 1, k0 + 8, k0 + 9
        const uint32_t bits = ((mk[k0] >> tap) & 1) | (((mk[k0 + 1] >> tap) & 1) << 1) |
                              (((mk[k0 + 8] >> tap) & 1) << 2) | (((mk[k0 + 9] >> tap) & 1) << 3);
        auto at = [&](const T* s, int row, int col, bool on) { return on ? bits16(s[row * kLd + col]) : uint16_t{0}; };
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          const int o = mi * 16 + g;
          a[mi][0] = pack2(at(as, k0, o, true), at(as, k0 + 1, o, true));
          a[mi][1] = pack2(at(as, k0, o + 8, true), at(as, k0 + 1, o + 8, true));
          a[mi][2] = pack2(at(as, k0 + 8, o, true), at(as, k0 + 9, o, true));
          a[mi][3] = pack2(at(as, k0 + 8, o + 8, true), at(as, k0 + 9, o + 8, true));
        }
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int c = ni * 8 + g;
          b[ni][0] = pack2(at(bs, k0, c, bits & 1), at(bs, k0 + 1, c, bits & 2));
          b[ni][1] = pack2(at(bs, k0 + 8, c, bits & 4), at(bs, k0 + 9, c, bits & 8));
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) mma<T>(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
      }
    }
  };

  // As the gather kernel: kStages - 1 stages in flight ahead of the one multiplied; the
  // masks, stored at once, go into a stage no warp reads until the barrier after them.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < iters) load(s, first + s * BK);
    cp_commit();
  }
  for (int it = 0; it < iters; ++it) {
    cp_wait<kStages - 2>();
    __syncthreads();
    const int next = it + kStages - 1;
    if (next < iters) load(next % kStages, first + next * BK);
    cp_commit();
    multiply(it % kStages);
  }

  // The warp's tile: rows o0 + mi * 16 + g (+ 8), columns tap * C + c0 + ni * 8 + 2t (+ 1).
  float* out = p.partial + static_cast<int64_t>(blockIdx.y) * p.k * p.np;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const int o = o0 + mi * 16 + g, col = tap * p.c + c0 + ni * 8 + 2 * t;
      *reinterpret_cast<float2*>(out + static_cast<int64_t>(o) * p.np + col) =
          make_float2(acc[mi][ni][0], acc[mi][ni][1]);
      *reinterpret_cast<float2*>(out + static_cast<int64_t>(o + 8) * p.np + col) =
          make_float2(acc[mi][ni][2], acc[mi][ni][3]);
    }
}

}  // namespace

size_t band_smem_bytes(DType dt, int halo) {
  const size_t rows = static_cast<size_t>(kBandBK) * 2 + static_cast<size_t>(halo);
  return kStages * (rows * kLd * dtype_size(dt) + kBandBK * sizeof(uint32_t));
}

void launch_wgrad_band(DType dt, const BandParams& p, int64_t chunks, cudaStream_t st) {
  const size_t bytes = band_smem_bytes(dt, p.halo);
  dispatch_storage(dt, "conv2d_grad_weight", [&]<class T>() {
    // Above 48 KB a kernel must ask for its shared memory: once, for the most any band
    // takes (band_applies keeps every band under it).
    static const bool attr = [] {
      SEAM_CUDA_CHECK(cudaFuncSetAttribute(wgrad_band_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kBandMaxSmem)));
      return true;
    }();
    (void)attr;
    const dim3 grid(static_cast<unsigned>((p.k / 32) * (p.c / 32)), static_cast<unsigned>(chunks));
    wgrad_band_kernel<T><<<grid, 32 * p.r * p.s, bytes, st>>>(p);
    SEAM_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace seam::cuda
