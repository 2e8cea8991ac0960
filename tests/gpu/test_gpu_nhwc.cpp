// The cuDNN-backed ops in layout nhwc (src/ops/layout.h) on the GPU against the CPU, which
// runs an nhwc step as its NCHW kernel on permuted copies: conv2d with its input and
// weight gradients, batch_norm in training and evaluation, max / average / global average
// pooling, forward and backward, at f32, TF32, bf16 and f16.
//
// The graphs carry layout "nhwc" themselves (Graph::add with the attribute), so the
// layout pass leaves them as written: x is [N, H, W, C], the filter [C_out, kh, kw,
// C_in/groups], y [N, OH, OW, C_out]. Each case is written with its NCHW geometry and
// reordered here. Inputs are fresh random values (gpu_check.h), so any indexing slip in
// a channels-last kernel or descriptor shows.
//
// Also: the NHWC convolution against the NCHW one of the same values on the GPU, the
// algorithm cache's layout token (and its old lines without one), and the cuDNN path the
// channels-last batch norm took, printed for the run's log.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../test_util.h"
#include "backend/backend.h"
#include "conv_case.h"
#include "gpu_check.h"
#include "ops/layout.h"
#include "pool_case.h"

using namespace seam;
using seam::gpu_testing::compare_with_cpu;
using seam::gpu_testing::CompareOptions;
using seam::gpu_testing::conv_files;
using seam::gpu_testing::ConvCase;
using seam::gpu_testing::kLows;
using seam::gpu_testing::Low;
using seam::gpu_testing::expect_close;
using seam::gpu_testing::f32;
using seam::gpu_testing::GpuCase;
using seam::gpu_testing::lines_of;
using seam::gpu_testing::lines_starting;
using seam::gpu_testing::PoolCase;
using seam::gpu_testing::ScopedEnv;
using seam::gpu_testing::TempCacheDir;
using seam::gpu_testing::tf32_nhwc;
using seam::gpu_testing::Tolerance;

namespace {

const std::string kNhwc = "nhwc";

// compare_with_cpu on a graph whose output may be one of its own channels-last values,
// compared through an exact permute to NCHW: Program::read reorders an output stored
// channels-last as one the layout pass moved (src/model.cpp), which a value the graph
// itself declares [N, H, W, C] is not.
double compare_nhwc(const std::function<Var(GpuCase&)>& build, const CompareOptions& o) {
  return compare_with_cpu(
      [&](GpuCase& c) {
        Var y = build(c);
        return y.type().layout == DataLayout::nhwc ? permute(y, to_nchw_perm()) : y;
      },
      o);
}

// ------------------------------------------------------------------------------------------
// Builders of nhwc nodes

Attrs conv_attrs(const Conv2dOptions& o, const std::string& layout) {
  return {{"stride", o.stride},
          {"padding", o.padding},
          {"dilation", o.dilation},
          {"groups", o.groups},
          {"layout", layout}};
}

// x [N, H, W, C], w [C_out, kh, kw, C_in/groups], b [C_out].
Var conv2d_nhwc(Var x, Var w, std::optional<Var> b, const Conv2dOptions& o) {
  std::vector<ValueId> in{x.id(), w.id()};
  if (b) in.push_back(b->id());
  Var y = x.graph().add1(Op::conv2d, in, conv_attrs(o, kNhwc));
  EXPECT_EQ(y.type().layout, DataLayout::nhwc) << y.type().str();
  return y;
}

Var batch_norm_nhwc(GpuCase& c, Var x, Init rm, Init rv) {
  const Shape ch{x.shape()[3]};
  auto out = c.g.add(Op::batch_norm,
                     {x.id(), c.param("gamma", ch, 0.5, 1.5).id(), c.param("beta", ch).id(),
                      c.state("running_mean", ch, rm).id(), c.state("running_var", ch, rv).id()},
                     {{"momentum", 0.1}, {"eps", 1e-5}, {"layout", kNhwc}});
  return c.g.var(out[0]);
}

Var max_pool_nhwc(Var x, const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                  const std::vector<int64_t>& padding) {
  return x.graph().add1(Op::max_pool2d, {x.id()},
                        {{"kernel", kernel}, {"stride", stride}, {"padding", padding}, {"layout", kNhwc}});
}

Var avg_pool_nhwc(Var x, const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                  const std::vector<int64_t>& padding, bool include) {
  return x.graph().add1(Op::avg_pool2d, {x.id()},
                        {{"kernel", kernel},
                         {"stride", stride},
                         {"padding", padding},
                         {"count_include_pad", int64_t{include}},
                         {"layout", kNhwc}});
}

Var global_avg_pool_nhwc(Var x) { return x.graph().add1(Op::global_avg_pool, {x.id()}, {{"layout", kNhwc}}); }

// ------------------------------------------------------------------------------------------
// Convolution cases: NCHW geometry, reordered for the graph

// A case's trace: its NCHW geometry, and that it ran NHWC.
std::string trace(const ConvCase& k) { return k.str() + " (NCHW geometry, run NHWC)"; }

// Beside shared_conv_cases(), run by every conv2d test file.
std::vector<ConvCase> own_conv_cases() {
  return {
      // 1x1 stride 2 on channels a tensor core takes whole
      {{2, 8, 8, 8}, {8, 8, 1, 1}, false, {.stride = {2, 2}}},
      // dilation 2 with padding
      {{3, 2, 7, 7}, {4, 2, 3, 3}, true, {.padding = {1, 1}, .dilation = {2, 2}}},
      // groups 2 with stride 2, no bias; depthwise with multiplier 2
      {{2, 8, 6, 6}, {8, 4, 3, 3}, false, {.stride = {2, 2}, .padding = {1, 1}, .groups = 2}},
      {{1, 3, 7, 7}, {6, 1, 3, 3}, false, {.groups = 3}},
      // the 7x7 stride-2 stem of a ResNet, with and without bias
      {{2, 3, 16, 16}, {8, 3, 7, 7}, true, {.stride = {2, 2}, .padding = {3, 3}}},
      {{1, 4, 15, 13}, {8, 4, 7, 7}, false, {.stride = {2, 2}, .padding = {3, 3}}},
  };
}

std::vector<ConvCase> conv_cases() { return gpu_testing::shared_conv_cases_and(own_conv_cases()); }

// x is a parameter, so that conv2d_grad_input runs beside conv2d_grad_weight (and the
// bias gradient, a sum over N, H, W of dy).
Var build_conv_nhwc(GpuCase& c, const ConvCase& k) {
  Var x = c.param("x", nhwc_order(k.x));
  Var w = c.param("w", nhwc_order(k.w));
  std::optional<Var> b;
  if (k.bias) b = c.param("b", {k.w[0]});
  return conv2d_nhwc(x, w, b, k.o);
}

}  // namespace

