// The cuDNN-backed ops against the CPU: conv2d (forward, input and weight gradients),
// max / average / global average pooling, batch_norm in training and evaluation.
//
// Convolutions are compared twice: on TF32 tensor cores at TF32 tolerance, and with TF32
// off (cuDNN's FMA math) at f32 tolerance. Pooling and batch norm use no tensor cores: f32.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "../test_util.h"
#include "backend/backend.h"
#include "conv_case.h"
#include "gpu_check.h"
#include "pool_case.h"

using namespace seam;
using seam::gpu_testing::build_conv;
using seam::gpu_testing::compare_with_cpu;
using seam::gpu_testing::CompareOptions;
using seam::gpu_testing::ConvCase;
using seam::gpu_testing::expect_close;
using seam::gpu_testing::f32;
using seam::gpu_testing::GpuCase;
using seam::gpu_testing::TempCacheDir;
using seam::gpu_testing::tf32_nhwc;
using seam::gpu_testing::Tolerance;

namespace {

// Beside shared_conv_cases(), run by every conv2d test file.
std::vector<ConvCase> conv_cases() {
  return gpu_testing::shared_conv_cases_and({
      // 1x1 with stride 2
      {{1, 4, 7, 7}, {3, 4, 1, 1}, false, {.stride = {2, 2}}},
      // dilation 2 with padding 1
      {{3, 2, 7, 7}, {4, 2, 3, 3}, true, {.padding = {1, 1}, .dilation = {2, 2}}},
      // depthwise with multiplier 2
      {{1, 3, 7, 7}, {6, 1, 3, 3}, false, {.groups = 3}},
      // a large kernel, and a kernel as large as the 7x7 input
      {{2, 3, 7, 7}, {2, 3, 5, 5}, true, {.padding = {2, 2}}},
      {{2, 2, 7, 7}, {3, 2, 7, 7}, true, {}},
  });
}

}  // namespace

// ------------------------------------------------------------------------------------------
// conv2d

// At tf32 the layout pass runs the convolutions channels-last (ModelOptions::layout), on
// cuDNN's tensor-core kernels: their tolerance (gpu_check.h).
TEST(GpuConv, MatchesTheCpuWithTf32) {
  for (const ConvCase& k : conv_cases()) {
    SCOPED_TRACE(k.str());
    compare_with_cpu([&](GpuCase& c) { return build_conv(c, k); }, CompareOptions(Precision::tf32, k.tf32()));
  }
}

TEST(GpuConv, MatchesTheCpuWithoutTf32) {
  for (const ConvCase& k : conv_cases()) {
    SCOPED_TRACE(k.str());
    compare_with_cpu([&](GpuCase& c) { return build_conv(c, k); }, CompareOptions(Precision::f32, k.no_tf32));
  }
}

TEST(GpuConv, WeightGradientOnlyWhenXIsData) {
  // x is data: the graph has conv2d_grad_weight and the bias sum, no conv2d_grad_input.
  compare_with_cpu(
      [](GpuCase& c) {
        return conv2d(c.data("x", {3, 3, 9, 9}), c.param("w", {4, 3, 3, 3}), c.param("b", {4}),
                      {.stride = {2, 2}, .padding = {1, 1}});
      },
      tf32_nhwc());
}

TEST(GpuConv, TwoLayersOfOneShapeShareTheirChoice) {
  // The second layer's shapes equal the first's: its algorithms come from the cache.
  compare_with_cpu(
      [](GpuCase& c) {
        Var h = relu(conv2d(c.param("x", {2, 4, 8, 8}), c.param("w1", {4, 4, 3, 3}), c.param("b1", {4}),
                            {.padding = {1, 1}}));
        return conv2d(h, c.param("w2", {4, 4, 3, 3}), c.param("b2", {4}), {.padding = {1, 1}});
      },
      tf32_nhwc());
}

