// The layout pass (src/passes/layout.h): convolution regions run channels-last with
// transposes only at their boundaries, and the layout never changes what a model computes.
#include <gtest/gtest.h>

#include <cmath>

#include "layout_case.h"
#include "ops/layout.h"
#include "passes/layout.h"
#include "passes/precision.h"
#include "seam/seam.h"
#include "test_util.h"

namespace seam::testing {
namespace {

const OptimizerConfig kSgd = OptimizerConfig::sgd(0.05, 0.9, 5e-4);

// Every convolution of g channels-last, as layout nhwc asks.
std::set<std::string> every_conv(const Graph& g) {
  return nhwc_convs(choose_layouts(g, LayoutPolicy::nhwc, layout_costs(Device::cpu, Precision::f32)));
}

int count_nhwc(const Plan& p, Op op) {
  int n = 0;
  for (const PlanStep& s : p.steps) n += s.op == op && is_nhwc(s.attrs);
  return n;
}

TEST(LayoutPass, ConvolutionRegionsRunChannelsLast) {
  LayoutNet net;
  Model m(net.g, {.seed = 1, .layout = LayoutPolicy::nhwc});
  Program p = m.compile({.loss = net.loss.id(), .optimizer = kSgd});
  const Plan& plan = p.plan();
  EXPECT_EQ(count_nhwc(plan, Op::conv2d), count(plan, Op::conv2d));
  EXPECT_EQ(count(plan, Op::conv2d), 6);
  EXPECT_EQ(count_nhwc(plan, Op::conv2d_grad_input), count(plan, Op::conv2d_grad_input));
  EXPECT_EQ(count_nhwc(plan, Op::conv2d_grad_weight), 6);
  EXPECT_EQ(count_nhwc(plan, Op::batch_norm), 5);
  EXPECT_EQ(count_nhwc(plan, Op::batch_norm_grad), 5);
  EXPECT_EQ(count_nhwc(plan, Op::max_pool2d), 1);
  EXPECT_EQ(count_nhwc(plan, Op::avg_pool2d), 1);
  EXPECT_EQ(count_nhwc(plan, Op::global_avg_pool), 1);
  // Transposes only at the region's boundaries: the input into it, and the pooled value
  // around dropout (whose mask follows NCHW indices) and back. The filters are stored
  // channels-last ([C_out, kh, kw, C_in]: no transpose of them or of their gradients), and
  // the [8, 1, 1] scale moves only dims of size 1: a view.
  EXPECT_EQ(count(plan, Op::transpose), 1 + 2) << plan.str();
  EXPECT_NE(plan.str().find("nhwc"), std::string::npos);
  for (const std::string& name : channels_last_params(net.g, every_conv(net.g))) {
    const Slot* s = m.layout().param(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->type.layout, DataLayout::nhwc) << name;
    EXPECT_EQ(s->user_type().shape, net.g.value(*net.g.find(name)).type.shape) << name;
  }
  EXPECT_EQ(channels_last_params(net.g, every_conv(net.g)).size(), 6u);
}

// Channels-last filters read, write, save and load in NCHW order: a checkpoint of a model
// stored channels-last loads into one stored NCHW, and the two then train alike.
TEST(LayoutPass, ChannelsLastFiltersSpeakNchwToTheirUsers) {
  LayoutNet net;
  Model a(net.g, {.seed = 5, .layout = LayoutPolicy::nhwc});
  Model b(net.g, {.seed = 5, .layout = LayoutPolicy::nchw});
  Program pa = a.compile({.loss = net.loss.id(), .optimizer = kSgd});
  Program pb = b.compile({.loss = net.loss.id(), .optimizer = kSgd});
  for (const Slot& s : b.layout().params) EXPECT_EQ(a.read_param(s.name), b.read_param(s.name)) << s.name;
  net.feed(pa, 0);
  pa.run();
  // a's trained weights and moments, through a checkpoint, into b; then one more step each.
  b.load_tensors(a.save_tensors());
  b.state() = a.state();  // the step count (momentum's first step, dropout's seed) as a checkpoint keeps it
  for (const Slot& s : b.layout().params) {
    EXPECT_EQ(a.read_param(s.name), b.read_param(s.name)) << s.name;
    EXPECT_EQ(a.layout().param(s.name)->user_type(), s.type) << s.name;
  }
  const std::string w = *channels_last_params(net.g, every_conv(net.g)).begin();
  std::vector<std::byte> bytes = b.read_param(w);
  bytes[4] = std::byte{0x3f};
  a.write_param(w, bytes);
  b.write_param(w, bytes);
  EXPECT_EQ(a.read_param(w), bytes);
  net.feed(pa, 1);
  net.feed(pb, 1);
  pa.run();
  pb.run();
  expect_same_params(a, b, 1e-5);
}

TEST(LayoutChoice, TheRegionIsCostedOnTheModelsDeviceAndPrecision) {
  LayoutNet net;
  auto regions = [&](Device d, Precision p) {
    const Graph g = p == Precision::bf16 ? apply_precision(net.g, p, {}).graph : net.g;
    return choose_layouts(g, LayoutPolicy::automatic, layout_costs(d, p));
  };
  const auto cpu = regions(Device::cpu, Precision::f32);
  ASSERT_EQ(cpu.size(), 1u);  // the convolutions, batch norms, poolings and adds join into one
  EXPECT_EQ(cpu[0].convs.size(), 6u);
  EXPECT_FALSE(cpu[0].nhwc) << cpu[0].str();
  EXPECT_EQ(cpu[0].str().rfind("layout region of 6 convolutions (", 0), 0u) << cpu[0].str();
  for (Precision p : {Precision::tf32, Precision::bf16}) {
    const auto gpu = regions(Device::cuda, p);
    ASSERT_EQ(gpu.size(), 1u);
    EXPECT_TRUE(gpu[0].nhwc) << gpu[0].str();
    EXPECT_GT(gpu[0].boundary_us, 0) << gpu[0].str();  // the input, and the pooled value around dropout
  }
  EXPECT_FALSE(regions(Device::cuda, Precision::f32)[0].nhwc);  // cuDNN's FMA kernels
  // A forced policy names itself.
  const auto forced = choose_layouts(net.g, LayoutPolicy::nhwc, layout_costs(Device::cpu, Precision::f32));
  EXPECT_TRUE(forced[0].nhwc);
  EXPECT_NE(forced[0].str().find("(layout nhwc)"), std::string::npos) << forced[0].str();
}

// Two regions that dropout separates: in a bf16 model whose second region stays in f32
// (an override), the first runs channels-last on tensor cores and the second NCHW on the
// FMA units; the pass moves only the first, with one transpose into it and one out.
TEST(LayoutChoice, EachRegionHasItsOwnLayout) {
  Graph g;
  Var x = g.input("x", {8, 16, 16, 16});
  auto layer = [&](Var in, const std::string& name) {
    Var w = g.param(name + ".weight", {16, 16, 3, 3}, Init::uniform(-0.1, 0.1));
    return relu(g.var(g.add_named(Op::conv2d, {in.id(), w.id()}, {{"padding", std::vector<int64_t>{1, 1}}}, name)[0]));
  };
  Var h = layer(layer(x, "a1"), "a2");
  h = layer(layer(dropout(h, 0.1), "b1"), "b2");
  const Graph precise = apply_precision(g, Precision::bf16, {{"b1", Precision::f32}, {"b2", Precision::f32}}).graph;
  const auto regions = choose_layouts(precise, LayoutPolicy::automatic, layout_costs(Device::cuda, Precision::bf16));
  ASSERT_EQ(regions.size(), 2u);
  EXPECT_EQ(regions[0].convs, (std::vector<std::string>{"a1", "a2"}));
  EXPECT_TRUE(regions[0].nhwc) << regions[0].str();
  EXPECT_EQ(regions[1].convs, (std::vector<std::string>{"b1", "b2"}));
  EXPECT_FALSE(regions[1].nhwc) << regions[1].str();
  const Graph moved = apply_layout(precise, nhwc_convs(regions)).graph;
  int nhwc = 0, nchw = 0, transposes = 0;
  for (const Node& n : moved.nodes()) {
    if (n.op == Op::conv2d) (is_nhwc(n.attrs) ? nhwc : nchw)++;
    transposes += n.op == Op::transpose;
  }
  EXPECT_EQ(nhwc, 2);
  EXPECT_EQ(nchw, 2);
  EXPECT_EQ(transposes, 2);
  EXPECT_EQ(channels_last_params(precise, nhwc_convs(regions)), (std::set<std::string>{"a1.weight", "a2.weight"}));
}

// Depthwise-separable blocks (MobileNet's): the depthwise convolutions cost channels-last
// what they gain, so at TF32 on the GPU the region stays NCHW; the same blocks with dense
// 3x3 convolutions go channels-last.
TEST(LayoutChoice, DepthwiseConvolutionsKeepTheirRegionNchw) {
  auto region = [](int64_t groups) {
    Graph g;
    Var h = g.input("x", {64, 96, 28, 28});
    for (int i = 0; i < 3; ++i) {
      const std::string name = "b" + std::to_string(i);
      Var dw = g.param(name + ".dw", {96, 96 / groups, 3, 3}, Init::uniform(-0.1, 0.1));
      h = relu(g.var(g.add_named(Op::conv2d, {h.id(), dw.id()},
                                 {{"padding", std::vector<int64_t>{1, 1}}, {"groups", groups}}, name + "_dw")[0]));
      Var pw = g.param(name + ".pw", {96, 96, 1, 1}, Init::uniform(-0.1, 0.1));
      h = relu(g.var(g.add_named(Op::conv2d, {h.id(), pw.id()}, {}, name + "_pw")[0]));
    }
    const auto r = choose_layouts(g, LayoutPolicy::automatic, layout_costs(Device::cuda, Precision::tf32));
    EXPECT_EQ(r.size(), 1u);
    return r[0];
  };
  const LayoutRegion depthwise = region(96), dense = region(1);
  EXPECT_FALSE(depthwise.nhwc) << depthwise.str();
  EXPECT_TRUE(dense.nhwc) << dense.str();
}

TEST(LayoutPass, AutomaticIsNchwOnTheCpu) {
  LayoutNet net;
  Model m(net.g, {.seed = 1, .precision = Precision::bf16});
  Program p = m.compile({.loss = net.loss.id(), .optimizer = kSgd});
  EXPECT_EQ(count_nhwc(p.plan(), Op::conv2d), 0);
  EXPECT_EQ(count(p.plan(), Op::transpose), 0);
}

// Training in either layout gives the same losses and parameters: each element is
// computed by the same kernels in the same order, except the bias and per-channel
// gradient sums, whose order differs (they add in double).
void expect_same_training(Precision precision, double tol) {
  LayoutNet net;
  Model a(net.g, {.seed = 3, .precision = precision, .layout = LayoutPolicy::nchw});
  Model b(net.g, {.seed = 3, .precision = precision, .layout = LayoutPolicy::nhwc});
  Program pa = a.compile({.loss = net.loss.id(), .optimizer = kSgd, .outputs = {net.logits.id()}});
  Program pb = b.compile({.loss = net.loss.id(), .optimizer = kSgd, .outputs = {net.logits.id()}});
  ASSERT_GT(count_nhwc(pb.plan(), Op::conv2d), 0);
  for (uint64_t step = 0; step < 3; ++step) {
    net.feed(pa, step);
    net.feed(pb, step);
    pa.run();
    pb.run();
    const float la = pa.read_as<float>(net.loss.name())[0], lb = pb.read_as<float>(net.loss.name())[0];
    EXPECT_NEAR(la, lb, tol * std::abs(la)) << "step " << step;
    const auto ya = pa.read_as<float>(net.logits.name()), yb = pb.read_as<float>(net.logits.name());
    ASSERT_EQ(ya.size(), yb.size());
    for (size_t i = 0; i < ya.size(); ++i) EXPECT_NEAR(ya[i], yb[i], tol * (1 + std::abs(ya[i]))) << "logit " << i;
  }
  expect_same_params(a, b, tol);
}

TEST(LayoutPass, TrainingIsTheSameInEitherLayoutF32) { expect_same_training(Precision::f32, 1e-5); }
TEST(LayoutPass, TrainingIsTheSameInEitherLayoutBf16) { expect_same_training(Precision::bf16, 1e-2); }

// A requested output inside the region reads in NCHW order, as the graph describes it.
TEST(LayoutPass, RequestedValuesReadInTheGraphsOrder) {
  LayoutNet net;
  const ValueId stem = net.stem.id();
  Model a(net.g, {.seed = 2, .layout = LayoutPolicy::nchw});
  Model b(net.g, {.seed = 2, .layout = LayoutPolicy::nhwc});
  Program pa = a.compile({.mode = Mode::eval, .outputs = {stem}});
  Program pb = b.compile({.mode = Mode::eval, .outputs = {stem}});
  net.feed(pa, 0);
  net.feed(pb, 0);
  pa.run();
  pb.run();
  const auto ya = pa.read_as<float>(net.stem.name()), yb = pb.read_as<float>(net.stem.name());
  ASSERT_EQ(ya.size(), yb.size());
  for (size_t i = 0; i < ya.size(); ++i) ASSERT_NEAR(ya[i], yb[i], 1e-5 * (1 + std::abs(ya[i]))) << i;
}

TEST(LayoutPass, PolicyNames) {
  EXPECT_EQ(parse_layout_policy("auto"), LayoutPolicy::automatic);
  EXPECT_EQ(parse_layout_policy("nhwc"), LayoutPolicy::nhwc);
  EXPECT_EQ(parse_layout_policy("NHWC"), std::nullopt);
  EXPECT_STREQ(layout_policy_name(LayoutPolicy::nchw), "nchw");
}

TEST(LayoutPass, ABadLayoutAttributeIsNamed) {
  Graph g;
  Var x = g.input("x", {1, 4, 4, 3});
  Var w = g.param("w", {2, 3, 3, 3}, Init::uniform(-1, 1));
  const std::string e = error_of([&] { g.add(Op::conv2d, {x.id(), w.id()}, {{"layout", std::string("nwhc")}}); });
  EXPECT_NE(e.find("layout must be \"nchw\" or \"nhwc\""), std::string::npos) << e;
  EXPECT_NE(e.find("conv2d"), std::string::npos) << e;
}

}  // namespace
}  // namespace seam::testing