// ------------------------------------------------------------------------------------------
// conv2d

TEST(GpuNhwcConv, MatchesTheCpuWithTf32) {
  for (const ConvCase& k : conv_cases()) {
    SCOPED_TRACE(trace(k));
    compare_nhwc([&](GpuCase& c) { return build_conv_nhwc(c, k); }, CompareOptions(Precision::tf32, k.tf32()));
  }
}

TEST(GpuNhwcConv, MatchesTheCpuWithoutTf32) {
  for (const ConvCase& k : conv_cases()) {
    SCOPED_TRACE(trace(k));
    compare_nhwc([&](GpuCase& c) { return build_conv_nhwc(c, k); }, CompareOptions(Precision::f32, k.no_tf32));
  }
}

TEST(GpuNhwcConv, SixteenBitMatchesTheCpu) {
  // Through the precision pass: x, w and b get 16-bit working copies.
  for (const Low& low : kLows)
    for (const ConvCase& k : conv_cases()) {
      SCOPED_TRACE(std::string(low.name) + " " + trace(k));
      compare_nhwc([&](GpuCase& c) { return build_conv_nhwc(c, k); }, low.options());
    }
}

TEST(GpuNhwcConv, SixteenBitOperandsWithoutThePass) {
  // Every operand 16-bit as given: x an input, w and b casts of f32 parameters.
  const std::vector<ConvCase> shared = gpu_testing::shared_conv_cases(), own = own_conv_cases();
  // 3x3 with bias, groups 2, depthwise, the first ResNet stem, the large layer
  for (const Low& low : kLows)
    for (const ConvCase& k : {shared[0], shared[3], shared[4], own[4], shared.back()}) {
      SCOPED_TRACE(std::string(low.name) + " " + trace(k));
      compare_nhwc(
          [&](GpuCase& c) {
            Var x = c.data("x", nhwc_order(k.x), -1, 1, low.dtype);
            Var w = cast(c.param("w", nhwc_order(k.w)), low.dtype);
            std::optional<Var> b;
            if (k.bias) b = cast(c.param("b", {k.w[0]}), low.dtype);
            Var y = conv2d_nhwc(x, w, b, k.o);
            EXPECT_EQ(y.dtype(), low.dtype);
            return cast(y, DType::f32);
          },
          low.direct());
    }
}

namespace {

// Case k channels-last against the CPU at TF32, bf16 and f16 (the precisions seam's own
// weight-gradient kernels run at).
void on_tensor_cores_matches_the_cpu(const ConvCase& k) {
  SCOPED_TRACE("TF32 " + trace(k));
  compare_nhwc([&](GpuCase& c) { return build_conv_nhwc(c, k); }, CompareOptions(Precision::tf32, k.tf32()));
  for (const Low& low : kLows) {
    SCOPED_TRACE(std::string(low.name) + " " + trace(k));
    compare_nhwc([&](GpuCase& c) { return build_conv_nhwc(c, k); }, low.options());
  }
}

}  // namespace

// seam's own weight-gradient kernel (src/backend/cuda/conv_wgrad.h), forced wherever it
// applies (ungrouped, on tensor cores): every case, and layers whose channels fill no
// whole tile (K 48 of 64 rows, 216 of 256 columns) or take scalar copies (C 3, K 6),
// against the CPU at TF32, bf16 and f16, and the step says it ran the kernel.
TEST(GpuNhwcConv, OwnWeightGradientMatchesTheCpu) {
  ScopedEnv own("SEAM_CONV_WGRAD", "own");
  std::vector<ConvCase> cases = conv_cases();
  cases.push_back({{4, 32, 28, 28}, {32, 32, 3, 3}, false, {.padding = {1, 1}}});
  cases.push_back({{3, 24, 9, 11}, {48, 24, 3, 3}, false, {.stride = {2, 1}, .padding = {1, 1}}});
  cases.push_back({{2, 3, 10, 9}, {6, 3, 3, 3}, false, {.padding = {1, 1}, .dilation = {2, 1}}});
  for (const ConvCase& k : cases) {
    on_tensor_cores_matches_the_cpu(k);
  }
}

