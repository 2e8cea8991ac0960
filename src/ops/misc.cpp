// Small ops: constants, casts, copies, gradient barriers, argmax, dropout, embedding.
#include <cmath>

#include "ops/registry.h"

namespace seam {

namespace {
std::vector<TensorType> same_as(const InferCtx& c, size_t i) { return {c.type(i)}; }
DType dtype_attr(const InferCtx& c) {
  auto t = parse_dtype(c.attrs.s("dtype"));
  if (!t) c.fail("unknown dtype '", c.attrs.s("dtype"), "' (f32, f64, bf16, f16, i32, u8)");
  return *t;
}
}  // namespace

void register_misc(OpTable& t) {
  {
    OpDef& d = def(t, Op::full);
    d.name = "full";
    d.outputs = {"y"};
    d.attrs = {{"shape", std::vector<int64_t>{}, true}, {"value", 0.0}, {"dtype", std::string("f32")}};
    d.doc = "a tensor filled with one value";
    d.infer = [](const InferCtx& c) {
      return std::vector<TensorType>{{dtype_attr(c), c.attrs.ints("shape")}};
    };
  }
  {
    OpDef& d = def(t, Op::loss_scale);
    d.name = "loss_scale";
    d.outputs = {"scale"};
    d.attrs = {{"init", 65536.0}};
    d.per_step = true;
    d.doc = "the dynamic loss scale of this step (init before the first update): the gradient seed "
            "of a scaled backward pass";
    d.infer = [](const InferCtx& c) {
      if (!(c.attrs.f("init") > 0)) c.fail("init must be > 0, got ", c.attrs.f("init"));
      return std::vector<TensorType>{{DType::f32, {}}};
    };
  }
  {
    OpDef& d = def(t, Op::cast);
    d.name = "cast";
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.attrs = {{"dtype", std::string(), true}};
    d.doc = "converts the element type (floats round to nearest even)";
    d.infer = [](const InferCtx& c) {
      return std::vector<TensorType>{{dtype_attr(c), c.shape(0)}};
    };
    d.grad = [](GradCtx& c) {
      if (is_float(c.x(0).dtype()) && is_float(c.y().dtype())) c.set(0, cast(c.dy(), c.x(0).dtype()));
    };
  }
  {
    OpDef& d = def(t, Op::copy);
    d.name = "copy";
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.doc = "y = x in a buffer of its own";
    d.infer = [](const InferCtx& c) { return same_as(c, 0); };
    d.grad = [](GradCtx& c) { c.set(0, c.dy()); };
  }
  {
    OpDef& d = def(t, Op::stop_gradient);
    d.name = "stop_gradient";
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.view_of = 0;
    d.doc = "y = x; no gradient flows back";
    d.infer = [](const InferCtx& c) { return same_as(c, 0); };
  }
  {
    OpDef& d = def(t, Op::argmax);
    d.name = "argmax";
    d.inputs = {"x"};
    d.outputs = {"index"};
    d.attrs = {{"axis", int64_t{-1}}, {"classes", int64_t{0}}};
    d.doc = "index of the largest element along an axis (first on ties), i32; classes > 0: among the axis's "
            "first `classes` elements only";
    d.infer = [](const InferCtx& c) {
      int a = c.axis("axis", c.shape(0).size());
      Shape s = c.shape(0);
      const int64_t classes = c.attrs.i("classes");
      if (classes < 0 || classes > s[static_cast<size_t>(a)])
        c.fail("classes must be 0 (the whole axis) or in [1, ", s[static_cast<size_t>(a)], "], got ", classes);
      s.erase(s.begin() + a);
      return std::vector<TensorType>{{DType::i32, s}};
    };
  }
  {
    OpDef& d = def(t, Op::count_equal);
    d.name = "count_equal";
    d.inputs = {"a", "b"};
    d.outputs = {"count"};
    d.doc = "number of positions where a == b, counting only b >= 0 (ignored labels are negative), i32";
    d.infer = [](const InferCtx& c) {
      c.expect_dtype(0, DType::i32);
      c.expect_dtype(1, DType::i32);
      if (c.shape(0) != c.shape(1)) c.fail("a and b differ in shape");
      return std::vector<TensorType>{{DType::i32, {}}};
    };
  }
  {
    OpDef& d = def(t, Op::accumulate);
    d.name = "accumulate";
    d.inputs = {"acc", "xs..."};
    d.attrs = {{"training", int64_t{1}}};
    d.side_effect = true;
    d.doc = "acc[i] += xs[i] for scalars xs (any number type) into an f32 state, in training "
            "only: step metrics summed on the device, read back every few steps. A value that "
            "is not finite is left out (the update skips that step too)";
    d.infer = [](const InferCtx& c) {
      if (c.g.value(c.in[0]).kind != ValueKind::state) c.fail("acc must be a state value (Graph::state)");
      c.expect_dtype(0, DType::f32);
      if (c.shape(0) != Shape{static_cast<int64_t>(c.n() - 1)}) c.fail("acc must have one entry per value, [", c.n() - 1, "]");
      for (size_t i = 1; i < c.n(); ++i)
        if (c.type(i).numel() != 1) c.fail("input ", i, " must be a scalar");
      return std::vector<TensorType>{};
    };
  }
  {
    OpDef& d = def(t, Op::dropout);
    d.name = "dropout";
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.attrs = {{"p", 0.5}, {"stream", int64_t{0}}, {"training", int64_t{1}}};
    d.doc = "zeroes elements with probability p, scales the rest by 1/(1-p); mask from "
            "Philox(seed, step, stream, index)";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      double p = c.attrs.f("p");
      if (!(p >= 0 && p < 1)) c.fail("p must be in [0, 1), got ", p);
      return same_as(c, 0);
    };
    d.grad = [](GradCtx& c) { c.set(0, c.g.add1(Op::dropout_grad, {c.dy().id()}, c.attrs())); };
  }
  {
    OpDef& d = def(t, Op::dropout_grad);
    d.name = "dropout_grad";
    d.inputs = {"dy"};
    d.outputs = {"dx"};
    d.attrs = def(t, Op::dropout).attrs;
    d.doc = "dx = dy * mask / (1-p), the forward mask recomputed";
    d.infer = [](const InferCtx& c) { return same_as(c, 0); };
  }
  {
    OpDef& d = def(t, Op::embedding);
    d.name = "embedding";
    d.inputs = {"ids", "weight"};
    d.outputs = {"y"};
    d.doc = "y[..., :] = weight[ids[...], :]";
    d.infer = [](const InferCtx& c) {
      c.expect_dtype(0, DType::i32);
      c.expect_float(1);
      c.expect_rank(1, 2);
      Shape s = c.shape(0);
      s.push_back(c.shape(1)[1]);
      return std::vector<TensorType>{{c.type(1).dtype, s}};
    };
    d.grad = [](GradCtx& c) {
      c.set(1, c.g.add1(Op::embedding_grad, {c.dy().id(), c.x(0).id()},
                        {{"num", c.x(1).dim(0)}}));
    };
  }
  {
    OpDef& d = def(t, Op::embedding_grad);
    d.name = "embedding_grad";
    d.inputs = {"dy", "ids", "acc?"};
    d.outputs = {"dweight"};
    d.attrs = {{"num", int64_t{0}, true}};
    // acc: another gradient of the same weight (a tied output projection's), which the
    // rows are added into (sums_into_embedding_grads), in its own dtype.
    d.in_place = {0, 2};
    d.doc = "dweight = acc (or zeros) + the sum of dy[i, :] over the positions i whose id names each row";
    d.infer = [](const InferCtx& c) {
      c.expect_dtype(1, DType::i32);
      Shape s = c.shape(1);
      s.push_back(c.shape(0).back());
      if (s != c.shape(0)) c.fail("dy must have shape ids + [dim]");
      const Shape out{c.attrs.i("num"), c.shape(0).back()};
      if (c.n() < 3) return std::vector<TensorType>{{c.type(0).dtype, out}};
      const DType a = c.type(2).dtype, dy = c.type(0).dtype;
      if (c.shape(2) != out) c.fail("acc must have dweight's shape ", shape_str(out), ", got ", shape_str(c.shape(2)));
      if (a != dy && a != compute_dtype(dy))
        c.fail("acc must have dy's dtype or the one it computes in (", dtype_name(compute_dtype(dy)), "), got ",
               dtype_name(a));
      return std::vector<TensorType>{{a, out}};
    };
  }
}