namespace seam::testing {
namespace {

// The pass's own views get names of their own: a value the user named "<x>.4d" is not
// taken for the pass's 4-d view of x.
TEST(LayoutPass, NamesOfThePassNeverCaptureTheUsersValues) {
  Graph g;
  Var x = g.input("x", {2, 3, 6, 6});
  Var y = g.input("y", {2}, DType::i32);
  Var c = nn::conv2d(x, 4, 3, "c", {.padding = {1, 1}});
  Var s = g.param("s", {4, 1, 1}, Init::uniform(0.5, 1.5));
  Var t = g.param("s.4d", {1, 4, 1, 1}, Init::uniform(-1, 1));
  Var h = add(mul(c, s), t);
  Var loss = cross_entropy(nn::linear(flatten(global_avg_pool(h)), 5, "fc"), y);
  float l[2];
  for (int k = 0; k < 2; ++k) {
    Model m(g, {.seed = 4, .layout = k ? LayoutPolicy::nhwc : LayoutPolicy::nchw});
    Program p = m.compile({.loss = loss.id(), .gradients = true});
    const auto xs = random_floats(2 * 3 * 6 * 6, 9);
    const std::vector<int32_t> ys{1, 3};
    p.set_input("x", std::span<const float>(xs));
    p.set_input("y", std::span<const int32_t>(ys));
    p.run();
    l[k] = p.read_as<float>(loss.name())[0];
  }
  EXPECT_NEAR(l[0], l[1], 1e-6 * std::abs(l[0]));
}

}  // namespace
}  // namespace seam::testing