// The band kernel (src/backend/cuda/conv_wgrad_band.cu), forced where it applies: stride
// 1, the output of the input's size, channels in whole tiles of 32. Layers of one and two
// tiles each way, a dilated 3x3, a 1x3, and pixel counts that end stages and chunks
// part-way, against the CPU at TF32, bf16 and f16; each step says it ran the band.
TEST(GpuNhwcConv, BandWeightGradientMatchesTheCpu) {
  ScopedEnv band("SEAM_CONV_WGRAD", "band");
  const std::vector<ConvCase> cases{
      {{4, 32, 28, 28}, {32, 32, 3, 3}, false, {.padding = {1, 1}}},
      {{3, 64, 7, 7}, {64, 64, 3, 3}, false, {.padding = {1, 1}}},
      {{2, 32, 9, 11}, {32, 32, 3, 3}, true, {.padding = {2, 2}, .dilation = {2, 2}}},
      {{2, 32, 6, 10}, {64, 32, 1, 3}, false, {.padding = {0, 1}}},
  };
  for (const ConvCase& k : cases) {
    on_tensor_cores_matches_the_cpu(k);
    GpuCase c(7);
    Var y = build_conv_nhwc(c, k);
    Var loss = sum(mul(y, c.data("r", y.shape())));
    Model m(c.g, {.seed = 1, .device = Device::cuda, .precision = Precision::tf32});
    Program p = m.compile({.loss = loss.id(), .gradients = true});
    int bands = 0;
    std::string all;
    for (auto& [step, what] : p.executable().stats().choices) {
      bands += what.find("conv2d_grad_weight: seam's kernel") == 0 && what.find("): band, ") != std::string::npos;
      all += what + "\n";
    }
    EXPECT_EQ(bands, 1) << all;
  }
}

TEST(GpuNhwcConv, BandKernelRunsInAStep) {
  // One small 3x3 layer (84 pixels: a stage and part of one) on the band kernel at TF32,
  // run as a step; small enough for compute-sanitizer's racecheck, which runs this.
  ScopedEnv band("SEAM_CONV_WGRAD", "band");
  GpuCase c(9);
  Var y = build_conv_nhwc(c, {{2, 32, 6, 7}, {32, 32, 3, 3}, false, {.padding = {1, 1}}});
  Var loss = sum(mul(y, c.data("r", y.shape())));
  Model m(c.g, {.seed = 1, .device = Device::cuda, .precision = Precision::tf32});
  Program p = m.compile({.loss = loss.id(), .gradients = true});
  std::string all;
  for (auto& [step, what] : p.executable().stats().choices) all += what + "\n";
  EXPECT_NE(all.find("): band, 1 chunks (SEAM_CONV_WGRAD=band)"), std::string::npos) << all;
  for (auto& [name, bytes] : c.feeds) p.set_input(name, bytes);
  p.run();
  p.check();
}

TEST(GpuNhwcConv, OwnWeightGradientSaysWhichCopiesItTook) {
  // Three layers at TF32, forced onto seam's kernel: 16 filters over 3 channels copy dy
  // 16 bytes at a time and x element by element, 8 over 16 channels both 16 bytes at a
  // time, 6 over 8 both element by element; the step runs (compute-sanitizer's racecheck
  // runs this).
  ScopedEnv own("SEAM_CONV_WGRAD", "own");
  GpuCase c(5);
  const ConvCase first{{2, 3, 10, 9}, {16, 3, 3, 3}, false, {.padding = {1, 1}}};
  const Conv2dOptions same{.padding = {1, 1}};
  Var y = conv2d_nhwc(build_conv_nhwc(c, first), c.param("w2", {8, 3, 3, 16}), std::nullopt, same);
  y = conv2d_nhwc(y, c.param("w3", {6, 3, 3, 8}), std::nullopt, same);
  Var loss = sum(mul(y, c.data("r", y.shape())));
  Model m(c.g, {.seed = 1, .device = Device::cuda, .precision = Precision::tf32});
  Program p = m.compile({.loss = loss.id(), .gradients = true});
  std::map<std::string, int> copies;
  for (auto& [step, what] : p.executable().stats().choices)
    for (const char* kind : {"16-byte copies;", "16-byte copies of dy, scalar of x;", "scalar copies;"})
      copies[kind] += what.find(std::string("seam's kernel (") + kind) != std::string::npos;
  EXPECT_EQ(copies["16-byte copies of dy, scalar of x;"], 1);
  EXPECT_EQ(copies["16-byte copies;"], 1);
  EXPECT_EQ(copies["scalar copies;"], 1);
  for (auto& [name, bytes] : c.feeds) p.set_input(name, bytes);
  p.run();
  p.check();
}

TEST(GpuNhwcConv, WeightGradientOnlyWhenXIsData) {
  // x is data: conv2d_grad_weight and the bias sum, no conv2d_grad_input.
  auto build = [](GpuCase& c) {
    return conv2d_nhwc(c.data("x", {3, 9, 9, 3}), c.param("w", {4, 3, 3, 3}), c.param("b", {4}),
                       {.stride = {2, 2}, .padding = {1, 1}});
  };
  compare_nhwc(build, tf32_nhwc());
  compare_nhwc(build, CompareOptions(Precision::f32, Tolerance::f32()));
  for (const Low& low : kLows) {
    SCOPED_TRACE(low.name);
    compare_nhwc(build, low.options());
  }
}

