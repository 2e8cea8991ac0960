// Conversions between float and the 16-bit float formats on the host, rounding to
// nearest even as the hardware does.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "seam/dtype.h"

namespace seam {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_f16(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t mag = u & 0x7FFFFFFFu;
  if (mag >= 0x7F800000u) return static_cast<uint16_t>(sign | (mag > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (mag >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to inf
  if (mag < 0x38800000u) {  // subnormal or zero in f16: round at 2^-24 granularity
    float v = bits_float(mag) * 16777216.0f;  // in units of 2^-24
    auto q = static_cast<uint32_t>(std::nearbyint(v));  // default rounding: to nearest even
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t e = ((mag >> 23) - 112) << 10;
  uint32_t m = mag & 0x7FFFFFu;
  uint32_t h = e | (m >> 13);
  uint32_t rest = m & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}
inline float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) return (sign ? -1.0f : 1.0f) * static_cast<float>(m) / 16777216.0f;
  if (e == 31) return bits_float(sign | 0x7F800000u | (m << 13));
  return bits_float(sign | ((e + 112) << 23) | (m << 13));
}

// The same for a 16-bit dtype named at run time: bf16 or f16.
inline uint16_t float_to_half(float f, DType t) { return t == DType::bf16 ? float_to_bf16(f) : float_to_f16(f); }
inline float half_to_float(uint16_t h, DType t) { return t == DType::bf16 ? bf16_to_float(h) : f16_to_float(h); }

// The values of a float tensor's bytes (f64, f32, bf16 or f16) as doubles.
inline std::vector<double> float_values(const std::vector<std::byte>& b, DType t) {
  std::vector<double> r(b.size() / dtype_size(t));
  for (size_t i = 0; i < r.size(); ++i) {
    const std::byte* p = b.data() + i * dtype_size(t);
    if (t == DType::f64) {
      std::memcpy(&r[i], p, 8);
    } else if (t == DType::f32) {
      float f;
      std::memcpy(&f, p, 4);
      r[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, p, 2);
      r[i] = half_to_float(h, t);
    }
  }
  return r;
}

}  // namespace seam