TEST(GpuConv, AlgorithmChoicesAreSavedToTheCacheFile) {
  gpu_testing::ClassicConvApi classic;
  // A folder of its own: the choice is measured here, saved there, and read back from it.
  TempCacheDir cache;
  const std::filesystem::path dir = std::filesystem::path(cache.dir()) / "seam";
  Graph g;
  Var x = g.input("x", {1, 5, 11, 13});
  Var y = conv2d(x, g.param("w", {7, 5, 3, 3}, Init::uniform(-1, 1)), std::nullopt, {.padding = {1, 1}});
  Model m(g, {.device = Device::cuda, .precision = Precision::tf32});
  Program p = m.compile({.mode = Mode::eval, .outputs = {y.id()}});
  const std::string key = "fwd x=1,5,11,13 w=7,5,3,3 y=1,7,11,13 stride=1,1 pad=1,1 dil=1,1 groups=1 dtype=f32 math=tf32 ";
  int found = 0;
  for (const std::filesystem::path& f : gpu_testing::conv_files(cache)) {
    const auto lines = gpu_testing::lines_of(f);
    ASSERT_FALSE(lines.empty()) << f;
    EXPECT_EQ(lines[0].rfind(gpu_testing::kConvCacheHeader, 0), 0u) << f << ": " << lines[0];
    found += gpu_testing::lines_starting(lines, key);
  }
  EXPECT_GT(found, 0) << "no line starting with '" << key << "' in " << dir;
  // Another folder knows nothing of it: the cache follows XDG_CACHE_HOME.
  TempCacheDir other;
  Model m2(g, {.device = Device::cuda, .precision = Precision::tf32});
  Program p2 = m2.compile({.mode = Mode::eval, .outputs = {y.id()}});
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(other.dir()) / "seam")) << other.dir();
}

TEST(GpuConvEngine, TheFastestEngineIsSavedAndRebuiltFromTheCache) {
  TempCacheDir cache;  // a folder of its own: the engines are timed here and saved there
  Graph g;
  Var x = g.input("x", {2, 8, 9, 9});
  Var y = conv2d(x, g.param("w", {16, 8, 3, 3}, Init::uniform(-1, 1)), std::nullopt, {.padding = {1, 1}});
  auto choices_of = [&](Program& p) {
    std::string all;
    for (auto& [step, what] : p.executable().stats().choices) all += what + "\n";
    return all;
  };
  Model m(g, {.device = Device::cuda, .precision = Precision::bf16, .layout = LayoutPolicy::nhwc});
  Program p = m.compile({.mode = Mode::eval, .outputs = {y.id()}});
  const std::string first = choices_of(p);
  EXPECT_NE(first.find("conv2d nhwc: cuDNN graph API"), std::string::npos) << first;
  EXPECT_NE(first.find("fastest of"), std::string::npos) << first;
  const std::filesystem::path dir = std::filesystem::path(cache.dir()) / "seam";
  const std::string key =
      "fwd x=2,8,9,9 w=16,8,3,3 y=2,16,9,9 stride=1,1 pad=1,1 dil=1,1 groups=1 dtype=bf16 math=tensor layout=nhwc "
      "engine=";
  int found = 0;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("cudnn-conv-engines-", 0) == 0) {
      const auto lines = gpu_testing::lines_of(e.path());
      ASSERT_FALSE(lines.empty());
      EXPECT_EQ(lines[0].rfind("# seam cudnn conv engines v2 gpu=", 0), 0u) << lines[0];
      found += gpu_testing::lines_starting(lines, key);
    }
  EXPECT_EQ(found, 1) << "lines starting with '" << key << "' in " << dir;
  // Another model of the same shape takes the saved engine without timing any.
  Model m2(g, {.device = Device::cuda, .precision = Precision::bf16, .layout = LayoutPolicy::nhwc});
  Program p2 = m2.compile({.mode = Mode::eval, .outputs = {y.id()}});
  const std::string second = choices_of(p2);
  EXPECT_NE(second.find("cuDNN graph API"), std::string::npos) << second;
  EXPECT_NE(second.find(", cached,"), std::string::npos) << second;
}