TEST(GpuNhwcConv, TwoLayersWithReluBetween) {
  // The second layer's shapes equal the first's (its algorithms come from the cache); the
  // relu after conv + bias tells whether the channels-last bias landed on the right
  // channel and y was rounded once.
  for (const CompareOptions& o : {tf32_nhwc(), gpu_testing::bf16(), gpu_testing::f16()}) {
    SCOPED_TRACE(precision_name(o.precision));
    compare_nhwc(
        [](GpuCase& c) {
          Var h = relu(conv2d_nhwc(c.param("x", {2, 8, 8, 8}), c.param("w1", {8, 3, 3, 8}), c.param("b1", {8}),
                                   {.padding = {1, 1}}));
          return conv2d_nhwc(h, c.param("w2", {8, 3, 3, 8}), c.param("b2", {8}), {.padding = {1, 1}});
        },
        o);
  }
}

namespace {

// One convolution on the GPU, in NCHW or (transposing x and w to channels-last, and y
// back) in NHWC; both graphs declare the same parameters and input in the same order, so
// they start from the same values (Model::reset seeds each by its position in the graph).
struct ConvRun {
  std::vector<float> y;
  std::vector<std::vector<float>> grads;  // x, w, b?
};

ConvRun run_on_gpu(const ConvCase& k, bool nhwc, Precision precision) {
  Graph g;
  Var x = g.param("x", k.x, Init::uniform(-1, 1));
  Var w = g.param("w", k.w, Init::uniform(-1, 1));
  std::optional<Var> b;
  if (k.bias) b = g.param("b", {k.w[0]}, Init::uniform(-1, 1));
  // The output's NCHW shape, from an NCHW node that only this graph's inference sees.
  const Shape ys = Graph(g).add1(Op::conv2d, {x.id(), w.id()}, conv_attrs(k.o, "nchw")).shape();
  Var r = g.input("r", ys);
  Var y;
  if (nhwc) {
    std::vector<ValueId> in{permute(x, to_nhwc_perm()).id(), permute(w, to_nhwc_perm()).id()};
    if (b) in.push_back(b->id());
    y = permute(g.add1(Op::conv2d, in, conv_attrs(k.o, kNhwc)), to_nchw_perm());
  } else {
    std::vector<ValueId> in{x.id(), w.id()};
    if (b) in.push_back(b->id());
    y = g.add1(Op::conv2d, in, conv_attrs(k.o, "nchw"));
  }
  Var loss = sum(mul(y, r));
  Model m(g, {.seed = 5, .device = Device::cuda, .precision = precision, .layout = LayoutPolicy::nchw});
  Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {y.id()}});
  // The convolutions ran in the layout asked for, not one a pass chose.
  int convs = 0;
  for (const PlanStep& s : p.plan().steps)
    if (s.op == Op::conv2d || s.op == Op::conv2d_grad_input || s.op == Op::conv2d_grad_weight) {
      ++convs;
      EXPECT_EQ(is_nhwc(s.attrs), nhwc) << op_name(s.op) << " '" << s.name << "'";
    }
  EXPECT_EQ(convs, 3);
  p.set_input("r", seam::testing::bytes_of(seam::testing::random_floats(static_cast<size_t>(numel(ys)), 99)));
  p.run();
  ConvRun out;
  out.y = p.read_as<float>(y.name());
  for (const char* name : {"x", "w", "b"})
    if (name != std::string("b") || k.bias) out.grads.push_back(p.grad_as<float>(name));
  return out;
}

}  // namespace

TEST(GpuNhwcConv, MatchesTheNchwConvolutionOnTheGpu) {
  // Both layouts on cuDNN, each with the algorithm it measures fastest: each is within
  // the precision's tolerance of the exact result, so the two are within twice that of
  // each other elementwise (a grouped f32 case, both on the classic API, once came out
  // 9.2e-6 apart on a dx of 0.056, where one tolerance allows 6.6e-6).
  for (Precision precision : {Precision::f32, Precision::tf32})
    for (const ConvCase& k : conv_cases()) {
      SCOPED_TRACE(std::string(precision_name(precision)) + " " + trace(k));
      Tolerance tol = precision == Precision::tf32 ? k.tf32() : k.no_tf32;
      tol.elem_rel *= 2;
      tol.atol *= 2;
      const ConvRun nchw = run_on_gpu(k, false, precision);
      const ConvRun nhwc = run_on_gpu(k, true, precision);
      expect_close(nhwc.y, nchw.y, tol, "y");
      ASSERT_EQ(nhwc.grads.size(), nchw.grads.size());
      const char* names[] = {"dx", "dw", "db"};
      for (size_t i = 0; i < nchw.grads.size(); ++i) expect_close(nhwc.grads[i], nchw.grads[i], tol, names[i]);
    }
}

// ------------------------------------------------------------------------------------------
// The algorithm cache keeps the layouts apart

namespace {

// One f32 convolution forward (padding 1) at Precision::f32 (FMA math), x and w given in
// NCHW geometry.
void compile_conv(const Shape& x, const Shape& w, bool nhwc) {
  Graph g;
  Var xi = g.input("x", nhwc ? nhwc_order(x) : x);
  Var wi = g.input("w", nhwc ? nhwc_order(w) : w);
  Var y = g.add1(Op::conv2d, {xi.id(), wi.id()}, conv_attrs({.padding = {1, 1}}, nhwc ? kNhwc : "nchw"));
  Model m(g, {.seed = 1, .device = Device::cuda, .layout = LayoutPolicy::nchw});
  Program p = m.compile({.mode = Mode::eval, .outputs = {y.id()}});
  p.set_input("x", seam::testing::bytes_of(seam::testing::random_floats(static_cast<size_t>(numel(x)), 3)));
  p.set_input("w", seam::testing::bytes_of(seam::testing::random_floats(static_cast<size_t>(numel(w)), 4)));
  p.run();
  p.check();
}

}  // namespace

