// A small MLP case for the GEMM epilogue tests (f32 and 16-bit alike).
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "gpu_check.h"

namespace seam::gpu_testing {

struct Mlp {
  std::string act;  // relu | gelu
  Shape x;
  std::vector<int64_t> widths;  // hidden widths, then the output width
  bool bias;
};

inline std::string mlp_name(const Mlp& m) {
  std::string s = m.act + " " + shape_str(m.x);
  for (int64_t w : m.widths) s += " -> " + std::to_string(w);
  return s + (m.bias ? " with biases" : " without biases");
}

// linear -> act -> linear -> act ... -> linear, parameters in PyTorch's default range.
inline Var build_mlp(GpuCase& c, const Mlp& m) {
  Var h = c.data("x", m.x);
  int64_t in = m.x.back();
  for (size_t i = 0; i < m.widths.size(); ++i) {
    const int64_t out = m.widths[i];
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    const std::string name = "fc" + std::to_string(i + 1);
    Var w = c.param(name + ".weight", {out, in}, -bound, bound);
    h = m.bias ? linear(h, w, c.param(name + ".bias", {out}, -bound, bound)) : linear(h, w);
    if (i + 1 < m.widths.size()) h = m.act == "relu" ? relu(h) : gelu(h, /*tanh_approximation=*/true);
    in = out;
  }
  return h;
}

}  // namespace seam::gpu_testing
