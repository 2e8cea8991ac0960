// seam's own weight gradient of a channels-last convolution, beside cuDNN's.
//
// The weight gradient is a GEMM with a tiny output and a huge sum: dw[o, (r, s, c)] =
// sum over the output pixels p of dy[p, o] * x[pixel of p under tap (r, s), c]. A 3x3
// layer of 32 channels at 28x28 and batch 128 has 9216 outputs, each a sum of 100352
// terms; cuDNN's engines for it run at a tenth of the tensor cores' rate (docs/perf.md).
// Here the sum is cut into chunks of pixels, one block of warps per (output tile, chunk):
// each block gathers its x rows (implicit im2col, zeros for padding) and dy rows into
// shared memory, three tiles deep with cp.async, multiplies them on the tensor cores (WMMA:
// TF32 for f32 data, bf16 / f16 with f32 accumulation), and stores its partial tile; a
// second kernel adds the chunks' partials in chunk order and rounds once into dw (of the
// operands' dtype, or f32 from 16-bit operands). No atomics: a step repeats its bits.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "backend/cuda/cuda.h"

namespace seam::cuda {

// One NHWC convolution's weight gradient (groups 1): x [N, H, W, C], dy [N, OH, OW, K],
// dw [K, R, S, C] (KRSC).
struct WgradGeometry {
  int64_t n = 0, h = 0, w = 0, c = 0;
  int64_t k = 0, r = 0, s = 0;
  int64_t oh = 0, ow = 0;
  int64_t stride[2]{1, 1}, pad[2]{}, dil[2]{1, 1};
};

// How the kernel cuts the GEMM: output tiles of (32 * wm) x (32 * wn) and the pixels in
// `chunks` chunks; or (band) the band kernel's tiles of 32 output channels by 32 input
// channels of every tap (conv_wgrad_band.cu).
struct WgradConfig {
  int wm = 1, wn = 2;
  int64_t chunks = 1;
  bool band = false;
  std::string str() const;
};

// SEAM_CONV_WGRAD: "auto" (default: the faster of these kernels and cuDNN's best, as
// timed), "own" (the gather kernel wherever it applies; for tests), "band" (the band
// kernel where it applies, else as "own"), "cudnn" (never these kernels).
enum class WgradPolicy { automatic, own, band, cudnn };
WgradPolicy wgrad_policy();
// Whether the policy forces seam's kernels (own or band) wherever they apply.
bool wgrad_forced();

// The band kernel (conv_wgrad_band.cu), for stride-1 layers that keep their size: BK
// pixels a stage, a warp per tap (at most kBandMaxTaps), 32 x 32 channels a block.
constexpr int kBandBK = 64;
constexpr int kBandMaxTaps = 9;
constexpr size_t kBandMaxSmem = 200 * 1024;
struct BandParams {
  const void* x;
  const void* dy;
  float* partial;  // [chunks][k][np]
  int n, h, w, c, k, r, s;
  int ph, pw, dh, dw;
  int halo;        // (r - 1) * dh * w + (s - 1) * dw band rows beyond a stage's pixels
  int pixels;      // n * h * w
  int chunk;       // pixels per chunk, a multiple of kBandBK
  int np;          // r * s * c
};
size_t band_smem_bytes(DType dt, int halo);
void launch_wgrad_band(DType dt, const BandParams& p, int64_t chunks, cudaStream_t st);

// The fastest configuration's launch (timed in a graph on the step's buffers: *ms its time
// per run; untimed, *ms 0, where the pick is a rule's: deterministic mode or
// SEAM_CONV_WGRAD=own; *chose what was tried and taken), or nothing
// where the kernel does not apply (*why says why). Operands: x and dy in `dt` (f32
// computes in TF32), dw in `dt` or f32. The chunks' partial tiles live in the context's
// workspace: *workspace bytes of it (already asked for).
std::optional<Launch> prepare_own_wgrad(const StepArgs& a, const WgradGeometry& g, DType dt, DType out_dt,
                                        const void* x, const void* dy, void* dw, float* ms, size_t* workspace,
                                        std::string* chose, std::string* why);

}  // namespace seam::cuda
