// Elementwise ops: schema, shape rule and gradient, all generated from seam/ops.def.
#include "ops/elementwise.h"

#include <cmath>
#include <cstring>

#include "ops/registry.h"

namespace seam {

namespace {

const UnaryInfo kUnary[] = {
#define SEAM_UNARY(name, attr, def, value, derivative, uses) \
  {Op::name, Op::name##_grad, attr, def, #value, #derivative, Uses::uses},
#include "seam/ops.def"
};

const BinaryInfo kBinary[] = {
#define SEAM_BINARY(name, value, da, db) \
  {Op::name, Op::name##_grad_a, Op::name##_grad_b, #value, #da, #db},
#include "seam/ops.def"
};

std::vector<AttrSpec> unary_attrs(const UnaryInfo& u) {
  if (!*u.attr) return {};
  if (std::isnan(u.def)) return {{u.attr, 0.0, true}};
  return {{u.attr, u.def}};
}

void register_unary(OpTable& t, const UnaryInfo& u) {
  OpDef& f = def(t, u.op);
  f.name = op_name(u.op);
  f.inputs = {"x"};
  f.outputs = {"y"};
  f.attrs = unary_attrs(u);
  f.doc = std::string("y = ") + u.value;
  f.infer = [](const InferCtx& c) {
    c.expect_float(0);
    return std::vector<TensorType>{c.type(0)};
  };
  f.grad = [&u](GradCtx& c) {
    std::vector<ValueId> in{c.dy().id()};
    if (u.uses == Uses::X) in.push_back(c.x(0).id());
    if (u.uses == Uses::Y) in.push_back(c.y().id());
    c.set(0, c.g.add1(u.grad, in, c.attrs()));
  };

  OpDef& b = def(t, u.grad);
  b.name = op_name(u.grad);
  b.inputs = {"dy"};
  if (u.uses == Uses::X) b.inputs.push_back("x");
  if (u.uses == Uses::Y) b.inputs.push_back("y");
  b.outputs = {"dx"};
  b.attrs = unary_attrs(u);
  b.doc = std::string("dx = ") + u.derivative;
  b.infer = [](const InferCtx& c) {
    c.expect_float(0);
    c.expect_same_dtype();
    if (c.n() == 2 && c.shape(1) != c.shape(0)) c.fail("dy and its forward value differ in shape");
    return std::vector<TensorType>{c.type(0)};
  };
}

void register_binary(OpTable& t, const BinaryInfo& bi) {
  OpDef& f = def(t, bi.op);
  f.name = op_name(bi.op);
  f.inputs = {"a", "b"};
  f.outputs = {"y"};
  f.doc = std::string("y = ") + bi.value + " (broadcasting)";
  f.infer = [](const InferCtx& c) {
    c.expect_float(0);
    c.expect_same_dtype();
    auto s = broadcast_shapes(c.shape(0), c.shape(1));
    if (!s) c.fail("shapes ", shape_str(c.shape(0)), " and ", shape_str(c.shape(1)), " do not broadcast");
    return std::vector<TensorType>{{c.type(0).dtype, *s}};
  };
  f.grad = [&bi](GradCtx& c) {
    Var dy = c.dy();
    auto side = [&](size_t i, Op op, const char* expr) {
      if (!c.needs(i)) return;
      Var full = std::strcmp(expr, "dy") == 0 ? dy : c.g.add1(op, {dy.id(), c.x(0).id(), c.x(1).id()});
      c.set(i, sum_to(full, c.x(i).shape()));
    };
    side(0, bi.grad_a, bi.da);
    side(1, bi.grad_b, bi.db);
  };

  for (auto [op, expr] : {std::pair{bi.grad_a, bi.da}, std::pair{bi.grad_b, bi.db}}) {
    OpDef& b = def(t, op);
    b.name = op_name(op);
    b.inputs = {"dy", "a", "b"};
    b.outputs = {op == bi.grad_a ? "da" : "db"};
    b.doc = std::string(op == bi.grad_a ? "da = " : "db = ") + expr + " at dy's shape";
    b.infer = [](const InferCtx& c) {
      c.expect_float(0);
      c.expect_same_dtype();
      for (size_t i = 1; i < 3; ++i) {
        auto s = broadcast_shapes(c.shape(i), c.shape(0));
        if (!s || *s != c.shape(0)) c.fail("input ", i, " does not broadcast to dy's shape");
      }
      return std::vector<TensorType>{c.type(0)};
    };
  }
}

}  // namespace

const UnaryInfo* unary_info(Op op) {
  for (auto& u : kUnary)
    if (u.op == op || u.grad == op) return &u;
  return nullptr;
}

const BinaryInfo* binary_info(Op op) {
  for (auto& b : kBinary)
    if (b.op == op || b.grad_a == op || b.grad_b == op) return &b;
  return nullptr;
}

void register_elementwise(OpTable& t) {
  for (auto& u : kUnary) register_unary(t, u);
  for (auto& b : kBinary) register_binary(t, b);
}

namespace {
Var unary(Op op, Var x, Attrs a = {}) { return x.graph().add1(op, {x.id()}, std::move(a)); }
Var binary(Op op, Var a, Var b) {
  if (&a.graph() != &b.graph()) fail(op_name(op), ": operands belong to different graphs");
  return a.graph().add1(op, {a.id(), b.id()});
}
}  // namespace

Var relu(Var x) { return unary(Op::relu, x); }
Var leaky_relu(Var x, double alpha) { return unary(Op::leaky_relu, x, {{"alpha", alpha}}); }
Var sigmoid(Var x) { return unary(Op::sigmoid, x); }
Var tanh(Var x) { return unary(Op::tanh, x); }
Var gelu(Var x, bool tanh_approximation) {
  return unary(tanh_approximation ? Op::gelu_tanh : Op::gelu, x);
}
Var silu(Var x) { return unary(Op::silu, x); }
Var exp(Var x) { return unary(Op::exp, x); }
Var log(Var x) { return unary(Op::log, x); }
Var sqrt(Var x) { return unary(Op::sqrt, x); }
Var pow(Var x, double exponent) { return unary(Op::pow, x, {{"exponent", exponent}}); }
Var scale(Var x, double factor) { return unary(Op::scale, x, {{"factor", factor}}); }
Var abs(Var x) { return unary(Op::abs, x); }
Var erf(Var x) { return unary(Op::erf, x); }
Var neg(Var x) { return unary(Op::neg, x); }

Var add(Var a, Var b) { return binary(Op::add, a, b); }
Var sub(Var a, Var b) { return binary(Op::sub, a, b); }
Var mul(Var a, Var b) { return binary(Op::mul, a, b); }
Var div(Var a, Var b) { return binary(Op::div, a, b); }
Var maximum(Var a, Var b) { return binary(Op::maximum, a, b); }
Var minimum(Var a, Var b) { return binary(Op::minimum, a, b); }

}  // namespace seam