TEST(GpuNhwcConvCache, EachLayoutHasALineOfItsOwnWithLogicalDims) {
  gpu_testing::ClassicConvApi classic;
  TempCacheDir cache;  // a folder of its own: both are measured here
  const Shape x{2, 5, 13, 11}, w{6, 5, 3, 3};
  compile_conv(x, w, false);
  compile_conv(x, w, true);
  const std::string geometry =
      "fwd x=2,5,13,11 w=6,5,3,3 y=2,6,13,11 stride=1,1 pad=1,1 dil=1,1 groups=1 dtype=f32 math=fma ";
  const auto files = conv_files(cache);
  ASSERT_EQ(files.size(), 1u) << cache.dir();
  const auto lines = lines_of(files[0]);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind(gpu_testing::kConvCacheHeader, 0), 0u) << lines[0];
  EXPECT_EQ(lines_starting(lines, geometry + "layout=nchw algo="), 1) << files[0];
  EXPECT_EQ(lines_starting(lines, geometry + "layout=nhwc algo="), 1) << files[0];
}

TEST(GpuNhwcConvCache, LinesWithoutALayoutAreReadAsNchw) {
  gpu_testing::ClassicConvApi classic;
  TempCacheDir cache;
  compile_conv({1, 2, 5, 5}, {2, 2, 3, 3}, false);
  const auto files = conv_files(cache);
  ASSERT_EQ(files.size(), 1u) << cache.dir();
  // A line as builds before the layout token wrote it. Its ws is informational (the
  // workspace is queried again before use) and no measurement gives 12345: if the line
  // comes back rewritten with it, it was read, not measured again.
  const std::string geometry =
      "fwd x=1,3,9,7 w=2,3,3,3 y=1,2,9,7 stride=1,1 pad=1,1 dil=1,1 groups=1 dtype=f32 math=fma";
  const std::string old_line = geometry + " algo=0 algo_math=3 ws=12345";  // IMPLICIT_GEMM, FMA
  const std::string new_line = geometry + " layout=nchw algo=0 algo_math=3 ws=12345";
  const std::string nhwc_line = geometry + " layout=nhwc algo=0 algo_math=3 ws=12345";
  {
    std::ofstream out(files[0], std::ios::app);
    out << old_line << '\n';
  }
  // A new shape is measured and the file rewritten from what parses.
  compile_conv({1, 4, 6, 6}, {3, 4, 3, 3}, false);
  auto lines = lines_of(files[0]);
  EXPECT_EQ(lines_starting(lines, old_line), 0) << files[0];
  EXPECT_EQ(lines_starting(lines, new_line), 1) << files[0];
  // That choice serves the NCHW convolution (nothing new is written), not the NHWC one,
  // which is measured and gets a line of its own.
  compile_conv({1, 3, 9, 7}, {2, 3, 3, 3}, false);
  compile_conv({1, 3, 9, 7}, {2, 3, 3, 3}, true);
  lines = lines_of(files[0]);
  EXPECT_EQ(lines_starting(lines, new_line), 1) << files[0];
  EXPECT_EQ(lines_starting(lines, geometry + " layout=nhwc algo="), 1) << files[0];
  EXPECT_EQ(lines_starting(lines, nhwc_line), 0) << files[0];
}

// ------------------------------------------------------------------------------------------
// batch_norm: x [N, H, W, C]

namespace {

// Not N * H * W = 2: there xhat is +-1 whatever x is, and dx is all rounding.
const std::vector<Shape> kBnShapes = {{4, 5, 5, 3}, {6, 1, 1, 3}, {16, 7, 7, 8}, {8, 4, 4, 64}, {4, 3, 5, 33}};

Var build_bn(GpuCase& c, const Shape& s, Init rm, Init rv) {
  return batch_norm_nhwc(c, c.param("x", s, -2, 2), rm, rv);
}

// 16-bit x and y, f32 gamma, beta and statistics; y compared in f32.
Var build_bn_low(GpuCase& c, const Shape& s, DType t, Init rm, Init rv) {
  Var y = batch_norm_nhwc(c, cast(c.param("x", s, -2, 2), t), rm, rv);
  EXPECT_EQ(y.dtype(), t);
  return cast(y, DType::f32);
}

}  // namespace

TEST(GpuNhwcBatchNorm, TrainingMatchesTheCpuIncludingRunningStats) {
  // runs = 2: the running statistics are compared after two updates.
  for (const Shape& s : kBnShapes) {
    SCOPED_TRACE(shape_str(s));
    compare_nhwc([&](GpuCase& c) { return build_bn(c, s, Init::zeros(), Init::ones()); }, f32().with_runs(2));
    compare_nhwc([&](GpuCase& c) { return build_bn(c, s, Init::uniform(-0.5, 0.5), Init::uniform(0.5, 1.5)); },
                     f32().with_runs(2));
  }
}

TEST(GpuNhwcBatchNorm, EvaluationMatchesTheCpu) {
  // The running statistics normalize; the gradient is batch_norm.cu's channels-last kernel.
  for (const Shape& s : {Shape{4, 5, 5, 3}, Shape{1, 2, 2, 3}, Shape{8, 4, 4, 64}}) {
    SCOPED_TRACE(shape_str(s));
    compare_nhwc([&](GpuCase& c) { return build_bn(c, s, Init::uniform(-0.5, 0.5), Init::uniform(0.5, 1.5)); },
                     f32().in_mode(Mode::eval).with_runs(2));
  }
}

