// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11),
// the counter-based generator cuRAND and PyTorch use. A random number is a pure function
// of (key, counter): any element of any step can be drawn independently, on the host or
// the device, with no generator state to carry or capture.
// It is also handed verbatim to NVRTC for generated kernels (src/backend/cuda/codegen.cpp),
// which declares the two integer types itself.
#pragma once
#if !defined(__CUDACC_RTC__)
#include <cstdint>
#endif

#if defined(__CUDACC__)
#define SEAM_PHILOX_HD __host__ __device__
#else
#define SEAM_PHILOX_HD
#endif

namespace seam {

struct Philox4 {
  uint32_t v[4];
};

SEAM_PHILOX_HD inline Philox4 philox4x32(Philox4 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c.v[0];
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c.v[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// Uniform in [0, 1) from the top 24 bits: exact in float.
SEAM_PHILOX_HD inline float philox_uniform(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// The stream of the update's stochastic rounding (ModelOptions::master_weights = false);
// dropout streams are node indices, far below it.
inline constexpr uint32_t kRoundingStream = 0xFFFFFFFFu;

// The words of elements 4 block .. 4 block + 3: counter (block, step, stream), key seed.
SEAM_PHILOX_HD inline Philox4 dropout_words(uint64_t seed, uint64_t step, uint32_t stream, uint64_t block) {
  return philox4x32({{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), static_cast<uint32_t>(step),
                      stream}},
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The dropout draw of element i: word i%4 of block i/4.
SEAM_PHILOX_HD inline float dropout_uniform(uint64_t seed, uint64_t step, uint32_t stream, uint64_t i) {
  return philox_uniform(dropout_words(seed, step, stream, i >> 2).v[i & 3]);
}

}  // namespace seam
