// Convolution + ReLU fusion (src/passes/fuse_conv.cpp): conv2d with activation relu,
// conv2d_grad_input masked by relu's output or adding a value's other gradient, against
// finite differences and against the unfused plan, in both layouts.
#include <gtest/gtest.h>

#include <cmath>

#include "grad_check.h"
#include "layout_case.h"
#include "plan/explain.h"
#include "seam/seam.h"
#include "test_util.h"

namespace seam::testing {
namespace {

const Attrs kPaddedRelu{{"padding", std::vector<int64_t>{1, 1}}, {"activation", std::string("relu")}};

TEST(FuseConv, ConvolutionWithReluMatchesFiniteDifferences) {
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    check_gradients([&](GradCase& c) {
      std::vector<ValueId> in{c.param("x", {2, 3, 5, 4}).id(), c.param("w", {4, 3, 3, 3}).id()};
      if (bias) in.push_back(c.param("b", {4}).id());
      return c.g.add1(Op::conv2d, in, kPaddedRelu);
    });
  }
}

// The input gradient with relu's mask is relu_grad of the plain one.
TEST(FuseConv, MaskedInputGradientIsReluGradOfThePlainOne) {
  Graph g;
  Var dy = g.input("dy", {2, 4, 5, 4});
  Var w = g.input("w", {4, 3, 3, 3});
  Var r = g.input("r", {2, 3, 5, 4});
  const Attrs geometry{{"padding", std::vector<int64_t>{1, 1}}, {"shape", std::vector<int64_t>{2, 3, 5, 4}}};
  Attrs masked_attrs = geometry;
  masked_attrs.set("activation", std::string("relu"));
  Var plain = g.add1(Op::relu_grad, {g.add1(Op::conv2d_grad_input, {dy.id(), w.id()}, geometry).id(), r.id()});
  Var masked = g.add1(Op::conv2d_grad_input, {dy.id(), w.id(), r.id()}, masked_attrs);
  Model m(g, {.seed = 1});
  Program p = m.compile({.mode = Mode::eval, .outputs = {plain.id(), masked.id()}, .fuse = false});
  p.set_input("dy", std::span<const float>(random_floats(2 * 4 * 5 * 4, 1)));
  p.set_input("w", std::span<const float>(random_floats(4 * 3 * 3 * 3, 2)));
  p.set_input("r", std::span<const float>(random_floats(2 * 3 * 5 * 4, 3)));
  p.run();
  const auto a = p.read_as<float>(plain.name()), b = p.read_as<float>(masked.name());
  EXPECT_EQ(a, b);
  int zeros = 0;
  for (float v : b) zeros += v == 0.0f;
  EXPECT_GT(zeros, 0);  // the mask took some
}

TEST(FuseConv, TheMaskNeedsReluAndRsShape) {
  Graph g;
  Var dy = g.input("dy", {2, 4, 5, 4});
  Var w = g.input("w", {4, 3, 3, 3});
  auto error_of = [&](std::vector<ValueId> in, const std::string& act) {
    try {
      g.add(Op::conv2d_grad_input, in,
            {{"padding", std::vector<int64_t>{1, 1}}, {"shape", std::vector<int64_t>{2, 3, 5, 4}}, {"activation", act}});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({dy.id(), w.id()}, "relu").find("r is given with activation relu, and only then"),
            std::string::npos);
  EXPECT_NE(error_of({dy.id(), w.id(), g.input("small", {2, 3, 5, 3}).id()}, "relu").find("r has shape [2,3,5,3]"),
            std::string::npos);
  EXPECT_NE(error_of({dy.id(), w.id()}, "gelu").find("activation must be \"none\" or \"relu\""), std::string::npos);
  EXPECT_EQ(error_of({dy.id(), w.id(), g.input("r", {2, 3, 5, 4}).id()}, "relu"), "no error");
}

// The input gradient with residual 1 is the plain one plus z, bit for bit.
TEST(FuseConv, InputGradientWithAResidualIsThePlainOnePlusZ) {
  for (bool pointwise : {false, true}) {
    SCOPED_TRACE(pointwise ? "1x1" : "3x3");
    Graph g;
    Var dy = g.input("dy", {2, 4, 5, 4});
    Var w = g.input("w", pointwise ? Shape{4, 3, 1, 1} : Shape{4, 3, 3, 3});
    Var z = g.input("z", {2, 3, 5, 4});
    const Attrs geometry{{"padding", std::vector<int64_t>{pointwise ? 0 : 1, pointwise ? 0 : 1}},
                         {"shape", std::vector<int64_t>{2, 3, 5, 4}}};
    Attrs summed_attrs = geometry;
    summed_attrs.set("residual", int64_t{1});
    Var plain = add(g.add1(Op::conv2d_grad_input, {dy.id(), w.id()}, geometry), z);
    Var summed = g.add1(Op::conv2d_grad_input, {dy.id(), w.id(), z.id()}, summed_attrs);
    Model m(g, {.seed = 1});
    Program p = m.compile({.mode = Mode::eval, .outputs = {plain.id(), summed.id()}, .fuse = false});
    p.set_input("dy", std::span<const float>(random_floats(2 * 4 * 5 * 4, 1)));
    p.set_input("w", std::span<const float>(random_floats(static_cast<size_t>(numel(w.shape())), 2)));
    p.set_input("z", std::span<const float>(random_floats(2 * 3 * 5 * 4, 3)));
    p.run();
    EXPECT_EQ(p.read_as<float>(plain.name()), p.read_as<float>(summed.name()));
  }
}

TEST(FuseConv, AResidualNeedsZOfXsShapeAndNoMask) {
  Graph g;
  Var dy = g.input("dy", {2, 4, 5, 4});
  Var w = g.input("w", {4, 3, 3, 3});
  Var z = g.input("z", {2, 3, 5, 4});
  auto error_of = [&](std::vector<ValueId> in, const std::string& act, int64_t residual) {
    try {
      g.add(Op::conv2d_grad_input, in,
            {{"padding", std::vector<int64_t>{1, 1}},
             {"shape", std::vector<int64_t>{2, 3, 5, 4}},
             {"activation", act},
             {"residual", residual}});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({dy.id(), w.id()}, "none", 1).find("z is given with residual 1, and only then"),
            std::string::npos);
  EXPECT_NE(error_of({dy.id(), w.id(), z.id()}, "none", 0).find("r is given with activation relu, and only then"),
            std::string::npos);
  EXPECT_NE(error_of({dy.id(), w.id(), z.id()}, "relu", 1).find("relu's mask and a residual z are not taken together"),
            std::string::npos);
  EXPECT_NE(error_of({dy.id(), w.id(), g.input("small", {2, 3, 5, 3}).id()}, "none", 1).find("z has shape [2,3,5,3]"),
            std::string::npos);
  EXPECT_NE(error_of({dy.id(), w.id(), z.id()}, "none", 2).find("residual must be 0 or 1, got 2"), std::string::npos);
  EXPECT_EQ(error_of({dy.id(), w.id(), z.id()}, "none", 1), "no error");
}

// LayoutNet's max pool output is read by a convolution and a residual block's shortcut,
// and its first block's output by two convolutions (a 3x3 and a 1x1 shortcut, both of
// stride 2): each of the two gradient sums is one input gradient with residual 1, and
// the plan trains as the unfused one.
TEST(FuseConv, AValuesTwoGradientsAreSummedByTheInputGradient) {
  for (LayoutPolicy layout : {LayoutPolicy::nchw, LayoutPolicy::nhwc}) {
    SCOPED_TRACE(layout == LayoutPolicy::nhwc ? "nhwc" : "nchw");
    LayoutNet net;
    FusedAndPlain m(net.g, net.loss, 4, layout, /*fuse_elementwise=*/false);
    int summed = 0;
    for (const PlanStep& st : m.fused.plan().steps)
      summed += st.op == Op::conv2d_grad_input && st.attrs.i("residual") == 1;
    EXPECT_EQ(summed, 2);
    const std::string text = explain_plan(m.fused.plan(), m.fused.plan(), DeviceModel{}, false);
    EXPECT_NE(text.find("fused: the value's other gradient added to the input gradient before it is stored"),
              std::string::npos)
        << text;
    m.train(net);
  }
}

// conv -> relu -> conv -> relu -> pool -> linear, no batch norm: both convolutions take
// their relu; the second one's input gradient takes the first relu's mask.
struct PlainConvNet {
  Graph g;
  Var loss;
  PlainConvNet() {
    Var x = g.input("x", {4, 3, 8, 8});
    Var y = g.input("y", {4}, DType::i32);
    Var h = relu(nn::conv2d(x, 8, 3, "c1", {.padding = {1, 1}}));
    h = relu(nn::conv2d(h, 8, 3, "c2", {.padding = {1, 1}}, false));
    loss = cross_entropy(nn::linear(flatten(max_pool2d(h, {2, 2})), 10, "fc"), y);
  }
  void feed(Program& p, uint64_t step) const {
    p.set_input("x", std::span<const float>(random_floats(4 * 3 * 8 * 8, 700 + step)));
    p.set_input("y", std::span<const int32_t>(random_labels(4, 10, 800 + step)));
  }
};

TEST(FuseConv, ReluFoldsIntoBothConvolutionsAndTrainsAsUnfused) {
  for (LayoutPolicy layout : {LayoutPolicy::nchw, LayoutPolicy::nhwc}) {
    SCOPED_TRACE(layout == LayoutPolicy::nhwc ? "nhwc" : "nchw");
    PlainConvNet net;
    FusedAndPlain m(net.g, net.loss, 3, layout, /*fuse_elementwise=*/false);
    const Plan& fused = m.fused.plan();
    EXPECT_EQ(count_with_relu(fused, Op::conv2d), 2);
    EXPECT_EQ(count_with_relu(fused, Op::conv2d_grad_input), 1);
    EXPECT_EQ(count(fused, Op::relu), 0);
    EXPECT_EQ(count(fused, Op::relu_grad), 1);  // the second relu's: pooling's gradient feeds it
    const std::string text = explain_plan(fused, fused, DeviceModel{}, false);
    EXPECT_NE(text.find("fused: relu's derivative applied to the input gradient before it is stored"),
              std::string::npos)
        << text;
    m.train(net);
  }
}

// A convolution whose result something besides the relu reads keeps both.
TEST(FuseConv, AResultReadTwiceIsNotFused) {
  Graph g;
  Var x = g.input("x", {2, 3, 6, 6});
  Var c = nn::conv2d(x, 4, 3, "c", {.padding = {1, 1}});
  Var out = add(relu(c), c);
  Model m(g, {.seed = 1});
  Program p = m.compile({.mode = Mode::eval, .outputs = {out.id()}, .fuse_elementwise = false});
  EXPECT_EQ(count_with_relu(p.plan(), Op::conv2d), 0);
  EXPECT_EQ(count(p.plan(), Op::relu), 1);
}

// Evaluation: conv -> batch norm -> relu, and conv -> batch norm -> + h -> relu, each one
// conv2d_bn step, equal to the unfused plan bit for bit (the CPU rounds where the unfused
// steps store). The running statistics come from two training steps first.
TEST(FuseConv, EvaluationBatchNormFoldsIntoTheConvolution) {
  for (LayoutPolicy layout : {LayoutPolicy::nchw, LayoutPolicy::nhwc}) {
    SCOPED_TRACE(layout == LayoutPolicy::nhwc ? "nhwc" : "nchw");
    Graph g;
    Var x = g.input("x", {4, 3, 8, 8});
    Var y = g.input("y", {4}, DType::i32);
    Var h = relu(nn::batch_norm(nn::conv2d(x, 8, 3, "c1", {.padding = {1, 1}}, false), "bn1"));
    Var r = nn::batch_norm(nn::conv2d(h, 8, 3, "c2", {.padding = {1, 1}}, false), "bn2");
    Var out = relu(add(r, h));
    Var logits = nn::linear(flatten(global_avg_pool(out)), 10, "fc");
    Var loss = cross_entropy(logits, y);
    Model m(g, {.seed = 5, .layout = layout});
    Program train = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
    for (uint64_t step = 0; step < 2; ++step) {
      train.set_input("x", std::span<const float>(random_floats(4 * 3 * 8 * 8, 40 + step)));
      train.set_input("y", std::span<const int32_t>(random_labels(4, 10, 50 + step)));
      train.run();
    }
    EXPECT_EQ(count(train.plan(), Op::conv2d_bn), 0);
    Program fused = m.compile({.mode = Mode::eval, .outputs = {logits.id(), out.id()}});
    Program plain = m.compile({.mode = Mode::eval, .outputs = {logits.id(), out.id()}, .fuse = false});
    int with_z = 0, with_relu = 0;
    for (const PlanStep& s : fused.plan().steps)
      if (s.op == Op::conv2d_bn) {
        with_z += s.in.size() == 7;
        with_relu += s.attrs.s("activation") == "relu";
      }
    EXPECT_EQ(count(fused.plan(), Op::conv2d_bn), 2);
    EXPECT_EQ(with_z, 1);
    EXPECT_EQ(with_relu, 2);
    EXPECT_EQ(count(fused.plan(), Op::batch_norm), 0);
    const std::string text = explain_plan(fused.plan(), fused.plan(), DeviceModel{}, false);
    EXPECT_NE(text.find("fused: batch norm (running statistics), residual add and relu applied"), std::string::npos)
        << text;
    const auto images = random_floats(4 * 3 * 8 * 8, 60);
    for (Program* p : {&fused, &plain}) {
      p->set_input("x", std::span<const float>(images));
      p->run();
    }
    EXPECT_EQ(fused.read_as<float>(out.name()), plain.read_as<float>(out.name()));
    EXPECT_EQ(fused.read_as<float>(logits.name()), plain.read_as<float>(logits.name()));
  }
}

TEST(FuseConv, TheFoldedStepIsNotDifferentiated) {
  Graph g;
  Var x = g.param("x", {2, 3, 6, 6}, Init::uniform(-1, 1));
  const Shape ch{4};
  Var y = g.add1(Op::conv2d_bn,
                 {x.id(), g.param("w", {4, 3, 3, 3}, Init::uniform(-1, 1)).id(), g.param("gamma", ch, Init::ones()).id(),
                  g.param("beta", ch, Init::zeros()).id(), g.state("rm", ch, Init::zeros()).id(),
                  g.state("rv", ch, Init::ones()).id()},
                 {{"padding", std::vector<int64_t>{1, 1}}});
  Var loss = sum(y);
  Model m(g, {.seed = 1});
  try {
    m.compile({.loss = loss.id(), .gradients = true});
    ADD_FAILURE() << "differentiated conv2d_bn";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is an inference step"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace seam::testing
