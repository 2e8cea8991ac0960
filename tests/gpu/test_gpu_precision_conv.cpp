// The cuDNN-backed ops with 16-bit storage (bf16, f16) on the GPU against the CPU's
// emulation at the same policy: conv2d and its gradients, batch_norm in training and
// evaluation, max / average / global average pooling, and a small CNN as a whole.
//
// Both sides read the same 16-bit values and compute in f32 (cuDNN's "pseudo" bf16/half
// configurations, the CPU on f32 copies), so they differ where two summation orders put
// a result on either side of a rounding boundary: Tolerance::bf16(), Tolerance::f16().
//
// Two ways in. Through the precision pass (compare_with_cpu at bf16() / f16()): conv2d
// and the pooling ops get 16-bit working copies of their f32 parameters, so a graph of
// f32 parameters runs the 16-bit kernels forward and backward. batch_norm reads what it
// is given, so its graphs make x 16-bit themselves (a cast of an f32 parameter, whose
// gradient comes back through the cast in f32) with f32 gamma, beta and running
// statistics, and cast y back to f32 for the comparison. And directly: explicit 16-bit
// operands at Precision::f32, where no pass touches the graph.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../test_util.h"
#include "common/half.h"
#include "conv_case.h"
#include "gpu_check.h"
#include "pool_case.h"

using namespace seam;
using seam::gpu_testing::build_conv;
using seam::gpu_testing::CompareOptions;
using seam::gpu_testing::compare_with_cpu;
using seam::gpu_testing::conv_files;
using seam::gpu_testing::ConvCase;
using seam::gpu_testing::kLows;
using seam::gpu_testing::Low;
using seam::gpu_testing::GpuCase;
using seam::gpu_testing::lines_of;
using seam::gpu_testing::lines_starting;
using seam::gpu_testing::TempCacheDir;
using seam::gpu_testing::Tolerance;

namespace {

}  // namespace

// ------------------------------------------------------------------------------------------
// conv2d

namespace {

// Beside shared_conv_cases(), run by every conv2d test file.
std::vector<ConvCase> conv_cases() {
  return gpu_testing::shared_conv_cases_and({
      // 1x1 with stride 2 on channels a tensor core takes whole
      {{2, 8, 8, 8}, {8, 8, 1, 1}, false, {.stride = {2, 2}}},
  });
}

}  // namespace

TEST(GpuPrecisionConv, Conv2dAndItsGradientsMatchTheCpu) {
  // x is a parameter (build_conv), so that conv2d_grad_input runs beside
  // conv2d_grad_weight and the bias gradient.
  for (const Low& low : kLows)
    for (const ConvCase& k : conv_cases()) {
      SCOPED_TRACE(std::string(low.name) + " " + k.str());
      compare_with_cpu([&](GpuCase& c) { return build_conv(c, k); }, low.options());
    }
}

TEST(GpuPrecisionConv, WeightGradientOnlyWhenXIsData) {
  // x is f32 data, cast by the pass: conv2d_grad_weight and the bias sum, no grad_input.
  for (const Low& low : kLows) {
    SCOPED_TRACE(low.name);
    compare_with_cpu(
        [](GpuCase& c) {
          return conv2d(c.data("x", {3, 3, 9, 9}), c.param("w", {4, 3, 3, 3}), c.param("b", {4}),
                        {.stride = {2, 2}, .padding = {1, 1}});
        },
        low.options());
  }
}

TEST(GpuPrecisionConv, SixteenBitOperandsWithoutThePass) {
  // Every operand 16-bit as given: x an input, w and b casts of f32 parameters.
  const std::vector<ConvCase> shared = gpu_testing::shared_conv_cases();
  // 3x3 with bias, groups 2, the large layer
  for (const Low& low : kLows)
    for (const ConvCase& k : {shared[0], shared[3], shared.back()}) {
      SCOPED_TRACE(std::string(low.name) + " " + k.str());
      compare_with_cpu(
          [&](GpuCase& c) {
            Var x = c.data("x", k.x, -1, 1, low.dtype);
            Var w = cast(c.param("w", k.w), low.dtype);
            std::optional<Var> b;
            if (k.bias) b = cast(c.param("b", {k.w[0]}), low.dtype);
            Var y = conv2d(x, w, b, k.o);
            EXPECT_EQ(y.dtype(), low.dtype);
            return cast(y, DType::f32);
          },
          low.direct());
    }
}