TEST(GpuConvEngine, ReluFusesIntoTheConvolutionGraphs) {
  // conv + bias + relu, then conv + relu: fuse_conv_activations gives both convolutions
  // their relu and the second one's input gradient the first relu's mask; cuDNN's graphs
  // carry the pointwise relu forward and backward. Then the same on the classic API, where
  // the relu and the mask are the elementwise kernels after the convolution.
  auto build = [](GpuCase& c) {
    Var h = relu(conv2d(c.param("x", {4, 8, 10, 10}), c.param("w1", {16, 8, 3, 3}), c.param("b1", {16}),
                        {.padding = {1, 1}}));
    return relu(conv2d(h, c.param("w2", {16, 16, 3, 3}), std::nullopt, {.stride = {2, 2}, .padding = {1, 1}}));
  };
  // f32: sums of 72-144 products near zero (the conv tests' floor for them). TF32: the
  // forward only, since a pre-activation within TF32's rounding of zero takes relu's mask
  // the other way on each side (seen: 1.8% of x's gradient), which f32 and bf16's
  // tolerance do not meet at these sizes.
  const CompareOptions f32_conv(Precision::f32, Tolerance(1e-5, 1e-4, 1e-5));
  CompareOptions tf32_forward = tf32_nhwc();
  tf32_forward.gradients = false;
  for (const CompareOptions& o : {f32_conv, tf32_forward, gpu_testing::bf16()}) {
    SCOPED_TRACE(precision_name(o.precision));
    compare_with_cpu(build, o);
    GpuCase c(3);
    Var loss = sum(build(c));
    Model m(c.g, {.seed = 1, .device = Device::cuda, .precision = o.precision});
    Program p = m.compile({.loss = loss.id(), .gradients = true});
    int forward = 0, backward = 0;
    std::string all;
    for (auto& [step, what] : p.executable().stats().choices) {
      forward += what.rfind("conv2d ", 0) == 0 && what.find("with relu") != std::string::npos;
      backward += what.rfind("conv2d_grad_input ", 0) == 0 && what.find("with relu") != std::string::npos;
      all += "step " + std::to_string(step) + ": " + what + "\n";
    }
    std::cout << all;
    // Where no precompiled engine runs a fused graph (cuDNN 9.14 on the H200: conv + relu
    // without a bias, dgrad + relu), the plain graph runs and the kernels after it; the
    // classic API never. conv + bias + relu has engines on the tensor cores.
    EXPECT_EQ(all.find("classic API"), std::string::npos) << all;
    if (o.precision != Precision::f32) EXPECT_GE(forward, 1) << all;
  }
  gpu_testing::ClassicConvApi classic;
  compare_with_cpu(build, tf32_forward);
  compare_with_cpu(build, gpu_testing::bf16());
}

TEST(GpuConvEngine, AnInputGradientAddsTheValuesOtherGradient) {
  // x read by a 3x3 and a 1x1 convolution of stride 2 (a downsampling block), h by a
  // convolution and the shortcut (a residual block): each of x's and h's gradient sums is
  // one conv2d_grad_input with residual 1, on cuDNN's graph the data gradient then a
  // pointwise add of z (channels-last: runtime-compiled engines), or where no engine runs
  // that graph (NCHW) the plain graph and the add kernel. Then the same on the classic
  // API: the data gradient, then the add kernel. Where the add kernel runs, 16-bit dx is
  // rounded before z is added, once more than on the CPU and in the fused graph, and
  // h's gradient carries that rounding into sums that cancel (seen at bf16: 0.275 for
  // 0.322 in a weight gradient whose terms are near 1): twice the elementwise floors.
  auto plain_path = [](CompareOptions o) {
    if (o.precision == Precision::bf16 || o.precision == Precision::f16)
      o.tol = Tolerance(o.tol.rel * 2, o.tol.elem_rel * 2, o.tol.atol * 2);
    return o;
  };
  auto build = [](GpuCase& c) {
    // Filters of 0.2 at most keep the sums near 1, where 16-bit rounding of the gradients
    // (which cancel in x's) stays under the elementwise floor.
    Var x = c.param("x", {4, 8, 10, 10});
    Var h = add(conv2d(x, c.param("w1", {16, 8, 3, 3}, -0.2, 0.2), std::nullopt, {.stride = {2, 2}, .padding = {1, 1}}),
                conv2d(x, c.param("w2", {16, 8, 1, 1}, -0.2, 0.2), std::nullopt, {.stride = {2, 2}}));
    return add(conv2d(h, c.param("w3", {16, 16, 3, 3}, -0.2, 0.2), std::nullopt, {.padding = {1, 1}}), h);
  };
  const CompareOptions f32_conv(Precision::f32, Tolerance(1e-5, 1e-4, 1e-5));
  for (LayoutPolicy layout : {LayoutPolicy::nchw, LayoutPolicy::nhwc})
    for (const CompareOptions& o : {f32_conv, gpu_testing::tf32_nhwc(), gpu_testing::bf16(), gpu_testing::f16()}) {
      SCOPED_TRACE(std::string(precision_name(o.precision)) + (layout == LayoutPolicy::nhwc ? " nhwc" : " nchw"));
      CompareOptions lo = layout == LayoutPolicy::nchw ? plain_path(o) : o;
      lo.layout = layout;
      compare_with_cpu(build, lo);
      GpuCase c(3);
      Var loss = sum(build(c));
      Model m(c.g, {.seed = 1, .device = Device::cuda, .precision = o.precision, .layout = layout});
      Program p = m.compile({.loss = loss.id(), .gradients = true});
      int summed = 0;
      for (const PlanStep& st : p.plan().steps) summed += st.op == Op::conv2d_grad_input && st.attrs.i("residual") == 1;
      EXPECT_EQ(summed, 2);
      int fused = 0;
      std::string all;
      for (auto& [step, what] : p.executable().stats().choices) {
        fused += what.rfind("conv2d_grad_input ", 0) == 0 && what.find("with the residual") != std::string::npos;
        all += "step " + std::to_string(step) + ": " + what + "\n";
      }
      std::cout << all;
      EXPECT_EQ(all.find("classic API"), std::string::npos) << all;
      // cuDNN 9.14 on the H200: channels-last tensor-core engines compiled at run time.
      if (layout == LayoutPolicy::nhwc && o.precision != Precision::f32) EXPECT_EQ(fused, 2) << all;
    }
  gpu_testing::ClassicConvApi classic;
  compare_with_cpu(build, gpu_testing::tf32_nhwc());
  compare_with_cpu(build, plain_path(gpu_testing::bf16()));
}

