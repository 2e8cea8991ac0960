// conv2d, NCHW or NHWC (src/ops/layout.h), with stride, padding, dilation and groups. Its
// gradients are separate ops so that a first layer's input gradient is never computed.
// `activation` relu (fuse_conv_activations): conv2d applies relu to its result, and
// conv2d_grad_input masks its result by r > 0 (r, the relu output the convolution read).
// conv2d_grad_input with `residual` 1 adds z, another gradient of the same x, to its
// result: the sum of x's gradients when x is read twice (a residual block's input).
#include "ops/geometry.h"
#include "ops/layout.h"
#include "ops/registry.h"

namespace seam {

namespace {

std::vector<AttrSpec> conv_attrs() {
  return {{"stride", std::vector<int64_t>{1, 1}},
          {"padding", std::vector<int64_t>{0, 0}},
          {"dilation", std::vector<int64_t>{1, 1}},
          {"groups", int64_t{1}},
          {"layout", std::string("nchw")}};
}

// Checks x [N, C, H, W] against w [O, C/g, kh, kw] (NCHW order); returns the output shape.
Shape conv_out_nchw(const InferCtx& c, const Shape& x, const Shape& w) {
  const auto& st = c.attrs.ints("stride");
  const auto& pd = c.attrs.ints("padding");
  const auto& dl = c.attrs.ints("dilation");
  int64_t g = c.attrs.i("groups");
  if (st.size() != 2 || pd.size() != 2 || dl.size() != 2) c.fail("stride, padding and dilation need 2 entries each");
  for (int i = 0; i < 2; ++i)
    if (st[i] < 1 || pd[i] < 0 || dl[i] < 1) c.fail("stride and dilation must be >= 1, padding >= 0");
  if (x.size() != 4) c.fail("x must be [N, C, H, W], got ", shape_str(x));
  if (w.size() != 4) c.fail("w must be [C_out, C_in/groups, kh, kw], got ", shape_str(w));
  if (g < 1 || x[1] % g || w[0] % g) c.fail("groups=", g, " must divide C_in=", x[1], " and C_out=", w[0]);
  if (w[1] * g != x[1]) c.fail("w expects ", w[1] * g, " input channels, x has ", x[1]);
  // Checked before window_out: its division truncates toward zero, so a kernel
  // overhanging the input by less than a stride would still get an output of 1.
  for (int i = 0; i < 2; ++i) {
    int64_t extent = dl[i] * (w[2 + i] - 1) + 1;
    if (x[2 + i] + 2 * pd[i] < extent)
      c.fail("the kernel (", w[2 + i], " with dilation ", dl[i], " spans ", extent, ") does not fit the padded input (",
             x[2 + i], " + 2*", pd[i], ") along ", i == 0 ? "H" : "W");
  }
  return {x[0], w[0], window_out(x[2], w[2], st[0], pd[0], dl[0]), window_out(x[3], w[3], st[1], pd[1], dl[1])};
}

// The same on shapes in the node's layout, the result in it too.
Shape conv_out_shape(const InferCtx& c, const Shape& x, const Shape& w) {
  if (!c.nhwc()) return conv_out_nchw(c, x, w);
  if (x.size() != 4) c.fail("x must be [N, H, W, C] (layout nhwc), got ", shape_str(x));
  if (w.size() != 4) c.fail("w must be [C_out, kh, kw, C_in/groups] (layout nhwc), got ", shape_str(w));
  return nhwc_order(conv_out_nchw(c, nchw_order(x), nchw_order(w)));
}

// The `activation` attribute: "none" or "relu"; true for relu.
bool expect_activation(const InferCtx& c) {
  const std::string& a = c.attrs.s("activation");
  if (a != "none" && a != "relu") c.fail("activation must be \"none\" or \"relu\", got \"", a, "\"");
  return a == "relu";
}

// w in either layout: the product of its last three dims is C_in/groups * kh * kw.
double conv_flops(const Shape& y, const Shape& w) {
  return 2.0 * static_cast<double>(numel(y)) * static_cast<double>(w[1] * w[2] * w[3]);
}

}  // namespace

void register_conv(OpTable& t) {
  {
    OpDef& d = def(t, Op::conv2d);
    d.name = "conv2d";
    d.inputs = {"x", "w", "b?"};
    d.outputs = {"y"};
    d.attrs = conv_attrs();
    d.attrs.push_back({"activation", std::string("none")});
    d.doc = "2D cross-correlation (as torch.nn.functional.conv2d), NCHW, or NHWC with w [C_out, kh, kw, C_in/groups]; "
            "activation relu: relu of the result";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      c.expect_same_dtype();
      expect_activation(c);
      Shape y = conv_out_shape(c, c.shape(0), c.shape(1));
      const int64_t channels = c.nhwc() ? y[3] : y[1];
      if (c.n() == 3 && c.shape(2) != Shape{channels}) c.fail("b must have shape [", channels, "]");
      return std::vector<TensorType>{{c.type(0).dtype, y}};
    };
    d.flops = [](const OpCostCtx& c) { return conv_flops(c.out[0].shape, c.in[1].shape); };
    d.grad = [](GradCtx& c) {
      Var x = c.x(0), w = c.x(1), dy = c.dy();
      if (c.attrs().s("activation") == "relu") dy = c.g.var(c.g.add(Op::relu_grad, {dy.id(), c.y().id()}).at(0));
      Attrs plain;  // the geometry: the gradients apply no activation of their own
      for (const auto& [name, value] : c.attrs().items())
        if (name != "activation") plain.set(name, value);
      if (c.needs(0)) {
        Attrs a = plain;
        a.set("shape", x.shape());
        c.set(0, c.g.add1(Op::conv2d_grad_input, {dy.id(), w.id()}, a));
      }
      if (c.needs(1)) {
        Attrs a = plain;
        a.set("shape", w.shape());
        c.set(1, c.g.add1(Op::conv2d_grad_weight, {dy.id(), x.id()}, a));
      }
      if (c.needs(2)) c.set(2, sum(dy, is_nhwc(c.attrs()) ? std::vector<int64_t>{0, 1, 2} : std::vector<int64_t>{0, 2, 3}));
    };
  }
  for (Op op : {Op::conv2d_grad_input, Op::conv2d_grad_weight}) {
    OpDef& d = def(t, op);
    d.name = op_name(op);
    bool input = op == Op::conv2d_grad_input;
    d.inputs = {"dy", input ? "w" : "x"};
    if (input) d.inputs.push_back("r_or_z?");  // r with activation relu, z with residual 1
    d.outputs = {input ? "dx" : "dw"};
    d.attrs = conv_attrs();
    d.attrs.push_back({"shape", std::vector<int64_t>{}, true});
    // The weight gradient may be written in f32 from 16-bit operands (fold_casts: the
    // master weight's gradient without a cast kernel).
    if (!input) d.attrs.push_back({"dtype", std::string()});
    // The input gradient may absorb relu's derivative: dx masked by r > 0.
    // Or take z, another gradient of x, into its sum (not both: the fusion pass makes one).
    if (input) d.attrs.push_back({"activation", std::string("none")});
    if (input) d.attrs.push_back({"residual", int64_t{0}});
    d.doc = input ? "gradient of conv2d with respect to x; activation relu: masked by r > 0, the gradient of the "
                    "pre-activation whose relu r is x; residual 1: plus z (x's other gradient)"
                  : "gradient of conv2d with respect to w, in `dtype` (\"\": x's; f32 for 16-bit x)";
    d.infer = [input](const InferCtx& c) {
      c.expect_same_dtype();
      const Shape& s = c.attrs.ints("shape");
      if (input) {
        const bool relu = expect_activation(c);
        const int64_t residual = c.attrs.i("residual");
        if (residual != 0 && residual != 1) c.fail("residual must be 0 or 1, got ", residual);
        if (relu && residual) c.fail("relu's mask and a residual z are not taken together");
        if (relu != (c.n() == 3 && !residual)) c.fail("r is given with activation relu, and only then");
        if (residual && c.n() != 3) c.fail("z is given with residual 1, and only then");
        if (c.n() == 3 && c.shape(2) != s)
          c.fail(relu ? "r" : "z", " has shape ", shape_str(c.shape(2)), ", x ", shape_str(s));
      }
      Shape y = input ? conv_out_shape(c, s, c.shape(1)) : conv_out_shape(c, c.shape(1), s);
      if (y != c.shape(0)) c.fail("dy has shape ", shape_str(c.shape(0)), ", the convolution gives ", shape_str(y));
      return std::vector<TensorType>{{input ? c.type(0).dtype : c.result_dtype(c.type(0).dtype), s}};
    };
    d.flops = [input](const OpCostCtx& c) {
      return conv_flops(c.in[0].shape, input ? c.in[1].shape : c.out[0].shape);
    };
    // The input gradient is also the transposed convolution (ONNX ConvTranspose): linear
    // in dy and in w, <dx, g> = <dy, conv2d(g, w)>, so dy's gradient is conv2d(g, w) and
    // w's conv2d_grad_weight(dy, g).
    if (input)
      d.grad = [](GradCtx& c) {
        if (c.attrs().s("activation") != "none" || c.attrs().i("residual") != 0)
          fail("conv2d_grad_input node '", c.node.name, "' with relu's mask or a residual is not differentiated (it is "
               "made by a fusion pass, after the gradients)");
        Var g = c.dy(), dy = c.x(0), w = c.x(1);
        Attrs geometry;
        for (const auto& [name, value] : c.attrs().items())
          if (name != "shape" && name != "activation" && name != "residual") geometry.set(name, value);
        if (c.needs(0)) c.set(0, c.g.add1(Op::conv2d, {g.id(), w.id()}, geometry));
        if (c.needs(1)) {
          Attrs a = geometry;
          a.set("shape", w.shape());
          c.set(1, c.g.add1(Op::conv2d_grad_weight, {dy.id(), g.id()}, a));
        }
      };
  }
  {
    // Inference: a convolution and the batch norm after it with its running statistics,
    // y = act((conv(x, w) - running_mean) / sqrt(running_var + eps) * gamma + beta + z),
    // as fuse_conv_activations folds them where nothing differentiates them.
    OpDef& d = def(t, Op::conv2d_bn);
    d.name = "conv2d_bn";
    d.inputs = {"x", "w", "gamma", "beta", "running_mean", "running_var", "z?"};
    d.outputs = {"y"};
    d.attrs = conv_attrs();
    d.attrs.push_back({"eps", 1e-5});
    d.attrs.push_back({"activation", std::string("none")});
    d.doc = "inference: conv2d (no bias), then batch norm with the running statistics, plus a residual z, then the "
            "activation; per-channel operands in x's dtype or the one it computes in";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      if (c.type(1).dtype != c.type(0).dtype) c.fail("w must share x's dtype");
      c.expect_dtype_or_compute(0, {2, 3, 4, 5});
      const bool act = expect_activation(c);
      Shape y = conv_out_shape(c, c.shape(0), c.shape(1));
      const Shape ch{c.nhwc() ? y[3] : y[1]};
      for (size_t i = 2; i < 6; ++i) {
        if (c.shape(i) != ch) c.fail("input ", i, " must have shape ", shape_str(ch));
        if (c.type(i).dtype != c.type(2).dtype) c.fail("gamma, beta and the running statistics must share one dtype");
      }
      if (c.n() == 7 && (!act || c.type(6).dtype != c.type(0).dtype || c.shape(6) != y))
        c.fail("a residual z needs activation relu and the result's dtype and shape");
      if (!(c.attrs.f("eps") > 0)) c.fail("eps must be > 0, got ", c.attrs.f("eps"));
      return std::vector<TensorType>{{c.type(0).dtype, y}};
    };
    d.flops = [](const OpCostCtx& c) { return conv_flops(c.out[0].shape, c.in[1].shape); };
    d.grad = [](GradCtx& c) {
      fail("conv2d_bn node '", c.node.name, "' is an inference step: differentiate conv2d and batch_norm instead");
    };
  }
}

Var conv2d(Var x, Var w, std::optional<Var> b, const Conv2dOptions& o) {
  std::vector<ValueId> in{x.id(), w.id()};
  if (b) in.push_back(b->id());
  return x.graph().add1(Op::conv2d, in,
                        {{"stride", o.stride}, {"padding", o.padding}, {"dilation", o.dilation}, {"groups", o.groups}});
}

}  // namespace seam
