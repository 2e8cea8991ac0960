// sum, mean and broadcast_to: each is the other's gradient.
#include <algorithm>

#include "ops/registry.h"

namespace seam {

std::vector<int> reduce_axes(const std::vector<int64_t>& axes, size_t rank, const InferCtx* c) {
  std::vector<int> r;
  if (axes.empty())
    for (size_t i = 0; i < rank; ++i) r.push_back(static_cast<int>(i));
  for (int64_t a : axes) {
    int n = normalize_axis(a, rank);
    if (n < 0) {
      if (c) c->fail("axis ", a, " is out of range for rank ", rank);
      fail("axis ", a, " is out of range for rank ", rank);
    }
    if (std::find(r.begin(), r.end(), n) != r.end()) {
      if (c) c->fail("axis ", a, " is listed twice");
      fail("axis ", a, " is listed twice");
    }
    r.push_back(n);
  }
  std::sort(r.begin(), r.end());
  return r;
}

Shape reduced_shape(const Shape& in, const std::vector<int>& axes, bool keepdims) {
  Shape s;
  for (size_t i = 0; i < in.size(); ++i) {
    bool red = std::find(axes.begin(), axes.end(), static_cast<int>(i)) != axes.end();
    if (!red) s.push_back(in[i]);
    else if (keepdims) s.push_back(1);
  }
  return s;
}

namespace {

std::vector<TensorType> infer_reduce(const InferCtx& c) {
  c.expect_float(0);
  auto axes = reduce_axes(c.attrs.ints("axes"), c.shape(0).size(), &c);
  return {{c.result_dtype(c.type(0).dtype), reduced_shape(c.shape(0), axes, c.attrs.i("keepdims") != 0)}};
}

// dy of a reduction, reshaped to keepdims form and broadcast back to x.
Var expand_back(GradCtx& c) {
  Var x = c.x(0);
  auto axes = reduce_axes(c.attrs().ints("axes"), x.rank(), nullptr);
  Var dy = c.dy();
  Shape kept = reduced_shape(x.shape(), axes, true);
  if (dy.shape() != kept) dy = reshape(dy, kept);
  return broadcast_to(dy, x.shape());
}

}  // namespace

void register_reduce(OpTable& t) {
  for (Op op : {Op::sum, Op::mean}) {
    OpDef& d = def(t, op);
    d.name = op_name(op);
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.attrs = {{"axes", std::vector<int64_t>{}}, {"keepdims", int64_t{0}}, {"dtype", std::string()}};
    d.doc = op == Op::sum ? "sum over axes (all if none), in `dtype` (\"\": x's; f32 for 16-bit x)"
                          : "mean over axes (all if none), in `dtype` (\"\": x's; f32 for 16-bit x)";
    d.infer = infer_reduce;
    d.flops = [](const OpCostCtx& c) { return static_cast<double>(c.in[0].numel()); };
    d.grad = [op](GradCtx& c) {
      Var g = expand_back(c);
      if (op == Op::mean)
        g = scale(g, static_cast<double>(c.y().type().numel()) / static_cast<double>(c.x(0).type().numel()));
      c.set(0, g);
    };
  }
  {
    OpDef& d = def(t, Op::broadcast_to);
    d.name = "broadcast_to";
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.attrs = {{"shape", std::vector<int64_t>{}, true}};
    d.doc = "numpy broadcast of x to a shape";
    d.infer = [](const InferCtx& c) {
      const Shape& to = c.attrs.ints("shape");
      auto s = broadcast_shapes(c.shape(0), to);
      if (!s || *s != to) c.fail("cannot broadcast ", shape_str(c.shape(0)), " to ", shape_str(to));
      return std::vector<TensorType>{{c.type(0).dtype, to}};
    };
    d.grad = [](GradCtx& c) { c.set(0, sum_to(c.dy(), c.x(0).shape())); };
  }
}

Var sum(Var x, std::vector<int64_t> axes, bool keepdims) {
  return x.graph().add1(Op::sum, {x.id()}, {{"axes", axes}, {"keepdims", int64_t{keepdims}}});
}
Var mean(Var x, std::vector<int64_t> axes, bool keepdims) {
  return x.graph().add1(Op::mean, {x.id()}, {{"axes", axes}, {"keepdims", int64_t{keepdims}}});
}
Var broadcast_to(Var x, Shape shape) {
  return x.graph().add1(Op::broadcast_to, {x.id()}, {{"shape", shape}});
}

}  // namespace seam