TEST(GpuConvEngine, EvaluationBatchNormFoldsIntoTheConvolution) {
  // In evaluation, conv -> batch norm -> relu and conv -> batch norm -> + h -> relu are
  // conv2d_bn steps: one cuDNN graph each (convolution, scale, shift, residual, relu),
  // and on the classic API the convolution then the epilogue kernel.
  auto build = [](GpuCase& c) {
    auto bn = [&](Var h, const std::string& p) {
      const Shape ch{h.shape()[1]};
      return batch_norm(h, c.param(p + "gamma", ch, 0.5, 1.5), c.param(p + "beta", ch),
                        c.state(p + "mean", ch, Init::uniform(-0.5, 0.5)), c.state(p + "var", ch, Init::uniform(0.5, 1.5)),
                        0.1, 1e-5);
    };
    // Filters of 0.2 at most keep the sums near 1, where bf16's rounding of the normalized
    // value and the residual (which may cancel) stays under its elementwise floor.
    Var h = relu(bn(conv2d(c.data("x", {4, 8, 10, 10}), c.param("w1", {16, 8, 3, 3}, -0.2, 0.2), std::nullopt,
                           {.padding = {1, 1}}),
                    "bn1."));
    return relu(
        add(bn(conv2d(h, c.param("w2", {16, 16, 3, 3}, -0.2, 0.2), std::nullopt, {.padding = {1, 1}}), "bn2."), h));
  };
  auto eval = [](CompareOptions o) {
    o = o.in_mode(Mode::eval);
    o.gradients = false;
    return o;
  };
  // f32: the GPU rounds conv * scale + shift once where the CPU rounds the convolution's
  // sum of 144 products, then (sum - mean) * invstd * gamma + beta: results near zero
  // carry the sum's rounding (seen: 6e-6 on 0.0175), so the elementwise floor is its size.
  const CompareOptions f32_conv(Precision::f32, Tolerance(1e-5, 1e-4, 1e-5));
  for (const CompareOptions& o : {f32_conv, tf32_nhwc(), gpu_testing::bf16()}) {
    SCOPED_TRACE(precision_name(o.precision));
    compare_with_cpu(build, eval(o));
    GpuCase c(3);
    Var y = build(c);
    Model m(c.g, {.seed = 1, .device = Device::cuda, .precision = o.precision});
    Program p = m.compile({.mode = Mode::eval, .outputs = {y.id()}});
    EXPECT_EQ(seam::testing::count(p.plan(), Op::conv2d_bn), 2) << p.plan().str();
    std::string all;
    for (auto& [step, what] : p.executable().stats().choices) all += "step " + std::to_string(step) + ": " + what + "\n";
    std::cout << all;
    EXPECT_EQ(all.find("classic API"), std::string::npos) << all;  // the fused graph, or the plain one and the kernel
  }
  gpu_testing::ClassicConvApi classic;
  compare_with_cpu(build, eval(tf32_nhwc()));
  compare_with_cpu(build, eval(gpu_testing::bf16()));
}