TEST(GpuNhwcBatchNorm, SixteenBitTrainingAndEvaluationMatchTheCpu) {
  for (const Low& low : kLows)
    for (const Shape& s : {Shape{4, 5, 5, 3}, Shape{16, 7, 7, 8}, Shape{8, 4, 4, 64}}) {
      SCOPED_TRACE(std::string(low.name) + " " + shape_str(s));
      auto build = [&](GpuCase& c) {
        return build_bn_low(c, s, low.dtype, Init::uniform(-0.5, 0.5), Init::uniform(0.5, 1.5));
      };
      compare_nhwc(build, low.options().with_runs(2));
      compare_nhwc(build, low.options().in_mode(Mode::eval).with_runs(2));
    }
}

TEST(GpuNhwcBatchNorm, WithReluMatchesTheCpuAtEveryPrecision) {
  for (const Shape& s : {Shape{4, 5, 5, 3}, Shape{8, 4, 4, 64}}) {
    SCOPED_TRACE(shape_str(s));
    auto f32_build = [&](GpuCase& c) { return relu(build_bn(c, s, Init::uniform(-0.5, 0.5), Init::uniform(0.5, 1.5))); };
    compare_nhwc(f32_build, f32().with_runs(2));
    compare_nhwc(f32_build, f32().in_mode(Mode::eval).with_runs(2));
    for (const Low& low : kLows) {
      SCOPED_TRACE(low.name);
      auto build = [&](GpuCase& c) {
        return relu(build_bn_low(c, s, low.dtype, Init::uniform(-0.5, 0.5), Init::uniform(0.5, 1.5)));
      };
      compare_nhwc(build, low.options().with_runs(2));
    }
  }
}

TEST(GpuNhwcBatchNorm, WithResidualAndReluMatchesTheCpuAtEveryPrecision) {
  // relu(bn(x) + z) with z made before the batch norm: one fused step each way (cuDNN's
  // CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION where it takes the shape), the gradient reaching
  // z (the backward's dz) and x through relu's mask.
  for (const Shape& s : {Shape{4, 5, 5, 3}, Shape{8, 4, 4, 64}, Shape{16, 7, 7, 8}}) {
    SCOPED_TRACE(shape_str(s));
    auto f32_build = [&](GpuCase& c) {
      Var z = c.param("z", s, -1, 1);
      return relu(add(build_bn(c, s, Init::uniform(-0.5, 0.5), Init::uniform(0.5, 1.5)), z));
    };
    compare_nhwc(f32_build, f32().with_runs(2));
    compare_nhwc(f32_build, f32().in_mode(Mode::eval).with_runs(2));
    for (const Low& low : kLows) {
      SCOPED_TRACE(low.name);
      auto build = [&](GpuCase& c) {
        Var z = cast(c.param("z", s, -1, 1), low.dtype);
        Var y = batch_norm_nhwc(c, cast(c.param("x", s, -2, 2), low.dtype), Init::uniform(-0.5, 0.5),
                                Init::uniform(0.5, 1.5));
        return cast(relu(add(z, y)), DType::f32);
      };
      compare_nhwc(build, low.options().with_runs(2));
    }
  }
}

TEST(GpuNhwcBatchNorm, OnDataWithoutAnInputGradient) {
  // x is data: nothing reads batch_norm_grad's dx, which must not land on live memory.
  compare_nhwc(
      [](GpuCase& c) {
        return relu(batch_norm_nhwc(c, c.data("x", {4, 5, 5, 3}, -2, 2), Init::zeros(), Init::ones()));
      },
      f32().with_runs(2));
}

TEST(GpuNhwcBatchNorm, ReportsTheCudnnPathItTook) {
  // Which calls the channels-last batch norm runs (the *Ex ones, or the classic ones where
  // cuDNN wants a reserve space or rejects them) is the executable's choice to report;
  // printed so that the run's log says what this cuDNN did.
  GpuCase c(3);
  Var y = build_bn(c, {8, 4, 4, 64}, Init::zeros(), Init::ones());
  Var loss = sum(mul(y, c.data("r", y.shape())));
  Model m(c.g, {.seed = 1, .device = Device::cuda});
  Program p = m.compile({.loss = loss.id(), .gradients = true});
  int forward = 0, backward = 0;
  for (auto& [step, what] : p.executable().stats().choices) {
    if (what.rfind("batch_norm nhwc: ", 0) == 0) ++forward;
    if (what.rfind("batch_norm_grad nhwc: ", 0) == 0) ++backward;
    if (what.find("nhwc: ") != std::string::npos) std::cout << "[ cuDNN    ] step " << step << ": " << what << "\n";
  }
  EXPECT_EQ(forward, 1);
  EXPECT_EQ(backward, 1);
  for (auto& [name, bytes] : c.feeds) p.set_input(name, bytes);
  p.run();
  p.check();
}

