// The bounds of the numerics suite per precision and op group, shared by the CPU test
// (tests/test_numerics.cpp) and the GPU one (tests/gpu/test_gpu_numerics.cpp).
#pragma once
#include <sstream>
#include <string>

#include "bench/numerics.h"
#include "seam/seam.h"

namespace seam::testing {

struct Bound {
  double max, mean;
};

// Bounds from the tables (docs/numerics.md), about 3x to 6x above the worst row of each
// group. The measure is per element |got - ref| / (|ref| + 1e-3 rms(ref)), and the
// 16-bit rows include rounding every operand to the 16-bit type (the reference reads the
// f32 values), so:
// - pointwise ops (each element from a few operands: elementwise, max pooling,
//   embedding, dropout) see one or two roundings: f32 means of 1e-6 at most, bf16 means
//   near 2^-9 (6e-3 at worst, log near x = 1), f16 near 2^-12 (9e-4 at worst). Their
//   maxima are larger where the result nearly cancels (a + b for a near -b: 1.9 at bf16,
//   0.51 at f16): the error of the operands over a result near 0, which the floor caps.
// - reducing ops (GEMMs, convolutions, norms, softmax, losses, sums, average pools) sum
//   many rounded terms, and their gradients cancel (a norm's dx subtracts the means of dy
//   and dy * x_hat): f32 maxima to 3e-4 (GEMM elements near 0, the norms' dx on the
//   GPU), bf16 means to 2.6e-2 and f16 means to 3.3e-3 (batch norm's dx, conv 1x1's dw,
//   layer norm's dx).
// - cancelling derivatives: tanh's dy (1 - y^2) and sigmoid's dy y (1 - y) read the
//   stored output, so at 16 bits y's rounding is most of 1 - y where the op saturates
//   (tanh's bf16 mean 8.5e-2, 10x its peers; as PyTorch computes them); gelu_tanh's
//   derivative forms 1 + t and 1 - t^2 from t = tanh(..) near -1, which costs it 6.9e-4
//   at f32 for x < -3.
// TF32 exists on the GPU only: there a GEMM or convolution on TF32 tensor cores rounds
// its operands to 10 bits of mantissa (matmul_tn: mean 1.2e-3, max 0.23), its other ops
// are f32's. The CPU's tf32 plan is its f32 one, and so are its bounds.
enum class Group { pointwise, reducing, cancelling };

inline Group group_of(const bench::NumericsRow& r) {
  if ((r.op == "tanh" || r.op == "sigmoid" || r.op == "gelu_tanh") && r.what != "output") return Group::cancelling;
  for (const char* f : {"matmul", "linear", "conv2d", "layer_norm", "batch_norm", "softmax", "log_softmax",
                        "cross_entropy", "mse", "sum", "mean", "avg_pool2d", "global_avg_pool", "attention"}) {
    const std::string family = f;
    if (r.op == family || r.op.rfind(family + "_", 0) == 0) return Group::reducing;
  }
  return Group::pointwise;
}

inline Bound bound_of(Precision p, Group g, Device d = Device::cpu) {
  switch (p) {
    case Precision::tf32:
      if (d == Device::cuda && g == Group::reducing) return {1, 5e-3};
      [[fallthrough]];
    case Precision::f32:
      return g == Group::pointwise ? Bound{2e-4, 5e-6} : g == Group::reducing ? Bound{1e-3, 2e-5} : Bound{3e-3, 3e-5};
    case Precision::bf16:
      return g == Group::pointwise ? Bound{10, 2e-2} : g == Group::reducing ? Bound{30, 8e-2} : Bound{10, 0.25};
    case Precision::f16:
      return g == Group::pointwise ? Bound{2.5, 3e-3} : g == Group::reducing ? Bound{6, 1e-2} : Bound{2.5, 5e-2};
  }
  return {0, 0};
}

inline Bound bound_of(const bench::NumericsRow& r, Device d = Device::cpu) {
  return bound_of(r.precision, group_of(r), d);
}

inline bool within(const bench::NumericsRow& r, Device d = Device::cpu) {
  const Bound b = bound_of(r, d);
  return r.max_rel <= b.max && r.mean_rel <= b.mean;
}

inline std::string describe(const bench::NumericsRow& r, Device d = Device::cpu) {
  const Bound b = bound_of(r, d);
  std::ostringstream s;
  s << r.op << " at " << precision_name(r.precision) << ", " << r.what << ": max " << r.max_rel << " (bound " << b.max
    << "), mean " << r.mean_rel << " (bound " << b.mean << ")";
  return s.str();
}

}  // namespace seam::testing
