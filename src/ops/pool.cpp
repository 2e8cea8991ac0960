// Pooling over NCHW or NHWC windows (src/ops/layout.h). max_pool2d_grad recomputes the argmax from x rather than
// keeping an index tensor alive from forward to backward.
#include "ops/geometry.h"
#include "ops/layout.h"
#include "ops/registry.h"

namespace seam {

namespace {

std::vector<AttrSpec> pool_attrs(bool avg) {
  std::vector<AttrSpec> a{{"kernel", std::vector<int64_t>{}, true},
                          {"stride", std::vector<int64_t>{}},
                          {"padding", std::vector<int64_t>{0, 0}},
                          {"layout", std::string("nchw")}};
  if (avg) a.push_back({"count_include_pad", int64_t{1}});
  return a;
}

Shape pool_out_nchw(const InferCtx& c, const Shape& x) {
  const auto& k = c.attrs.ints("kernel");
  auto st = c.attrs.ints("stride");
  if (st.empty()) st = k;
  const auto& pd = c.attrs.ints("padding");
  if (x.size() != 4) c.fail("x must be [N, C, H, W], got ", shape_str(x));
  if (k.size() != 2 || st.size() != 2 || pd.size() != 2) c.fail("kernel, stride and padding need 2 entries each");
  for (int i = 0; i < 2; ++i) {
    if (k[i] < 1 || st[i] < 1 || pd[i] < 0) c.fail("kernel and stride must be >= 1, padding >= 0");
    if (2 * pd[i] > k[i]) c.fail("padding ", pd[i], " is more than half the kernel ", k[i]);
  }
  // Checked before window_out: its division truncates toward zero, so a window
  // overhanging the input by less than a stride would still get an output of 1.
  for (int i = 0; i < 2; ++i)
    if (x[2 + i] + 2 * pd[i] < k[i])
      c.fail("the window ", k[i], " does not fit the padded input (", x[2 + i], " + 2*", pd[i], ") along ",
             i == 0 ? "H" : "W");
  return {x[0], x[1], window_out(x[2], k[0], st[0], pd[0]), window_out(x[3], k[1], st[1], pd[1])};
}

// The same on a shape in the node's layout, the result in it too.
Shape pool_out_shape(const InferCtx& c, const Shape& x) {
  if (!c.nhwc()) return pool_out_nchw(c, x);
  if (x.size() != 4) c.fail("x must be [N, H, W, C] (layout nhwc), got ", shape_str(x));
  return nhwc_order(pool_out_nchw(c, nchw_order(x)));
}

}  // namespace

void register_pool(OpTable& t) {
  for (Op op : {Op::max_pool2d, Op::avg_pool2d}) {
    bool avg = op == Op::avg_pool2d;
    OpDef& d = def(t, op);
    d.name = op_name(op);
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.attrs = pool_attrs(avg);
    d.doc = avg ? "mean over each window (stride defaults to the kernel)"
                : "max over each window (stride defaults to the kernel)";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      return std::vector<TensorType>{{c.type(0).dtype, pool_out_shape(c, c.shape(0))}};
    };
    d.flops = [](const OpCostCtx& c) {
      const auto& k = c.attrs.ints("kernel");
      return static_cast<double>(c.out[0].numel() * k[0] * k[1]);
    };
    d.grad = [avg](GradCtx& c) {
      Attrs a = c.attrs();
      if (avg) {
        a.set("shape", c.x(0).shape());
        c.set(0, c.g.add1(Op::avg_pool2d_grad, {c.dy().id()}, a));
      } else {
        c.set(0, c.g.add1(Op::max_pool2d_grad, {c.dy().id(), c.x(0).id(), c.y().id()}, a));
      }
    };
  }
  {
    OpDef& d = def(t, Op::max_pool2d_grad);
    d.name = "max_pool2d_grad";
    d.inputs = {"dy", "x", "y"};
    d.outputs = {"dx"};
    d.attrs = pool_attrs(false);
    d.doc = "routes dy to the first maximum of each window (y: the forward output, which "
            "library kernels such as cuDNN's read)";
    d.infer = [](const InferCtx& c) {
      if (pool_out_shape(c, c.shape(1)) != c.shape(0)) c.fail("dy does not match the pooled shape of x");
      return std::vector<TensorType>{c.type(1)};
    };
  }
  {
    OpDef& d = def(t, Op::avg_pool2d_grad);
    d.name = "avg_pool2d_grad";
    d.inputs = {"dy"};
    d.outputs = {"dx"};
    d.attrs = pool_attrs(true);
    d.attrs.push_back({"shape", std::vector<int64_t>{}, true});
    d.doc = "spreads dy evenly over each window";
    d.infer = [](const InferCtx& c) {
      const Shape& s = c.attrs.ints("shape");
      if (pool_out_shape(c, s) != c.shape(0)) c.fail("dy does not match the pooled shape");
      return std::vector<TensorType>{{c.type(0).dtype, s}};
    };
  }
  {
    OpDef& d = def(t, Op::global_avg_pool);
    d.name = "global_avg_pool";
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.attrs = {{"layout", std::string("nchw")}};
    d.doc = "[N, C, H, W] (or [N, H, W, C] with layout nhwc) -> [N, C], the mean over H and W";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      c.expect_rank(0, 4);
      const Shape& x = c.shape(0);
      return std::vector<TensorType>{{c.type(0).dtype, {x[0], c.nhwc() ? x[3] : x[1]}}};
    };
    d.grad = [](GradCtx& c) {
      const Shape& x = c.x(0).shape();
      const bool nhwc = is_nhwc(c.attrs());
      const Shape kept = nhwc ? Shape{x[0], 1, 1, x[3]} : Shape{x[0], x[1], 1, 1};
      Var g = broadcast_to(reshape(c.dy(), kept), x);
      c.set(0, scale(g, 1.0 / static_cast<double>(nhwc ? x[1] * x[2] : x[2] * x[3])));
    };
  }
}

Var max_pool2d(Var x, std::vector<int64_t> kernel, std::vector<int64_t> stride, std::vector<int64_t> padding) {
  return x.graph().add1(Op::max_pool2d, {x.id()}, {{"kernel", kernel}, {"stride", stride}, {"padding", padding}});
}
Var avg_pool2d(Var x, std::vector<int64_t> kernel, std::vector<int64_t> stride, std::vector<int64_t> padding,
               bool count_include_pad) {
  return x.graph().add1(Op::avg_pool2d, {x.id()},
                        {{"kernel", kernel}, {"stride", stride}, {"padding", padding},
                         {"count_include_pad", int64_t{count_include_pad}}});
}
Var global_avg_pool(Var x) { return x.graph().add1(Op::global_avg_pool, {x.id()}); }

}  // namespace seam