Var full(Graph& g, Shape shape, double value, DType dtype) {
  return g.add1(Op::full, {}, {{"shape", shape}, {"value", value}, {"dtype", std::string(dtype_name(dtype))}});
}
Var cast(Var x, DType to) {
  return x.graph().add1(Op::cast, {x.id()}, {{"dtype", std::string(dtype_name(to))}});
}
Var copy(Var x) { return x.graph().add1(Op::copy, {x.id()}); }
Var stop_gradient(Var x) { return x.graph().add1(Op::stop_gradient, {x.id()}); }
Var argmax(Var x, int64_t axis) { return x.graph().add1(Op::argmax, {x.id()}, {{"axis", axis}}); }
Var count_equal(Var a, Var b) { return a.graph().add1(Op::count_equal, {a.id(), b.id()}); }
void accumulate(Var acc, const std::vector<Var>& xs) {
  std::vector<ValueId> in{acc.id()};
  for (auto& x : xs) in.push_back(x.id());
  acc.graph().add(Op::accumulate, in);
}
Var dropout(Var x, double p) {
  // The node's position is unique in its graph, so it names this dropout's random stream.
  auto stream = static_cast<int64_t>(x.graph().nodes().size());
  return x.graph().add1(Op::dropout, {x.id()}, {{"p", p}, {"stream", stream}});
}
Var embedding(Var ids, Var weight) { return ids.graph().add1(Op::embedding, {ids.id(), weight.id()}); }

}  // namespace seam