TEST(GpuNhwcBatchNorm, TakesCudnnsFusedReluAndResidualCalls) {
  // At [8, 4, 4, 64] cuDNN 9 runs batch norm + relu and batch norm + add + relu one
  // kernel each way (the residual's backward with the reserve space its forward left):
  // the fused steps must take those calls, not the plain batch norm and kernels of their
  // own.
  for (bool residual : {false, true}) {
    SCOPED_TRACE(residual ? "residual" : "relu");
    GpuCase c(3);
    const Shape s{8, 4, 4, 64};
    Var n = build_bn(c, s, Init::zeros(), Init::ones());
    Var y = relu(residual ? add(n, c.param("z", s, -1, 1)) : n);
    Var loss = sum(mul(y, c.data("r", y.shape())));
    Model m(c.g, {.seed = 1, .device = Device::cuda});
    Program p = m.compile({.loss = loss.id(), .gradients = true});
    std::string forward, backward;
    for (auto& [step, what] : p.executable().stats().choices) {
      if (what.rfind("batch_norm nhwc: ", 0) == 0) forward = what;
      if (what.rfind("batch_norm_grad nhwc: ", 0) == 0) backward = what;
      if (what.find("nhwc: ") != std::string::npos) std::cout << "[ cuDNN    ] step " << step << ": " << what << "\n";
    }
    EXPECT_NE(forward.find(residual ? "Ex (CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)" : "Ex (CUDNN_BATCHNORM_OPS_BN_ACTIVATION)"),
              std::string::npos)
        << forward;
    EXPECT_NE(backward.find(residual ? "Ex (CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)" : "Ex (CUDNN_BATCHNORM_OPS_BN_ACTIVATION)"),
              std::string::npos)
        << backward;
    if (residual) {
      EXPECT_NE(backward.find("reserve "), std::string::npos) << backward;
    }
    for (auto& [name, bytes] : c.feeds) p.set_input(name, bytes);
    p.run();
    p.check();
  }
}

// ------------------------------------------------------------------------------------------
// Pooling: x [N, H, W, C]

namespace {

std::vector<PoolCase> pool_cases() {  // NCHW geometry
  return {
      {{2, 3, 8, 8}, {2, 2}, {}, {0, 0}},            // the usual 2x2, stride = kernel
      {{3, 2, 7, 7}, {3, 3}, {2, 2}, {1, 1}},        // overlapping windows with padding
      {{2, 1, 5, 5}, {2, 2}, {1, 1}, {0, 0}},        // overlapping, no padding
      {{1, 2, 7, 6}, {3, 2}, {1, 2}, {1, 1}},        // asymmetric, padding = kernel / 2
      {{3, 2, 7, 7}, {7, 7}, {}, {0, 0}},            // one window over the whole 7x7 plane
      {{2, 2, 9, 9}, {5, 3}, {3, 2}, {2, 1}},        // windows cut by the padding at both ends
      {{2, 40, 6, 6}, {3, 3}, {2, 2}, {1, 1}},       // more channels than a warp
  };
}

}  // namespace

TEST(GpuNhwcPool, MaxPoolMatchesTheCpu) {
  for (const PoolCase& k : pool_cases()) {
    SCOPED_TRACE(k.str());
    auto build = [&](GpuCase& c) {
      return max_pool_nhwc(c.param("x", nhwc_order(k.x)), k.kernel, k.stride, k.padding);
    };
    compare_nhwc(build, f32());
    for (const Low& low : kLows) {
      SCOPED_TRACE(low.name);
      compare_nhwc(build, low.options());
    }
  }
}

TEST(GpuNhwcPool, MaxPoolGradientGoesToTheFirstOfTiedMaxima) {
  // Every column of x repeats down the rows, so each 2x2 window holds its maximum twice
  // (the 3x3 windows three times); the CPU routes dy to the first in row-major order.
  compare_nhwc(
      [](GpuCase& c) {
        return max_pool_nhwc(broadcast_to(c.param("x", {2, 1, 6, 3}), {2, 6, 6, 3}), {2, 2}, {}, {0, 0});
      },
      f32());
  compare_nhwc(
      [](GpuCase& c) {
        return max_pool_nhwc(broadcast_to(c.param("x", {1, 1, 7, 2}), {1, 7, 7, 2}), {3, 3}, {2, 2}, {1, 1});
      },
      f32());
}

TEST(GpuNhwcPool, MaxPoolGradientGoesToTheFirstNaNOfAWindow) {
  // A NaN wins its window (it propagates, as in PyTorch) and the first of two NaNs wins;
  // dy reaches it and nothing else there. Overlapping 3x3 windows with padding, in both
  // layouts; the gradients must be the CPU's bit for bit (at most four shares of dy,
  // added in window order on both).
  for (bool nhwc : {false, true}) {
    SCOPED_TRACE(nhwc ? "nhwc" : "nchw");
    Graph g;
    const Shape s = nhwc ? Shape{2, 6, 6, 3} : Shape{2, 3, 6, 6};
    Var x = g.param("x", s, Init::uniform(-1, 1));
    Var y = nhwc ? max_pool_nhwc(x, {3, 3}, {2, 2}, {1, 1}) : max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
    Var r = g.input("r", y.shape());
    Var loss = sum(mul(y, r));
    std::vector<float> xv = seam::testing::random_floats(static_cast<size_t>(numel(s)), 7);
    for (size_t i : {5u, 6u, 40u, 41u, 150u}) xv[i] = std::numeric_limits<float>::quiet_NaN();
    const auto rv = seam::testing::random_floats(static_cast<size_t>(numel(y.shape())), 8);
    std::vector<float> dx[2];
    for (int d = 0; d < 2; ++d) {
      Model m(g, {.seed = 1, .device = d ? Device::cuda : Device::cpu, .precision = Precision::f32,
                  .layout = LayoutPolicy::nchw});
      m.write_param("x", seam::testing::bytes_of(xv));
      Program p = m.compile({.loss = loss.id(), .gradients = true});
      p.set_input("r", seam::testing::bytes_of(rv));
      p.run();
      dx[d] = p.grad_as<float>("x");
    }
    ASSERT_EQ(dx[0].size(), dx[1].size());
    int at_nan = 0;
    for (size_t i = 0; i < dx[0].size(); ++i) {
      EXPECT_EQ(dx[1][i], dx[0][i]) << "dx[" << i << "]";
      at_nan += std::isnan(xv[i]) && dx[0][i] != 0.f;
    }
    EXPECT_GT(at_nan, 0);  // some NaN took its windows' dy
  }
}