// ------------------------------------------------------------------------------------------
// Pooling

namespace {

using seam::gpu_testing::PoolCase;

std::vector<PoolCase> pool_cases() {
  return {
      {{2, 3, 8, 8}, {2, 2}, {}, {0, 0}},            // the usual 2x2, stride = kernel
      {{3, 2, 7, 7}, {3, 3}, {2, 2}, {1, 1}},        // overlapping windows with padding
      {{2, 1, 5, 5}, {2, 2}, {1, 1}, {0, 0}},        // overlapping, no padding
      {{1, 2, 7, 6}, {3, 2}, {1, 2}, {1, 1}},        // asymmetric, padding = kernel / 2
      {{3, 2, 7, 7}, {7, 7}, {}, {0, 0}},            // one window over the whole 7x7 plane
      {{2, 2, 9, 9}, {5, 3}, {3, 2}, {2, 1}},        // windows cut by the padding at both ends
  };
}

}  // namespace

TEST(GpuPool, MaxPoolMatchesTheCpu) {
  for (const PoolCase& k : pool_cases()) {
    SCOPED_TRACE(k.str());
    compare_with_cpu([&](GpuCase& c) { return max_pool2d(c.param("x", k.x), k.kernel, k.stride, k.padding); }, f32());
  }
}

TEST(GpuPool, AvgPoolMatchesTheCpuWithAndWithoutPaddingInTheCount) {
  for (bool include : {true, false})
    for (const PoolCase& k : pool_cases()) {
      SCOPED_TRACE(k.str() + (include ? " count_include_pad" : " count_exclude_pad"));
      compare_with_cpu(
          [&](GpuCase& c) { return avg_pool2d(c.param("x", k.x), k.kernel, k.stride, k.padding, include); }, f32());
    }
}

TEST(GpuPool, MaxPoolGradientGoesToTheFirstOfTiedMaxima) {
  // Every column of x repeats down the rows, so each 2x2 window holds its maximum twice
  // (and the 3x3 windows three times); the CPU routes dy to the first in row-major order.
  compare_with_cpu([](GpuCase& c) {
    Var x = broadcast_to(c.param("x", {2, 3, 1, 6}), {2, 3, 6, 6});
    return max_pool2d(x, {2, 2});
  }, f32());
  compare_with_cpu([](GpuCase& c) {
    Var x = broadcast_to(c.param("x", {1, 2, 1, 7}), {1, 2, 7, 7});
    return max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  }, f32());
}

TEST(GpuPool, MaxPoolAfterRelu) {
  // Many windows are all zeros after the relu; their gradient is zero either way.
  compare_with_cpu([](GpuCase& c) { return max_pool2d(relu(c.param("x", {2, 3, 8, 8})), {2, 2}); }, f32());
}

TEST(GpuPool, GlobalAvgPoolMatchesTheCpu) {
  // Small planes (a warp each), large ones (a block each), a single value.
  for (Shape s : {Shape{3, 4, 7, 7}, Shape{2, 3, 40, 40}, Shape{1, 1, 1, 1}, Shape{5, 70, 3, 2}}) {
    SCOPED_TRACE(shape_str(s));
    compare_with_cpu([&](GpuCase& c) { return global_avg_pool(c.param("x", s)); }, f32());
  }
}

// ------------------------------------------------------------------------------------------
// batch_norm

namespace {

Var build_bn(GpuCase& c, const Shape& s, Init rm, Init rv) {
  const Shape ch{s[1]};
  return batch_norm(c.param("x", s, -2, 2), c.param("gamma", ch, 0.5, 1.5), c.param("beta", ch),
                    c.state("running_mean", ch, rm), c.state("running_var", ch, rv), 0.1, 1e-5);
}

}  // namespace