TEST(GpuPrecisionConv, TwoLayersOfOneShapeShareTheirChoice) {
  // The second layer's shapes equal the first's: its algorithms come from the cache. The
  // relu after conv + bias also tells whether y was rounded once: a bias added to an
  // already rounded 16-bit y moves sums near zero across the relu's kink (seen on the H200).
  for (const Low& low : kLows) {
    SCOPED_TRACE(low.name);
    compare_with_cpu(
        [](GpuCase& c) {
          Var h = relu(conv2d(c.param("x", {2, 8, 8, 8}), c.param("w1", {8, 8, 3, 3}), c.param("b1", {8}),
                              {.padding = {1, 1}}));
          return conv2d(h, c.param("w2", {8, 8, 3, 3}), c.param("b2", {8}), {.padding = {1, 1}});
        },
        low.options());
  }
}

// ------------------------------------------------------------------------------------------
// The algorithm cache keeps 16-bit convolutions apart from f32 ones

namespace {

// Compiles one convolution forward of dtype t at Precision::f32 (f32 data: FMA math).
void compile_conv(DType t, const Shape& x, const Shape& w) {
  Graph g;
  Var y = conv2d(g.input("x", x, t), g.input("w", w, t), std::nullopt, {.padding = {1, 1}});
  Model m(g, {.seed = 1, .device = Device::cuda});
  Program p = m.compile({.mode = Mode::eval, .outputs = {y.id()}});
}

}  // namespace

TEST(GpuPrecisionConvCache, SixteenBitConvolutionsAreChosenApartFromF32) {
  gpu_testing::ClassicConvApi classic;
  TempCacheDir cache;
  // A cache folder of its own, so that every dtype is measured here and written to it.
  const Shape x{2, 5, 13, 11}, w{6, 5, 3, 3};
  for (DType t : {DType::f32, DType::bf16, DType::f16}) compile_conv(t, x, w);
  const std::string geometry = "fwd x=2,5,13,11 w=6,5,3,3 y=2,6,13,11 stride=1,1 pad=1,1 dil=1,1 groups=1 ";
  const std::vector<std::string> keys = {geometry + "dtype=f32 math=fma ", geometry + "dtype=bf16 math=tensor ",
                                         geometry + "dtype=f16 math=tensor "};
  const auto files = conv_files(cache);
  ASSERT_EQ(files.size(), 1u) << cache.dir();
  const auto lines = lines_of(files[0]);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind(gpu_testing::kConvCacheHeader, 0), 0u) << lines[0];
  for (const std::string& key : keys)
    EXPECT_EQ(lines_starting(lines, key), 1) << "lines starting with '" << key << "' in " << files[0];
}

TEST(GpuPrecisionConvCache, LinesWhoseMathDoesNotFitTheirDtypeAreDropped) {
  gpu_testing::ClassicConvApi classic;
  TempCacheDir cache;
  compile_conv(DType::bf16, {1, 3, 9, 7}, {2, 3, 3, 3});
  auto files = conv_files(cache);
  ASSERT_EQ(files.size(), 1u) << cache.dir();
  // 16-bit data never runs with f32 math words, nor f32 data with the tensor one; an
  // unknown dtype is no convolution this build runs.
  const std::string geometry = "fwd x=1,4,9,9 w=2,4,3,3 y=1,2,9,9 stride=1,1 pad=1,1 dil=1,1 groups=1 ";
  const std::vector<std::string> bad = {geometry + "dtype=bf16 math=tf32 algo=0 algo_math=0 ws=0",
                                        geometry + "dtype=f16 math=fma algo=0 algo_math=3 ws=0",
                                        geometry + "dtype=f32 math=tensor algo=0 algo_math=1 ws=0",
                                        geometry + "dtype=i32 math=tensor algo=0 algo_math=1 ws=0"};
  {
    std::ofstream out(files[0], std::ios::app);
    for (const std::string& l : bad) out << l << '\n';
  }
  // A new shape is measured and the file rewritten from what parses.
  compile_conv(DType::f16, {1, 3, 9, 7}, {2, 3, 3, 3});
  const auto lines = lines_of(files[0]);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind(gpu_testing::kConvCacheHeader, 0), 0u) << lines[0];
  int bf16 = 0, f16 = 0;
  for (const std::string& l : lines) {
    for (const std::string& b : bad) EXPECT_NE(l, b);
    bf16 += l.find(" dtype=bf16 math=tensor ") != std::string::npos;
    f16 += l.find(" dtype=f16 math=tensor ") != std::string::npos;
  }
  EXPECT_EQ(bf16, 1);
  EXPECT_EQ(f16, 1);
}

