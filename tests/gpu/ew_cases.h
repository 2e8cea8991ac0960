// The elementwise ops the GPU elementwise tests walk (f32, 16-bit, f64): every unary op
// with the range its argument is drawn from (away from 0 where the op or its gradient
// needs it) and whether CUDA's math functions enter it, and the binary ops.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "seam/seam.h"

namespace seam::gpu_testing {

struct UnaryCase {
  std::string name;
  std::function<Var(Var)> f;
  double lo, hi;
  bool transcendental;
};

inline const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> v = {
      {"relu", [](Var x) { return relu(x); }, -1, 1, false},
      {"leaky_relu", [](Var x) { return leaky_relu(x); }, -1, 1, false},
      {"leaky_relu(0.3)", [](Var x) { return leaky_relu(x, 0.3); }, -1, 1, false},
      {"sigmoid", [](Var x) { return sigmoid(x); }, -4, 4, true},
      {"tanh", [](Var x) { return tanh(x); }, -3, 3, true},
      {"gelu", [](Var x) { return gelu(x); }, -3, 3, true},
      {"gelu_tanh", [](Var x) { return gelu(x, true); }, -3, 3, true},
      {"silu", [](Var x) { return silu(x); }, -4, 4, true},
      {"exp", [](Var x) { return exp(x); }, -3, 3, true},
      {"log", [](Var x) { return log(x); }, 0.2, 3, true},
      {"sqrt", [](Var x) { return sqrt(x); }, 0.2, 3, true},
      {"pow(2.5)", [](Var x) { return pow(x, 2.5); }, 0.2, 3, true},
      {"pow(-1.5)", [](Var x) { return pow(x, -1.5); }, 0.2, 3, true},
      {"scale", [](Var x) { return scale(x, 0.37); }, -1, 1, false},
      {"neg", [](Var x) { return neg(x); }, -1, 1, false},
      {"abs", [](Var x) { return seam::abs(x); }, -1, 1, false},
      {"erf", [](Var x) { return seam::erf(x); }, -3, 3, true},
  };
  return v;
}

using BinaryFn = std::function<Var(Var, Var)>;
inline const std::vector<std::pair<std::string, BinaryFn>>& binary_ops() {
  static const std::vector<std::pair<std::string, BinaryFn>> v = {
      {"add", [](Var a, Var b) { return add(a, b); }},         {"sub", [](Var a, Var b) { return sub(a, b); }},
      {"mul", [](Var a, Var b) { return mul(a, b); }},         {"div", [](Var a, Var b) { return div(a, b); }},
      {"maximum", [](Var a, Var b) { return maximum(a, b); }}, {"minimum", [](Var a, Var b) { return minimum(a, b); }},
  };
  return v;
}

}  // namespace seam::gpu_testing
