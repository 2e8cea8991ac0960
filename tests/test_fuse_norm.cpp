// Batch norm + ReLU fusion (src/passes/fuse_norm.cpp): the op with activation relu and
// its gradient against finite differences, and the pass on a residual network.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "grad_check.h"
#include "layout_case.h"
#include "plan/explain.h"
#include "seam/seam.h"
#include "test_util.h"

namespace seam::testing {
namespace {

Var bn_relu(GradCase& c, const Shape& s) {
  Shape ch{s[1]};
  return c.g.add1(Op::batch_norm,
                  {c.param("x", s, -2, 2).id(), c.param("gamma", ch).id(), c.param("beta", ch).id(),
                   c.state("rm", ch, 0.2).id(), c.state("rv", ch, 0.7).id()},
                  {{"activation", std::string("relu")}});
}

TEST(FuseNorm, BatchNormWithReluMatchesFiniteDifferences) {
  for (Mode mode : {Mode::train, Mode::eval}) {
    GradCheckOptions o;
    o.mode = mode;
    for (Shape s : {Shape{6, 3}, Shape{2, 3, 2, 3}}) {
      SCOPED_TRACE(shape_str(s) + (mode == Mode::train ? " train" : " eval"));
      check_gradients([&](GradCase& c) { return bn_relu(c, s); }, o);
    }
  }
}

// relu(normalized + z) as one op (what the pass makes of a residual add): z's gradient
// and x's through relu's mask.
Var bn_add_relu(GradCase& c, const Shape& s) {
  Shape ch{s[1]};
  return c.g.add1(Op::batch_norm,
                  {c.param("x", s, -2, 2).id(), c.param("gamma", ch).id(), c.param("beta", ch).id(),
                   c.state("rm", ch, 0.2).id(), c.state("rv", ch, 0.7).id(), c.param("z", s, -1, 1).id()},
                  {{"activation", std::string("relu")}});
}

TEST(FuseNorm, BatchNormWithResidualAndReluMatchesFiniteDifferences) {
  for (Mode mode : {Mode::train, Mode::eval}) {
    GradCheckOptions o;
    o.mode = mode;
    for (Shape s : {Shape{6, 3}, Shape{2, 3, 2, 3}}) {
      SCOPED_TRACE(shape_str(s) + (mode == Mode::train ? " train" : " eval"));
      check_gradients([&](GradCase& c) { return bn_add_relu(c, s); }, o);
    }
  }
}

TEST(FuseNorm, AResidualNeedsReluAndXsType) {
  Graph g;
  Var x = g.input("x", {4, 3, 2, 2});
  std::vector<ValueId> in{x.id(), g.param("gamma", {3}, Init::ones()).id(), g.param("beta", {3}, Init::zeros()).id(),
                          g.state("rm", {3}, Init::zeros()).id(), g.state("rv", {3}, Init::ones()).id()};
  auto error_of = [&](ValueId z, const std::string& act) {
    std::vector<ValueId> six = in;
    six.push_back(z);
    try {
      g.add(Op::batch_norm, six, {{"activation", act}});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(x.id(), "none").find("a residual z is given with activation relu only"), std::string::npos);
  const Var small = g.input("small", {4, 3, 2, 1});
  EXPECT_NE(error_of(small.id(), "relu").find("z must be x's dtype and shape f32[4,3,2,2], got f32[4,3,2,1]"),
            std::string::npos)
      << error_of(small.id(), "relu");
  EXPECT_EQ(error_of(g.input("z", {4, 3, 2, 2}).id(), "relu"), "no error");
}

// Two identity-shortcut blocks: relu(bn(conv(h)) + h) folds into the batch norm in both;
// the first block's input comes from a batch norm + relu, its output feeds the second.
struct ResidualNet {
  Graph g;
  Var loss;
  ResidualNet() {
    Var x = g.input("x", {4, 3, 8, 8});
    Var y = g.input("y", {4}, DType::i32);
    Var h = relu(nn::batch_norm(nn::conv2d(x, 8, 3, "stem", {.padding = {1, 1}}, false), "stem_bn"));
    for (int b = 0; b < 2; ++b) {
      const std::string p = "b" + std::to_string(b);
      Var r = relu(nn::batch_norm(nn::conv2d(h, 8, 3, p + "c1", {.padding = {1, 1}}, false), p + "bn1"));
      r = nn::batch_norm(nn::conv2d(r, 8, 3, p + "c2", {.padding = {1, 1}}, false), p + "bn2");
      h = relu(b == 0 ? add(r, h) : add(h, r));  // the residual on either side of the add
    }
    loss = cross_entropy(nn::linear(global_avg_pool(h), 10, "fc"), y);
  }
  void feed(Program& p, uint64_t step) const {
    const auto x = random_floats(4 * 3 * 8 * 8, 500 + step);
    const auto y = random_labels(4, 10, 600 + step);
    p.set_input("x", std::span<const float>(x));
    p.set_input("y", std::span<const int32_t>(y));
  }
};

int count_residual_norms(const Plan& p) {
  int n = 0;
  for (const PlanStep& s : p.steps) n += s.op == Op::batch_norm && s.in.size() == 6;
  return n;
}

TEST(FuseNorm, ResidualAddAndReluFoldIntoTheBatchNormAndTrainAsUnfused) {
  for (LayoutPolicy layout : {LayoutPolicy::nchw, LayoutPolicy::nhwc}) {
    SCOPED_TRACE(layout == LayoutPolicy::nhwc ? "nhwc" : "nchw");
    ResidualNet net;
    FusedAndPlain m(net.g, net.loss, 7, layout);
    const Program& fused = m.fused;
    EXPECT_EQ(count_residual_norms(fused.plan()), 2);
    EXPECT_EQ(count_with_relu(fused.plan(), Op::batch_norm), 5);
    EXPECT_EQ(count_with_relu(fused.plan(), Op::batch_norm_grad), 5);
    int residual_grads = 0;
    for (const PlanStep& s : fused.plan().steps)
      residual_grads += s.op == Op::batch_norm_grad && s.out.size() == 4 && s.attrs.i("residual") == 1;
    EXPECT_EQ(residual_grads, 2);
    EXPECT_EQ(count(fused.plan(), Op::relu), 0);
    EXPECT_EQ(count(fused.plan(), Op::relu_grad), 0);
    const std::string text = explain_plan(fused.plan(), fused.plan(), DeviceModel{}, false);
    EXPECT_NE(text.find("fused: residual add and relu applied before the normalized value is stored"),
              std::string::npos)
        << text;
    m.train(net);
  }
}

// A residual made after the batch norm (the downsampling shortcut's convolution written
// second) leaves the add to elementwise fusion: the fused step would read it before it exists.
TEST(FuseNorm, AResidualMadeLaterIsNotFused) {
  Graph g;
  Var x = g.input("x", {4, 3, 6, 6});
  Var n = nn::batch_norm(nn::conv2d(x, 4, 3, "c", {.padding = {1, 1}}), "bn");
  Var s = nn::conv2d(x, 4, 1, "shortcut");
  Var out = relu(add(n, s));
  Model m(g, {.seed = 1});
  Program p = m.compile({.mode = Mode::eval, .outputs = {out.id()}});
  EXPECT_EQ(count_residual_norms(p.plan()), 0);
}

// A per-channel term broadcast into the add is not a residual of x's shape: the add and
// the relu stay as they are (and the batch norm, read by the add, plain).
TEST(FuseNorm, ABroadcastAddIsNotAResidual) {
  Graph g;
  Var x = g.input("x", {4, 3, 6, 6});
  Var n = nn::batch_norm(nn::conv2d(x, 4, 3, "c", {.padding = {1, 1}}), "bn");
  Var out = relu(add(n, g.param("shift", {4, 1, 1}, Init::zeros())));
  Model m(g, {.seed = 1});
  Program p = m.compile({.mode = Mode::eval, .outputs = {out.id()}});
  EXPECT_EQ(count_residual_norms(p.plan()), 0);
  EXPECT_EQ(count_with_relu(p.plan(), Op::batch_norm), 0);
}

// A fused batch norm written by hand goes through the precision pass like any: at bf16 its
// residual (an f32 input here) is cast to x's dtype, not to the f32 its statistics take.
TEST(FuseNorm, TheResidualTakesXsDtypeUnderAMixedPolicy) {
  Graph g;
  Var x = g.input("x", {4, 3, 6, 6});
  Var z = g.input("z", {4, 4, 6, 6});
  Var c = nn::conv2d(x, 4, 3, "c", {.padding = {1, 1}});
  const Shape ch{4};
  Var out = g.add1(Op::batch_norm,
                   {c.id(), g.param("gamma", ch, Init::ones(), false).id(), g.param("beta", ch, Init::zeros(), false).id(),
                    g.state("rm", ch, Init::zeros()).id(), g.state("rv", ch, Init::ones()).id(), z.id()},
                   {{"activation", std::string("relu")}});
  Model m(g, {.seed = 1, .precision = Precision::bf16});
  Program p = m.compile({.mode = Mode::eval, .outputs = {out.id()}});
  int fused = 0;
  for (const PlanStep& s : p.plan().steps)
    if (s.op == Op::batch_norm) {
      ASSERT_EQ(s.in.size(), 6u);
      EXPECT_EQ(s.in[0].type.dtype, DType::bf16);
      EXPECT_EQ(s.in[5].type.dtype, DType::bf16);
      EXPECT_EQ(s.in[1].type.dtype, DType::f32);
      ++fused;
    }
  EXPECT_EQ(fused, 1);
}

// Pre-norm residual blocks as a transformer has them: h + f(layer_norm(h)), twice, then a
// final layer norm. Each residual stream value is read by a layer norm and by the next
// add, so its gradient is an add of two; both fold into the layer norms' gradients.
Var pre_norm_blocks(Var h, const std::function<Var(Var, const std::string&)>& param) {
  Var a = layer_norm(h, param(h, "g1"), param(h, "b1"));
  h = add(h, gelu(a, true));
  Var b = layer_norm(h, param(h, "g2"), param(h, "b2"));
  h = add(mul(b, b), h);  // the residual on the other side
  return layer_norm(h, param(h, "g3"), param(h, "b3"));
}

TEST(FuseNorm, ResidualGradientsFoldIntoLayerNormGradsAndMatchFiniteDifferences) {
  for (Shape s : {Shape{3, 7}, Shape{2, 3, 16}}) {
    SCOPED_TRACE(shape_str(s));
    check_gradients([&](GradCase& c) {
      return pre_norm_blocks(c.param("x", s, -2, 2), [&](Var, const std::string& name) {
        return c.param(name, {s.back()}, 0.5, 1.5);
      });
    });
  }
}

// A classifier around `blocks` (8 x 24 inputs to 32 wide, 10 classes), its parameters
// made by blocks' own param(name, shape) with gammas near 1.
struct NormNet {
  using Param = std::function<Var(const std::string&, Shape)>;
  Graph g;
  Var loss;
  uint64_t seed;
  NormNet(const std::function<Var(Var, const Param&)>& blocks, uint64_t data_seed) : seed(data_seed) {
    Var x = g.input("x", {8, 24});
    Var y = g.input("y", {8}, DType::i32);
    Var h = blocks(nn::linear(x, 32, "in"), [&](const std::string& name, Shape shape) {
      const Init init = name[0] == 'g' ? Init::uniform(0.5, 1.5) : Init::uniform(-0.5, 0.5);
      return g.param(name, shape, init);
    });
    loss = cross_entropy(nn::linear(h, 10, "out"), y);
  }
  void feed(Program& p, uint64_t step) const {
    const auto x = random_floats(8 * 24, seed + step);
    const auto y = random_labels(8, 10, seed + 100 + step);
    p.set_input("x", std::span<const float>(x));
    p.set_input("y", std::span<const int32_t>(y));
  }
};

TEST(FuseNorm, ResidualGradientsFoldIntoLayerNormGradsAndTrainAsUnfused) {
  int n = 0;
  NormNet net(
      [&](Var h, const NormNet::Param& param) {
        return pre_norm_blocks(h, [&](Var v, const std::string& name) {
          return param(name + std::to_string(n++), {v.type().shape.back()});
        });
      },
      700);
  FusedAndPlain m(net.g, net.loss, 9, LayoutPolicy::nchw, false);
  int summed = 0;
  for (const PlanStep& s : m.fused.plan().steps) summed += s.op == Op::layer_norm_grad && s.in.size() == 6;
  EXPECT_EQ(summed, 2);
  EXPECT_EQ(count(m.plain.plan(), Op::layer_norm_grad), 3);
  // The plain backward's adds of two residual gradients are gone; the forward's two stay.
  EXPECT_EQ(count(m.fused.plan(), Op::add), count(m.plain.plan(), Op::add) - 2);
  m.train(net);
}

// Residual projections as a pre-norm transformer has them: h + linear(layer_norm(h)), the
// sum read by the next layer norm, whose gradient's dx is the projection's output
// gradient: the projection's bias gradient is that dx's column sums.
Var projected_blocks(Var h, const std::function<Var(const std::string&, Shape)>& param) {
  const int64_t d = h.type().shape.back();
  for (int k = 0; k < 2; ++k) {
    const std::string i = std::to_string(k);
    Var a = layer_norm(h, param("g" + i, {d}), param("b" + i, {d}));
    h = add(h, h.graph().add1(Op::linear, {a.id(), param("w" + i, {d, d}).id(), param("c" + i, {d}).id()}));
  }
  return layer_norm(h, param("g2", {d}), param("b2", {d}));
}

int count_dx_sums(const Plan& p) {
  int n = 0;
  for (const PlanStep& s : p.steps) n += s.op == Op::layer_norm_grad && s.out.size() == 4;
  return n;
}

TEST(FuseNorm, BiasGradientsFromLayerNormGradsMatchFiniteDifferences) {
  for (Shape s : {Shape{5, 6}, Shape{2, 3, 8}}) {
    SCOPED_TRACE(shape_str(s));
    check_gradients([&](GradCase& c) {
      return projected_blocks(c.param("x", s, -2, 2), [&](const std::string& name, Shape shape) {
        return name[0] == 'g' ? c.param(name, shape, 0.5, 1.5) : c.param(name, shape, -0.5, 0.5);
      });
    });
  }
}

TEST(FuseNorm, BiasGradientsFromLayerNormGradsTrainAsUnfused) {
  NormNet net(projected_blocks, 900);
  FusedAndPlain m(net.g, net.loss, 11, LayoutPolicy::nchw, false);
  // Both projections' bias gradients come from the layer norm gradients after them, and
  // the input layer's too (its output's two gradients, the first layer norm's and the
  // residual's, are summed there by sum_into_norm_grads); the output layer's, whose dy is
  // the loss's gradient, from its input gradient's GEMM (bias_grads_into_data_grads).
  EXPECT_EQ(count_dx_sums(m.fused.plan()), 3);
  EXPECT_EQ(count(m.fused.plan(), Op::linear_grad_weight_bias), 0);
  EXPECT_EQ(count(m.fused.plan(), Op::linear_grad_input_bias), 1);
  EXPECT_EQ(count(m.plain.plan(), Op::linear_grad_weight_bias), 4);
  m.train(net);
  // In bf16 with f32 master weights too: db is f32 there once its cast folds into the
  // weight gradient, as gamma's gradient is.
  Model low(net.g, {.seed = 11, .precision = Precision::bf16});
  EXPECT_EQ(count_dx_sums(low.compile({.loss = net.loss.id(), .optimizer = FusedAndPlain::kSgd}).plan()), 3);
}

// dx_sums takes 0 or 1, and with 1 the step has a fourth output in gamma's dtype.
TEST(FuseNorm, DxSumsIsAFlag) {
  Graph g;
  Var x = g.input("x", {4, 6});
  Var gamma = g.param("gamma", {6}, Init::ones());
  auto stats = g.add(Op::layer_norm, {x.id(), gamma.id(), g.param("beta", {6}, Init::zeros()).id()});
  const std::vector<ValueId> in{x.id(), x.id(), stats[1], stats[2], gamma.id()};
  auto out = g.add(Op::layer_norm_grad, in, {{"dx_sums", int64_t{1}}});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(g.value(out[3]).type, (TensorType{DType::f32, {6}}));
  EXPECT_EQ(g.add(Op::layer_norm_grad, in).size(), 3u);
  EXPECT_NE(error_of([&] { g.add(Op::layer_norm_grad, in, {{"dx_sums", int64_t{2}}}); })
                .find("dx_sums must be 0 or 1, got 2"),
            std::string::npos);
}

TEST(FuseNorm, DrMustBeXsTypeAndShape) {
  Graph g;
  Var x = g.input("x", {4, 6});
  Var gamma = g.param("gamma", {6}, Init::ones());
  auto stats = g.add(Op::layer_norm, {x.id(), gamma.id(), g.param("beta", {6}, Init::zeros()).id()});
  const std::vector<ValueId> five{x.id(), x.id(), stats[1], stats[2], gamma.id()};
  auto with = [&](Var dr) {
    return error_of([&] {
      std::vector<ValueId> in = five;
      in.push_back(dr.id());
      g.add(Op::layer_norm_grad, in);
    });
  };
  EXPECT_NE(with(g.input("short", {4, 5})).find("dr must be x's dtype and shape f32[4,6], got f32[4,5]"),
            std::string::npos);
  EXPECT_NE(with(g.input("wide", {4, 6}, DType::f64)).find("dr must be x's dtype and shape"), std::string::npos);
  EXPECT_EQ(with(g.input("dr", {4, 6})), "");
}

TEST(FuseNorm, AnUnknownActivationIsAnError) {
  Graph g;
  Var x = g.input("x", {4, 3});
  std::vector<ValueId> in{x.id(), g.param("gamma", {3}, Init::ones()).id(), g.param("beta", {3}, Init::zeros()).id(),
                          g.state("rm", {3}, Init::zeros()).id(), g.state("rv", {3}, Init::ones()).id()};
  try {
    g.add(Op::batch_norm, in, {{"activation", std::string("gelu")}});
    ADD_FAILURE() << "no seam::Error thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("activation must be \"none\" or \"relu\", got \"gelu\""), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("batch_norm"), std::string::npos) << e.what();
  }
}

// batch_norm_grad takes beta and y exactly when it has an activation, y of x's type.
TEST(FuseNorm, TheGradientsInputsFollowItsActivation) {
  Graph g;
  Var dy = g.input("dy", {4, 3}), x = g.input("x", {4, 3}), y16 = g.input("y16", {4, 3}, DType::bf16);
  Var gamma = g.param("gamma", {3}, Init::ones()), beta = g.param("beta", {3}, Init::zeros());
  Var mean = g.input("mean", {3}), invstd = g.input("invstd", {3});
  const std::vector<ValueId> five{dy.id(), x.id(), gamma.id(), mean.id(), invstd.id()};
  auto error_of = [&](std::vector<ValueId> in, const std::string& act) {
    try {
      g.add(Op::batch_norm_grad, in, {{"activation", act}});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(five, "relu").find("beta and y are given with an activation, and only then"), std::string::npos);
  std::vector<ValueId> seven = five;
  seven.insert(seven.end(), {beta.id(), dy.id()});
  EXPECT_NE(error_of(seven, "none").find("beta and y are given with an activation, and only then"), std::string::npos);
  seven.back() = y16.id();
  EXPECT_NE(error_of(seven, "relu").find("y must be x's dtype and shape"), std::string::npos) << error_of(seven, "relu");
  seven.back() = dy.id();
  EXPECT_EQ(error_of(seven, "relu"), "no error");
}

// LayoutNet has three batch norms read only by a relu (the stem's and each block's
// first), and two whose relu follows a residual add (left to elementwise fusion).
TEST(FuseNorm, BatchNormThenReluIsOneStepEachWayAndTrainsAsUnfused) {
  for (LayoutPolicy layout : {LayoutPolicy::nchw, LayoutPolicy::nhwc}) {
    SCOPED_TRACE(layout == LayoutPolicy::nhwc ? "nhwc" : "nchw");
    LayoutNet net;
    FusedAndPlain m(net.g, net.loss, 4, layout);
    const Program &fused = m.fused, &plain = m.plain;
    EXPECT_EQ(count_with_relu(fused.plan(), Op::batch_norm), 3);
    EXPECT_EQ(count_with_relu(fused.plan(), Op::batch_norm_grad), 3);
    EXPECT_EQ(count(fused.plan(), Op::relu), 0);  // the two after the adds fuse with them
    EXPECT_EQ(count_with_relu(plain.plan(), Op::batch_norm), 0);
    m.train(net);
  }
}

// A normalized value read by anything besides its relu (here: requested) stays unfused.
TEST(FuseNorm, AValueReadElsewhereIsNotFused) {
  Graph g;
  Var x = g.input("x", {4, 3, 5, 5});
  Var n = nn::batch_norm(nn::conv2d(x, 4, 3, "c", {.padding = {1, 1}}), "bn");
  Var out = relu(n);
  Model m(g, {.seed = 1});
  Program p = m.compile({.mode = Mode::eval, .outputs = {out.id(), n.id()}});
  EXPECT_EQ(count_with_relu(p.plan(), Op::batch_norm), 0);
  Program q = m.compile({.mode = Mode::eval, .outputs = {out.id()}});
  EXPECT_EQ(count_with_relu(q.plan(), Op::batch_norm), 1);
  EXPECT_EQ(count(q.plan(), Op::relu), 0);
  const std::string text = explain_plan(q.plan(), q.plan(), DeviceModel{}, false);
  EXPECT_NE(text.find("fused: relu applied before the normalized value is stored"), std::string::npos) << text;
}

}  // namespace
}  // namespace seam::testing