// ------------------------------------------------------------------------------------------
// batch_norm: 16-bit x and y, f32 gamma, beta and statistics

namespace {

Var build_bn(GpuCase& c, const Shape& s, DType t, Init rm, Init rv) {
  const Shape ch{s[1]};
  Var x = cast(c.param("x", s, -2, 2), t);
  Var y = batch_norm(x, c.param("gamma", ch, 0.5, 1.5), c.param("beta", ch), c.state("running_mean", ch, rm),
                     c.state("running_var", ch, rv), 0.1, 1e-5);
  EXPECT_EQ(y.dtype(), t);
  return cast(y, DType::f32);
}

// Not N * inner = 2: there xhat is +-1 whatever x is, and dx is all rounding.
const std::vector<Shape> kBnShapes = {{8, 5}, {4, 3, 5, 5}, {4, 3, 6}, {16, 8, 7, 7}};

}  // namespace

TEST(GpuPrecisionBatchNorm, TrainingMatchesTheCpuIncludingRunningStats) {
  // runs = 2: the running statistics are compared after two updates.
  for (const Low& low : kLows)
    for (const Shape& s : kBnShapes) {
      SCOPED_TRACE(std::string(low.name) + " " + shape_str(s));
      compare_with_cpu([&](GpuCase& c) { return build_bn(c, s, low.dtype, Init::zeros(), Init::ones()); },
                       low.options().with_runs(2));
      compare_with_cpu(
          [&](GpuCase& c) {
            return build_bn(c, s, low.dtype, Init::uniform(-0.5, 0.5), Init::uniform(0.5, 1.5));
          },
          low.options().with_runs(2));
    }
}

TEST(GpuPrecisionBatchNorm, EvaluationMatchesTheCpu) {
  // The running statistics normalize; the gradient is the kernel of batch_norm.cu.
  for (const Low& low : kLows)
    for (const Shape& s : {Shape{8, 5}, Shape{4, 3, 5, 5}, Shape{1, 3, 2, 2}}) {
      SCOPED_TRACE(std::string(low.name) + " " + shape_str(s));
      compare_with_cpu(
          [&](GpuCase& c) {
            return build_bn(c, s, low.dtype, Init::uniform(-0.5, 0.5), Init::uniform(0.5, 1.5));
          },
          low.options().in_mode(Mode::eval).with_runs(2));
    }
}

TEST(GpuPrecisionBatchNorm, OnSixteenBitDataWithoutAnInputGradient) {
  // x is a 16-bit input: nothing reads batch_norm_grad's dx.
  for (const Low& low : kLows) {
    SCOPED_TRACE(low.name);
    compare_with_cpu(
        [&](GpuCase& c) {
          Var x = c.data("x", {4, 3, 5, 5}, -2, 2, low.dtype);
          Var y = batch_norm(x, c.param("gamma", {3}, 0.5, 1.5), c.param("beta", {3}),
                             c.state("running_mean", {3}, Init::zeros()), c.state("running_var", {3}, Init::ones()),
                             0.1, 1e-5);
          return cast(relu(y), DType::f32);
        },
        low.direct().with_runs(2));
  }
}

// ------------------------------------------------------------------------------------------
// Pooling: one dtype throughout (the pass gives x a 16-bit working copy)

namespace {

using seam::gpu_testing::PoolCase;

std::vector<PoolCase> pool_cases() {
  return {
      {{2, 3, 8, 8}, {2, 2}, {}, {0, 0}},      // the usual 2x2, stride = kernel
      {{3, 2, 7, 7}, {3, 3}, {2, 2}, {1, 1}},  // overlapping windows with padding
      {{1, 2, 7, 6}, {3, 2}, {1, 2}, {1, 1}},  // asymmetric, padding = kernel / 2
      {{2, 2, 9, 9}, {5, 3}, {3, 2}, {2, 1}},  // windows cut by the padding at both ends
  };
}

}  // namespace

TEST(GpuPrecisionPool, MaxPoolMatchesTheCpu) {
  for (const Low& low : kLows)
    for (const PoolCase& k : pool_cases()) {
      SCOPED_TRACE(std::string(low.name) + " " + k.str());
      compare_with_cpu([&](GpuCase& c) { return max_pool2d(c.param("x", k.x), k.kernel, k.stride, k.padding); },
                       low.options());
    }
}