TEST(GpuNhwcPool, AvgPoolMatchesTheCpuWithAndWithoutPaddingInTheCount) {
  for (bool include : {true, false})
    for (const PoolCase& k : pool_cases()) {
      SCOPED_TRACE(k.str() + (include ? " count_include_pad" : " count_exclude_pad"));
      auto build = [&](GpuCase& c) {
        return avg_pool_nhwc(c.param("x", nhwc_order(k.x)), k.kernel, k.stride, k.padding, include);
      };
      compare_nhwc(build, f32());
      for (const Low& low : kLows) {
        SCOPED_TRACE(low.name);
        compare_nhwc(build, low.options());
      }
    }
}

TEST(GpuNhwcPool, GlobalAvgPoolMatchesTheCpu) {
  // A single value; channels below, at and above a warp's 32, many positions per image.
  for (const Shape& s : {Shape{3, 7, 7, 4}, Shape{2, 40, 40, 3}, Shape{1, 1, 1, 1}, Shape{5, 3, 2, 70},
                         Shape{4, 5, 5, 100}, Shape{2, 2, 2, 512}, Shape{3, 4, 4, 32}}) {
    SCOPED_TRACE(shape_str(s));
    auto build = [&](GpuCase& c) {
      Var y = global_avg_pool_nhwc(c.param("x", s));
      EXPECT_EQ(y.shape(), (Shape{s[0], s[3]}));
      return y;
    };
    compare_nhwc(build, f32());
    for (const Low& low : kLows) {
      SCOPED_TRACE(low.name);
      compare_nhwc(build, low.options());
    }
  }
}

TEST(GpuNhwcPool, GradientsOverWideChannelsTakeSixteenBytesAThread) {
  // A thread takes 16 bytes of channels where C allows: 4 at f32 and 8 at 16 bits for
  // C = 8 and 16; C = 12 takes 4 at f32 and 1 at 16 bits; C = 6 takes 1. Ties included:
  // every column repeats down the rows, and the first maximum of each lane's window wins.
  for (int64_t ch : {8, 12, 6, 16}) {
    SCOPED_TRACE("C = " + std::to_string(ch));
    using Build = std::function<Var(GpuCase&)>;
    Build max_build = [&](GpuCase& c) { return max_pool_nhwc(c.param("x", {2, 9, 9, ch}), {3, 3}, {2, 2}, {1, 1}); };
    Build tie_build = [&](GpuCase& c) {
      return max_pool_nhwc(broadcast_to(c.param("x", {2, 1, 7, ch}), {2, 7, 7, ch}), {3, 3}, {2, 2}, {1, 1});
    };
    Build avg_build = [&](GpuCase& c) {
      return avg_pool_nhwc(c.param("x", {2, 9, 9, ch}), {3, 3}, {2, 2}, {1, 1}, ch % 8 == 0);
    };
    for (const Build& build : {max_build, tie_build, avg_build}) {
      compare_nhwc(build, f32());
      for (const Low& low : kLows) {
        SCOPED_TRACE(low.name);
        compare_nhwc(build, low.options());
      }
    }
  }
}

TEST(GpuNhwcPool, SixteenBitOperandsWithoutThePass) {
  for (const Low& low : kLows) {
    SCOPED_TRACE(low.name);
    compare_nhwc(
        [&](GpuCase& c) {
          Var x = cast(c.param("x", {2, 9, 9, 3}), low.dtype);
          Var m = max_pool_nhwc(x, {3, 3}, {2, 2}, {1, 1});
          Var a = avg_pool_nhwc(m, {2, 2}, {1, 1}, {1, 1}, false);
          return cast(global_avg_pool_nhwc(a), DType::f32);
        },
        low.direct());
  }
}

// ------------------------------------------------------------------------------------------
// A channels-last network as a whole: conv, batch norm, relu, max pool, conv, global pool

TEST(GpuNhwcNetwork, ConvBatchNormReluPoolMatchesTheCpu) {
  auto build = [](GpuCase& c) {
    Var h = conv2d_nhwc(c.param("x", {4, 8, 8, 3}), c.param("w1", {8, 3, 3, 3}), std::nullopt, {.padding = {1, 1}});
    h = max_pool_nhwc(relu(batch_norm_nhwc(c, h, Init::zeros(), Init::ones())), {2, 2}, {}, {0, 0});  // [4, 4, 4, 8]
    h = conv2d_nhwc(h, c.param("w2", {16, 3, 3, 8}), c.param("b2", {16}), {.stride = {2, 2}, .padding = {1, 1}});
    return global_avg_pool_nhwc(relu(h));  // [4, 16]
  };
  compare_nhwc(build, tf32_nhwc().with_runs(2));
  compare_nhwc(build, f32().in_mode(Mode::eval));
}
