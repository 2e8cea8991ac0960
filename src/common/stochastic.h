// Stochastic rounding to a 16-bit float format, the same bits on the host and the device
// for the same uniform draw: for parameters stored without f32 masters, where an update
// below half a unit in the last place would otherwise never move a value.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SEAM_STOCHASTIC_HD __host__ __device__
#else
#define SEAM_STOCHASTIC_HD
#endif

namespace seam {

// x rounded to one of the two 16-bit values around it, the one further away with
// probability |x - near| / |far - near|, so that the expected result is x. `nearest` is x
// rounded to nearest (its bits, sign and magnitude as bf16 and f16 both lay them out),
// `value(bits)` the float a 16-bit value holds, u uniform in [0, 1). Exact values, NaN
// and infinities keep their nearest rounding.
template <class Value>
SEAM_STOCHASTIC_HD inline uint16_t round_stochastic(float x, uint16_t nearest, Value value, float u) {
  const float near = value(nearest);
  if (near == x || !std::isfinite(x) || !std::isfinite(near)) return nearest;
  const uint16_t sign = x < 0 ? 0x8000u : 0u, mag = nearest & 0x7FFFu;
  // Magnitude + 1 is the neighbour away from zero, - 1 the one toward it.
  const bool away = std::fabs(near) < std::fabs(x);
  if (!away && mag == 0) return nearest;  // cannot happen for a nearest rounding; kept total
  const auto far_bits = static_cast<uint16_t>(sign | (away ? mag + 1 : mag - 1));
  const float far = value(far_bits);
  const float p = (x - near) / (far - near);  // in [0, 0.5]; 0 when far is infinite
  return u < p ? far_bits : nearest;
}

}  // namespace seam
