// The ONNX importer's op table, part five: activations seam has no op for, written with
// its elementwise ops (fusion makes each one kernel), and the ones it has under other
// names or attributes.
#include <cmath>

#include "io/onnx_import.h"

namespace seam::onnx::detail {

namespace {

void leaky_relu_op(NodeCtx& c) { c.out(0, leaky_relu(c.in(0), c.f("alpha", 0.01))); }

// Activations written with seam's elementwise ops (fusion makes each one kernel).
// max(x, 0) + alpha (exp(min(x, 0) / k) - 1) k: elu with k = 1, celu with k = alpha.
Var elu_like(NodeCtx& c, Var x, double alpha, double k) {
  Var zero = scalar(c.g(), 0.0, x.dtype());
  Var neg_part = scale(sub(seam::exp(scale(minimum(x, zero), 1.0 / k)), scalar(c.g(), 1.0, x.dtype())), alpha * k);
  return add(maximum(x, zero), neg_part);
}
void elu_op(NodeCtx& c) { c.out(0, elu_like(c, c.in(0), c.f("alpha", 1.0), 1.0)); }
void celu_op(NodeCtx& c) {
  const double a = c.f("alpha", 1.0);
  c.out(0, elu_like(c, c.in(0), 1.0, a));
}
void selu_op(NodeCtx& c) {
  c.out(0, scale(elu_like(c, c.in(0), c.f("alpha", 1.67326319217681884765625), 1.0),
                 c.f("gamma", 1.05070102214813232421875)));
}
// max(0, min(1, alpha x + beta))
Var hard_sigmoid(NodeCtx& c, Var x, double alpha, double beta) {
  Var y = add(scale(x, alpha), scalar(c.g(), beta, x.dtype()));
  return maximum(minimum(y, scalar(c.g(), 1.0, x.dtype())), scalar(c.g(), 0.0, x.dtype()));
}
void hard_sigmoid_op(NodeCtx& c) { c.out(0, hard_sigmoid(c, c.in(0), c.f("alpha", 0.2), c.f("beta", 0.5))); }
void hard_swish_op(NodeCtx& c) {
  Var x = c.in(0);
  c.out(0, mul(x, hard_sigmoid(c, x, 1.0 / 6.0, 0.5)));
}
// log(1 + exp(x)), as max(x, 0) + log(1 + exp(-|x|)): no overflow for large x.
Var softplus(NodeCtx& c, Var x) {
  Var one = scalar(c.g(), 1.0, x.dtype());
  return add(maximum(x, scalar(c.g(), 0.0, x.dtype())), seam::log(add(one, seam::exp(neg(seam::abs(x))))));
}
void softplus_op(NodeCtx& c) { c.out(0, softplus(c, c.in(0))); }
void softsign_op(NodeCtx& c) {
  Var x = c.in(0);
  c.out(0, div(x, add(scalar(c.g(), 1.0, x.dtype()), seam::abs(x))));
}
// max(x, 0) + slope min(x, 0), slope broadcast (per channel, usually).
void prelu_op(NodeCtx& c) {
  Var x = c.in(0), slope = c.in(1);
  Var zero = scalar(c.g(), 0.0, x.dtype());
  c.out(0, add(maximum(x, zero), mul(slope, minimum(x, zero))));
}

// Gelu (opset 20): the erf form, or the tanh approximation.
void gelu_op(NodeCtx& c) {
  const std::string approximate = c.s("approximate", "none");
  if (approximate != "none" && approximate != "tanh") c.fail("approximate '", approximate, "' is neither none nor tanh");
  c.out(0, gelu(c.in(0), approximate == "tanh"));
}

// Mish (opset 18): x tanh(softplus(x)), softplus as above.
void mish_op(NodeCtx& c) {
  Var x = c.in(0);
  c.out(0, mul(x, seam::tanh(softplus(c, x))));
}

}  // namespace

void add_activation_importers(std::map<std::string, OpImporter>& t) {
  t.insert({{"LeakyRelu", leaky_relu_op},
            {"Elu", elu_op},
            {"Celu", celu_op},
            {"Selu", selu_op},
            {"HardSigmoid", hard_sigmoid_op},
            {"HardSwish", hard_swish_op},
            {"Softplus", softplus_op},
            {"Softsign", softsign_op},
            {"PRelu", prelu_op},
            {"Gelu", gelu_op},
            {"Mish", mish_op}});
}

}  // namespace seam::onnx::detail