TEST(GpuBatchNorm, TrainingMatchesTheCpuIncludingRunningStats) {
  // runs = 2: the running statistics are compared after two updates.
  // (Not N * inner = 2: there xhat is +-1 whatever x is, dx is all rounding, and f32
  // cannot match the CPU's double.)
  for (Shape s : {Shape{8, 5}, Shape{4, 3, 5, 5}, Shape{6, 3, 1, 1}, Shape{4, 3, 6}, Shape{16, 8, 7, 7}}) {
    SCOPED_TRACE(shape_str(s));
    compare_with_cpu([&](GpuCase& c) { return build_bn(c, s, Init::zeros(), Init::ones()); }, f32().with_runs(2));
    compare_with_cpu([&](GpuCase& c) { return build_bn(c, s, Init::uniform(-0.5, 0.5), Init::uniform(0.5, 1.5)); },
                     f32().with_runs(2));
  }
}

// relu after a batch norm fuses into it (fuse_norm_activations): batch_norm and
// batch_norm_grad with activation relu, in training and evaluation.
TEST(GpuBatchNorm, WithReluMatchesTheCpu) {
  for (Shape s : {Shape{8, 5}, Shape{4, 3, 5, 5}, Shape{16, 8, 7, 7}}) {
    SCOPED_TRACE(shape_str(s));
    auto build = [&](GpuCase& c) { return relu(build_bn(c, s, Init::uniform(-0.5, 0.5), Init::uniform(0.5, 1.5))); };
    compare_with_cpu(build, f32().with_runs(2));
    compare_with_cpu(build, f32().in_mode(Mode::eval).with_runs(2));
  }
  Graph g;
  Var x = g.input("x", {4, 3, 5, 5});
  Var y = relu(nn::batch_norm(x, "bn"));
  Var loss = sum(y);
  Model m(g, {.device = Device::cuda});
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
  int fused = 0;
  for (const PlanStep& st : p.plan().steps) fused += st.attrs.has("activation") && st.attrs.s("activation") == "relu";
  EXPECT_EQ(fused, 2);  // the forward and the gradient (of gamma and beta)
}

TEST(GpuBatchNorm, EvaluationMatchesTheCpu) {
  for (Shape s : {Shape{8, 5}, Shape{4, 3, 5, 5}, Shape{1, 3, 2, 2}}) {
    SCOPED_TRACE(shape_str(s));
    compare_with_cpu([&](GpuCase& c) { return build_bn(c, s, Init::zeros(), Init::ones()); },
                     f32().in_mode(Mode::eval));
    compare_with_cpu([&](GpuCase& c) { return build_bn(c, s, Init::uniform(-0.5, 0.5), Init::uniform(0.5, 1.5)); },
                     f32().in_mode(Mode::eval).with_runs(2));
  }
}

TEST(GpuBatchNorm, OnDataWithoutAnInputGradient) {
  // x is data: nothing reads batch_norm_grad's dx, which must not land on live memory.
  compare_with_cpu(
      [](GpuCase& c) {
        Var x = c.data("x", {4, 3, 5, 5}, -2, 2);
        Var y = batch_norm(x, c.param("gamma", {3}, 0.5, 1.5), c.param("beta", {3}),
                           c.state("running_mean", {3}, Init::zeros()), c.state("running_var", {3}, Init::ones()),
                           0.1, 1e-5);
        return relu(y);
      },
      f32().with_runs(2));
}

TEST(GpuBatchNorm, ConvBatchNormReluPool) {
  compare_with_cpu(
      [](GpuCase& c) {
        Var h = conv2d(c.param("x", {4, 3, 8, 8}), c.param("w", {6, 3, 3, 3}), std::nullopt, {.padding = {1, 1}});
        h = batch_norm(h, c.param("gamma", {6}, 0.5, 1.5), c.param("beta", {6}),
                       c.state("running_mean", {6}, Init::zeros()), c.state("running_var", {6}, Init::ones()), 0.1,
                       1e-5);
        return global_avg_pool(max_pool2d(relu(h), {2, 2}));
      },
      tf32_nhwc().with_runs(2));
}

TEST(GpuBatchNorm, NegativeEpsIsRejected) {
  Graph g;
  Var x = g.input("x", {4, 3});
  Var y = batch_norm(x, g.param("gamma", {3}, Init::ones()), g.param("beta", {3}, Init::zeros()),
                     g.state("rm", {3}, Init::zeros()), g.state("rv", {3}, Init::ones()), 0.1, -1e-3);
  Model m(g, {.device = Device::cuda});
  try {
    Program p = m.compile({.outputs = {y.id()}});
    FAIL() << "a batch_norm with eps < CUDNN_BN_MIN_EPSILON compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("eps"), std::string::npos) << e.what();
  }
}
