// Attention's dropout on the probabilities, as the plain and gemm variants (and the CPU)
// draw it: score (r, j), r the step's query row (b H Tq + h Tq + i) and j the key, is kept
// with factor 1 / (1 - p) where its draw from (seed, step, stream, r Tk + j) is >= p.
#pragma once
#include <cstdint>

#include "common/philox.h"

namespace seam::cuda {

// G: a step geometry with drop (0: none), tk, stream and counters.
template <class G>
struct Keep {
  uint64_t seed = 0, step = 0;
  __device__ explicit Keep(const G& g) {
    if (g.drop > 0.f) seed = g.counters->seed, step = static_cast<uint64_t>(g.counters->step);
  }
  // 0 or 1 / (1 - p); 1 without dropout.
  __device__ float operator()(const G& g, int64_t r, int64_t j) const {
    if (g.drop == 0.f) return 1.f;
    const float u = dropout_uniform(seed, step, g.stream, static_cast<uint64_t>(r * g.tk + j));
    return u >= g.drop ? 1.f / (1.f - g.drop) : 0.f;
  }
};

}  // namespace seam::cuda
