// Math helpers used by the elementwise expressions of seam/ops.def. This file compiles
// as host C++ (T = float or double), as CUDA device code, and is handed verbatim to
// NVRTC for generated kernels, so it includes nothing and uses only exp/tanh/erf/sqrt
// found by the caller (std:: on the host, CUDA's math on the device).
#pragma once

#if defined(__CUDACC_RTC__)
#define SEAM_HD __device__
#elif defined(__CUDACC__)
#define SEAM_HD __host__ __device__
#else
#define SEAM_HD
#endif

namespace seam_ew {

template <class T>
SEAM_HD inline T sigmoid(T x) {
  return T(1) / (T(1) + exp(-x));
}

// GELU, exact form: x * Phi(x).
template <class T>
SEAM_HD inline T gelu_erf(T x) {
  return T(0.5) * x * (T(1) + erf(x * T(0.70710678118654752440)));
}
template <class T>
SEAM_HD inline T gelu_erf_grad(T x) {
  return T(0.5) * (T(1) + erf(x * T(0.70710678118654752440))) +
         x * T(0.39894228040143267794) * exp(T(-0.5) * x * x);
}

// GELU, tanh approximation (the form cuBLASLt's GELU epilogues compute):
// 0.5 x (1 + tanh(u)), u = k (x + 0.044715 x^3). Written with 1 + tanh(u) = 2 sigmoid(2u)
// and 1 - tanh(u)^2 = 4 sigmoid(2u) sigmoid(-2u), which do not cancel where tanh(u) is
// near -1 (x below -3: in the tanh form the f32 gradient there is off by 7e-4).
template <class T>
SEAM_HD inline T gelu_tanh(T x) {
  return x * sigmoid(T(2 * 0.79788456080286535588) * (x + T(0.044715) * x * x * x));
}
template <class T>
SEAM_HD inline T gelu_tanh_grad(T x) {
  T k = T(0.79788456080286535588);
  T u2 = T(2) * k * (x + T(0.044715) * x * x * x);
  T s = sigmoid(u2), sm = sigmoid(-u2);
  return s + T(2) * k * x * s * sm * (T(1) + T(3 * 0.044715) * x * x);
}

// d/dx erf(x) = 2 / sqrt(pi) exp(-x^2).
template <class T>
SEAM_HD inline T erf_grad(T x) {
  return T(1.12837916709551257390) * exp(-x * x);
}

template <class T>
SEAM_HD inline T silu_grad(T x) {
  T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

}  // namespace seam_ew
