// softmax and log_softmax along one axis; their gradients read only the output.
#include "ops/registry.h"

namespace seam {

void register_softmax(OpTable& t) {
  for (auto [op, grad] : {std::pair{Op::softmax, Op::softmax_grad}, std::pair{Op::log_softmax, Op::log_softmax_grad}}) {
    OpDef& d = def(t, op);
    d.name = op_name(op);
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.attrs = {{"axis", int64_t{-1}}};
    d.doc = op == Op::softmax ? "exp(x) / sum(exp(x)) along axis" : "x - log(sum(exp(x))) along axis";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      c.axis("axis", c.shape(0).size());
      return std::vector<TensorType>{c.type(0)};
    };
    d.flops = [](const OpCostCtx& c) { return 5.0 * static_cast<double>(c.in[0].numel()); };
    d.grad = [grad = grad](GradCtx& c) {
      c.set(0, c.g.add1(grad, {c.dy().id(), c.y().id()}, c.attrs()));
    };

    OpDef& b = def(t, grad);
    b.name = op_name(grad);
    b.inputs = {"dy", "y"};
    b.outputs = {"dx"};
    b.attrs = d.attrs;
    b.doc = op == Op::softmax ? "dx = y * (dy - sum(dy * y))" : "dx = dy - exp(y) * sum(dy)";
    b.infer = [](const InferCtx& c) {
      c.expect_same_dtype();
      if (c.shape(0) != c.shape(1)) c.fail("dy and y differ in shape");
      c.axis("axis", c.shape(0).size());
      return std::vector<TensorType>{c.type(0)};
    };
    b.flops = [](const OpCostCtx& c) { return 4.0 * static_cast<double>(c.in[0].numel()); };
  }
}

Var softmax(Var x, int64_t axis) { return x.graph().add1(Op::softmax, {x.id()}, {{"axis", axis}}); }
Var log_softmax(Var x, int64_t axis) { return x.graph().add1(Op::log_softmax, {x.id()}, {{"axis", axis}}); }

}  // namespace seam