TEST(GpuPrecisionPool, MaxPoolGradientGoesToTheFirstOfTiedMaxima) {
  // 16-bit values tie often; here every window holds its maximum twice or more.
  for (const Low& low : kLows) {
    SCOPED_TRACE(low.name);
    compare_with_cpu(
        [](GpuCase& c) { return max_pool2d(broadcast_to(c.param("x", {2, 3, 1, 6}), {2, 3, 6, 6}), {2, 2}); },
        low.options());
    compare_with_cpu(
        [](GpuCase& c) {
          return max_pool2d(broadcast_to(c.param("x", {1, 2, 1, 7}), {1, 2, 7, 7}), {3, 3}, {2, 2}, {1, 1});
        },
        low.options());
  }
}

TEST(GpuPrecisionPool, AvgPoolMatchesTheCpuWithAndWithoutPaddingInTheCount) {
  for (const Low& low : kLows)
    for (bool include : {true, false})
      for (const PoolCase& k : pool_cases()) {
        SCOPED_TRACE(std::string(low.name) + " " + k.str() + (include ? " count_include_pad" : " count_exclude_pad"));
        compare_with_cpu(
            [&](GpuCase& c) { return avg_pool2d(c.param("x", k.x), k.kernel, k.stride, k.padding, include); },
            low.options());
      }
}

TEST(GpuPrecisionPool, GlobalAvgPoolMatchesTheCpu) {
  // Small planes (a warp each), large ones (a block each), a single value.
  for (const Low& low : kLows)
    for (const Shape& s : {Shape{3, 4, 7, 7}, Shape{2, 3, 40, 40}, Shape{1, 1, 1, 1}, Shape{5, 70, 3, 2}}) {
      SCOPED_TRACE(std::string(low.name) + " " + shape_str(s));
      compare_with_cpu([&](GpuCase& c) { return global_avg_pool(c.param("x", s)); }, low.options());
    }
}

TEST(GpuPrecisionPool, SixteenBitOperandsWithoutThePass) {
  for (const Low& low : kLows) {
    SCOPED_TRACE(low.name);
    compare_with_cpu(
        [&](GpuCase& c) {
          Var x = cast(c.param("x", {2, 3, 9, 9}), low.dtype);
          Var m = max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
          Var a = avg_pool2d(m, {2, 2}, {1, 1}, {1, 1}, false);
          return cast(global_avg_pool(a), DType::f32);
        },
        low.direct());
  }
}

// ------------------------------------------------------------------------------------------
// A small CNN as a whole: (conv, batch norm, relu, pool) x 2, linear, cross-entropy

namespace {

enum class Head { avg_pool, global_pool };

// No convolution bias: batch norm removes it, so its gradient would be rounding noise on
// both sides.
Var small_cnn(GpuCase& c, Head head) {
  Var x = c.data("x", {8, 3, 12, 12});
  Var labels = c.labels("labels", {8}, 10);
  Var h = nn::conv2d(x, 8, 3, "conv1", {.padding = {1, 1}}, false);
  h = max_pool2d(relu(nn::batch_norm(h, "bn1")), {2, 2});  // [8, 8, 6, 6]
  h = nn::conv2d(h, 16, 3, "conv2", {.padding = {1, 1}}, false);
  h = relu(nn::batch_norm(h, "bn2"));
  h = head == Head::avg_pool ? flatten(avg_pool2d(h, {2, 2})) : global_avg_pool(h);  // [8, 144] or [8, 16]
  return cross_entropy(nn::linear(h, 10, "fc"), labels);
}

CompareOptions as_loss(CompareOptions o) {
  o.output_is_loss = true;
  return o;
}

}  // namespace

TEST(GpuPrecisionCnn, TrainingMatchesTheCpu) {
  for (const Low& low : kLows)
    for (Head head : {Head::avg_pool, Head::global_pool}) {
      SCOPED_TRACE(std::string(low.name) + (head == Head::avg_pool ? " avg_pool head" : " global_avg_pool head"));
      compare_with_cpu([&](GpuCase& c) { return small_cnn(c, head); }, as_loss(low.options()).with_runs(2));
    }
}

TEST(GpuPrecisionCnn, EvaluationMatchesTheCpu) {
  for (const Low& low : kLows) {
    SCOPED_TRACE(low.name);
    compare_with_cpu([](GpuCase& c) { return small_cnn(c, Head::avg_pool); },
                     as_loss(low.options()).in_mode(Mode::eval));
  }
}

