// The losses and layer_norm on the GPU with 16-bit storage (bf16, f16) against the CPU's
// emulation at the same policy: cross_entropy (fused with its gradient and apart), mse,
// layer_norm and its gradient, on shapes that take each kernel path (warp and block rows,
// 16-byte packs and the scalar fallback of widths that are not a multiple of 8, column
// sums over several chunks of rows), with gamma and beta in f32 and in the data's dtype.
//
// The precision pass leaves losses and norms reading what they are given, so each graph
// makes its 16-bit operands itself: a cast of an f32 parameter (its gradient comes back
// through the cast, in f32) or a 16-bit input. The outputs are cast to f32 for the
// comparison, which reads them as floats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../test_util.h"
#include "common/half.h"
#include "ce_case.h"
#include "gpu_check.h"

using namespace seam;
using seam::gpu_testing::CeCase;
using seam::gpu_testing::describe;
using seam::gpu_testing::bf16;
using seam::gpu_testing::CompareOptions;
using seam::gpu_testing::compare_with_cpu;
using seam::gpu_testing::f16;
using seam::gpu_testing::GpuCase;

namespace {

// Both 16-bit policies, each with its tolerance.
std::vector<CompareOptions> policies() { return {bf16(), f16()}; }

DType low(const CompareOptions& o) { return *low_dtype(o.precision); }

std::string policy_name(const CompareOptions& o) { return std::string("policy ") + precision_name(o.precision); }

// ---- cross_entropy, mse ----


Var labels_for(GpuCase& c, const CeCase& k) {
  const Shape rows(k.shape.begin(), k.shape.end() - 1);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(k.shape.back()) - 1);
  std::vector<int32_t> labels(static_cast<size_t>(numel(rows)));
  for (auto& l : labels) l = pick(c.rng());
  for (size_t r : k.ignored) labels.at(r) = static_cast<int32_t>(k.ignore_index);
  return c.ints("labels", rows, labels);
}

// Logits a 16-bit copy of a parameter, twice a policy: as the loss itself (the fused
// cross_entropy_with_grad, seed 1) and weighted by a random factor (cross_entropy and
// cross_entropy_grad apart, the latter with an f32 dy).
void compare_cross_entropy(const CeCase& k) {
  SCOPED_TRACE(describe(k));
  for (const CompareOptions& base : policies())
    for (bool fused : {true, false}) {
      SCOPED_TRACE(policy_name(base) + (fused ? ", fused with its gradient" : ", forward and gradient apart"));
      CompareOptions o = base;
      o.output_is_loss = fused;
      compare_with_cpu(
          [&](GpuCase& c) {
            Var z = cast(c.param("logits", k.shape, k.lo, k.hi), low(o));
            return cross_entropy(z, labels_for(c, k), k.ignore_index, k.smoothing);
          },
          o);
    }
}

// The forward alone on 16-bit logits fed as such.
void compare_cross_entropy_of_input(const CeCase& k) {
  SCOPED_TRACE(describe(k) + ", 16-bit input");
  for (const CompareOptions& base : policies()) {
    SCOPED_TRACE(policy_name(base));
    CompareOptions o = base.in_mode(Mode::eval);
    o.gradients = false;
    compare_with_cpu(
        [&](GpuCase& c) {
          Var z = c.data("logits", k.shape, k.lo, k.hi, low(o));
          return cross_entropy(z, labels_for(c, k), k.ignore_index, k.smoothing);
        },
        o);
  }
}

void compare_mse(const Shape& s) {
  SCOPED_TRACE("mse of " + shape_str(s));
  for (const CompareOptions& o : policies()) {
    SCOPED_TRACE(policy_name(o));
    compare_with_cpu([&](GpuCase& c) { return mse(cast(c.param("p", s), low(o)), cast(c.param("t", s), low(o))); },
                     o);
  }
}

// ---- layer_norm ----

// x a 16-bit copy of a parameter; gamma and beta f32 parameters or 16-bit copies (then
// dgamma and dbeta are 16-bit too, rounded once from the double column sums). Unfused: a
// cast feeding a layer norm would join it in one generated kernel (as a residual add
// does), and the layer_norm kernel would not run.
void compare_layer_norm(const Shape& shape, bool low_params) {
  SCOPED_TRACE("layer_norm of " + shape_str(shape) + (low_params ? ", 16-bit gamma and beta" : ", f32 gamma and beta"));
  for (const CompareOptions& base : policies()) {
    SCOPED_TRACE(policy_name(base));
    CompareOptions o = base;
    o.fuse = false;
    compare_with_cpu(
        [&](GpuCase& c) {
          const Shape dim{shape.back()};
          const DType t = low(o);
          Var x = cast(c.param("x", shape, -2, 3), t);
          Var gamma = c.param("gamma", dim, 0.5, 1.5);
          Var beta = c.param("beta", dim, -0.5, 0.5);
          Var y = low_params ? layer_norm(x, cast(gamma, t), cast(beta, t), 1e-5) : layer_norm(x, gamma, beta, 1e-5);
          return cast(y, DType::f32);
        },
        o);
  }
}

// x a 16-bit input fed as such (fused as the plans are by default): the gradients of the
// f32 gamma and beta come from 16-bit dy and x.
void compare_layer_norm_of_input(const Shape& shape) {
  SCOPED_TRACE("layer_norm of " + shape_str(shape) + ", 16-bit input, f32 gamma and beta");
  for (const CompareOptions& o : policies()) {
    SCOPED_TRACE(policy_name(o));
    compare_with_cpu(
        [&](GpuCase& c) {
          const Shape dim{shape.back()};
          Var x = c.data("x", shape, -2, 3, low(o));
          Var y = layer_norm(x, c.param("gamma", dim, 0.5, 1.5), c.param("beta", dim, -0.5, 0.5), 1e-5);
          return cast(y, DType::f32);
        },
        o);
  }
}

// A residual stream read by a layer norm and by the add after it, as in pre-norm blocks:
// the add of its two gradients folds into the first layer norm's gradient (input dr),
// whose kernels add it before the one rounding. t: the data's dtype (x a copy of an f32
// parameter in it).
Var residual_norms(GpuCase& c, const Shape& shape, DType t) {
  const Shape dim{shape.back()};
  Var h = cast(c.param("x", shape, -2, 3), t);
  h = add(h, layer_norm(h, c.param("g1", dim, 0.5, 1.5), c.param("b1", dim, -0.5, 0.5), 1e-5));
  return cast(layer_norm(h, c.param("g2", dim, 0.5, 1.5), c.param("b2", dim, -0.5, 0.5), 1e-5), DType::f32);
}

// A residual projection read by the next layer norm, as in pre-norm blocks: the
// projection's bias gradient is the column sums of that layer norm gradient's dx
// (bias_grads_into_norm_grads), added in its kernel or, on the wider rows' paths, by a sum
// step over dx.
Var projected_norm(GpuCase& c, const Shape& shape, DType t) {
  const Shape dim{shape.back()};
  Var h = cast(c.param("x", shape, -2, 3), t);
  Var a = layer_norm(h, c.param("g1", dim, 0.5, 1.5), c.param("b1", dim, -0.5, 0.5), 1e-5);
  Var w = c.param("w", {dim[0], dim[0]}, -0.05, 0.05), b = c.param("b", dim, -0.5, 0.5);
  h = add(h, c.g.add1(Op::linear, {a.id(), cast(w, t).id(), cast(b, t).id()}));
  return cast(layer_norm(h, c.param("g2", dim, 0.5, 1.5), c.param("b2", dim, -0.5, 0.5), 1e-5), DType::f32);
}

// Steps of `op` whose operand (input or output `index`) has dtype t.
int steps_with(const Plan& p, Op op, bool input, size_t index, DType t) {
  int n = 0;
  for (const PlanStep& s : p.steps) {
    const auto& list = input ? s.in : s.out;
    n += s.op == op && index < list.size() && list[index].type.dtype == t;
  }
  return n;
}

}  // namespace

// The comparisons below mean something only if the plans they compare run the loss and
// norm kernels on 16-bit operands: the casts the graphs make are kept, and the loss and
// norm steps read (and their gradients write) the 16-bit dtype.
TEST(GpuPrecisionLossNorm, TheStepsTakeSixteenBitOperands) {
  for (const CompareOptions& o : policies()) {
    SCOPED_TRACE(policy_name(o));
    const DType t = low(o);
    {
      Graph g;
      Var z = cast(g.param("logits", {8, 16}, Init::uniform(-1, 1)), t);
      Var loss = cross_entropy(z, g.input("labels", {8}, DType::i32));
      Model m(g, {.device = Device::cuda, .precision = o.precision});
      Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {loss.id()}});
      EXPECT_EQ(steps_with(p.plan(), Op::cross_entropy_with_grad, true, 0, t), 1) << p.plan().str();
      EXPECT_EQ(steps_with(p.plan(), Op::cross_entropy_with_grad, false, 0, DType::f32), 1) << p.plan().str();
      EXPECT_EQ(steps_with(p.plan(), Op::cross_entropy_with_grad, false, 1, t), 1) << p.plan().str();
    }
    {
      Graph g;
      Var z = cast(g.param("logits", {8, 16}, Init::uniform(-1, 1)), t);
      Var loss = mul(cross_entropy(z, g.input("labels", {8}, DType::i32)), g.input("w", {}));
      Model m(g, {.device = Device::cuda, .precision = o.precision});
      Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {loss.id()}});
      EXPECT_EQ(steps_with(p.plan(), Op::cross_entropy, true, 0, t), 1) << p.plan().str();
      EXPECT_EQ(steps_with(p.plan(), Op::cross_entropy_grad, true, 1, t), 1) << p.plan().str();
      EXPECT_EQ(steps_with(p.plan(), Op::cross_entropy_grad, false, 0, t), 1) << p.plan().str();
    }
    {
      Graph g;
      Var a = cast(g.param("p", {4, 8}, Init::uniform(-1, 1)), t);
      Var loss = mse(a, cast(g.input("t", {4, 8}), t));
      Model m(g, {.device = Device::cuda, .precision = o.precision});
      Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {loss.id()}});
      EXPECT_EQ(steps_with(p.plan(), Op::mse, true, 0, t), 1) << p.plan().str();
      EXPECT_EQ(steps_with(p.plan(), Op::mse_grad, false, 0, t), 1) << p.plan().str();
    }
    for (bool low_params : {false, true}) {
      SCOPED_TRACE(low_params ? "16-bit gamma and beta" : "f32 gamma and beta");
      Graph g;
      Var x = cast(g.param("x", {4, 64}, Init::uniform(-1, 1)), t);
      Var gamma = g.param("gamma", {64}, Init::uniform(0.5, 1.5));
      Var beta = g.param("beta", {64}, Init::uniform(-0.5, 0.5));
      Var y = low_params ? layer_norm(x, cast(gamma, t), cast(beta, t), 1e-5) : layer_norm(x, gamma, beta, 1e-5);
      Var loss = sum(cast(y, DType::f32));
      Model m(g, {.device = Device::cuda, .precision = o.precision});
      Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {loss.id()}, .fuse = false});
      const DType pt = low_params ? t : DType::f32;
      EXPECT_EQ(steps_with(p.plan(), Op::layer_norm, true, 0, t), 1) << p.plan().str();
      EXPECT_EQ(steps_with(p.plan(), Op::layer_norm, true, 1, pt), 1) << p.plan().str();
      EXPECT_EQ(steps_with(p.plan(), Op::layer_norm_grad, true, 0, t), 1) << p.plan().str();
      EXPECT_EQ(steps_with(p.plan(), Op::layer_norm_grad, false, 0, t), 1) << p.plan().str();
      EXPECT_EQ(steps_with(p.plan(), Op::layer_norm_grad, false, 1, pt), 1) << p.plan().str();
    }
  }
}

// Ten classes: scalar loads (not a multiple of 8); 1000: 16-byte packs on the warp path;
// 3000: packs on the block path; 2501: the block path's scalar fallback.
TEST(GpuPrecisionLoss, CrossEntropyOnEachRowPath) {
  compare_cross_entropy({.shape = {64, 10}});
  compare_cross_entropy({.shape = {37, 1000}});
  compare_cross_entropy({.shape = {2, 5, 37}});
  compare_cross_entropy({.shape = {16, 3000}});
  compare_cross_entropy({.shape = {9, 2501}});
  compare_cross_entropy({.shape = {1, 1}});
  // Rows staged in shared memory (a GPT-2 vocabulary: two 16-bit rows a block); with
  // more rows than blocks each block's two buffers take turns, past ignored rows too.
  compare_cross_entropy({.shape = {7, 20000}, .smoothing = 0.1});
  compare_cross_entropy({.shape = {6, 50257}, .smoothing = 0.1, .ignored = {2}, .padding = 47});
  compare_cross_entropy({.shape = {300, 50304}, .smoothing = 0.1, .ignored = {3, 200, 201}});
  // 60000 classes: one 16-bit row fits the shared memory, two do not (one buffer).
  compare_cross_entropy({.shape = {5, 60000}, .smoothing = 0.1, .ignored = {1}});
}

TEST(GpuPrecisionLoss, CrossEntropyWithSmoothingAndIgnoredRows) {
  compare_cross_entropy({.shape = {64, 10}, .smoothing = 0.1, .ignored = {0, 3, 63}});
  compare_cross_entropy({.shape = {33, 1024}, .smoothing = 0.1, .ignored = {1, 32}});
  compare_cross_entropy({.shape = {8, 4096}, .smoothing = 0.1, .ignored = {5}});
  compare_cross_entropy({.shape = {6, 16}, .ignored = {0, 1, 2, 3, 4, 5}});  // every row ignored: 0
}

TEST(GpuPrecisionLoss, CrossEntropyLargeLogits) {
  compare_cross_entropy({.shape = {64, 10}, .lo = -50, .hi = 50});
  compare_cross_entropy({.shape = {16, 1000}, .smoothing = 0.1, .lo = -50, .hi = 50});
  compare_cross_entropy({.shape = {4, 3000}, .lo = -50, .hi = 50});
}

// Past 2048 rows the fused op counts the rows in a kernel of its own first.
TEST(GpuPrecisionLoss, CrossEntropyManyRows) {
  compare_cross_entropy({.shape = {5000, 24}, .smoothing = 0.1, .ignored = {0, 4999}});
  compare_cross_entropy({.shape = {301, 1100}, .ignored = {3}});
}

TEST(GpuPrecisionLoss, CrossEntropyOfSixteenBitInputs) {
  compare_cross_entropy_of_input({.shape = {64, 10}});
  compare_cross_entropy_of_input({.shape = {37, 1000}, .smoothing = 0.1, .ignored = {2}});
  compare_cross_entropy_of_input({.shape = {9, 3000}});
  compare_cross_entropy_of_input({.shape = {5, 2501}, .smoothing = 0.1});
}

TEST(GpuPrecisionLoss, MseMatchesTheCpu) {
  for (const Shape& s : {Shape{1}, Shape{3, 7}, Shape{7, 129}, Shape{1000, 1000}}) compare_mse(s);
}

// Widths up to 1024 take the warp path (37: the scalar column sums; 768 and 1024: 16-byte
// packs), 4096 the block path (8 columns a thread in registers); the row counts are no
// multiple of a block's 8 warps, and 1001 rows make several chunks of column sums.
TEST(GpuPrecisionLayerNorm, ForwardAndBackward) {
  for (bool low_params : {false, true})
    for (int64_t dim : {1024, 768, 4096, 37})
      for (int64_t rows : {1, 37, 1001}) compare_layer_norm({rows, dim}, low_params);
}

// More columns than the block path keeps in registers (in the block's slice of scratch),
// an odd width past the warp path, a batch of sequences.
TEST(GpuPrecisionLayerNorm, OtherBlockPathWidths) {
  for (bool low_params : {false, true}) {
    compare_layer_norm({9, 9000}, low_params);
    compare_layer_norm({5, 1025}, low_params);
    compare_layer_norm({2, 3, 2048}, low_params);
  }
}

TEST(GpuPrecisionLayerNorm, SixteenBitInputs) {
  for (int64_t dim : {1024, 768, 4096, 37}) compare_layer_norm_of_input({37, dim});
}

// Every row path with dr: 16-byte packs (768; 100 at f32), the scalar fallback (37; 100 at
// 16 bits: no multiple of 8) and the block path (2048; fewer rows there, whose column sums
// of the first gamma's gradient, taken through the second layer norm's, cancel past the
// f32 tolerance at a thousand), on each precision; the plans the comparison runs hold the
// fused gradient.
TEST(GpuPrecisionLayerNorm, ResidualGradientSummedIntoTheGradient) {
  std::vector<CompareOptions> all = policies();
  all.push_back(seam::gpu_testing::f32());
  for (const CompareOptions& o : all) {
    SCOPED_TRACE(policy_name(o));
    const DType t = o.precision == Precision::f32 ? DType::f32 : low(o);
    for (int64_t dim : {768, 100, 37, 2048})
      for (int64_t rows : {int64_t{37}, dim == 2048 ? int64_t{129} : int64_t{1001}}) {
        const Shape shape{rows, dim};
        SCOPED_TRACE(shape_str(shape));
        compare_with_cpu([&](GpuCase& c) { return residual_norms(c, shape, t); }, o);
      }
    GpuCase c;
    Var loss = sum(residual_norms(c, {4, 64}, t));
    Model m(c.g, {.device = Device::cuda, .precision = o.precision});
    Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {loss.id()}});
    int summed = 0;
    for (const PlanStep& s : p.plan().steps) summed += s.op == Op::layer_norm_grad && s.in.size() == 6;
    EXPECT_EQ(summed, 1) << p.plan().str();
  }
}

// A model whose residual projection's bias gradient comes from the layer norm gradient
// after it, at each 16-bit policy, on every row path: 16-byte packs in the dx kernel
// (768), single values there (37, 100) and the block path's sum step (2048). (At f32 and
// TF32 the linear's dot products, rounded in another order on the CPU, feed gradient sums
// that cancel to a thousandth of their terms: measured on the H200, elements of w's and
// the gammas' gradients 1e-3 (f32) to 1e-1 (TF32) apart while the bias gradient agreed;
// the kernels' f32 paths are compared directly below.) The same cancellation holds at 16
// bits over 1001 rows: the CPU's own bf16 gradients against its f32 ones, on this model at
// [1001, 100], differ by up to 0.36 in w's (RMS 58; 97 of its 10000 elements, those that
// cancel to about 0.1, past the bf16 element tolerance) and by up to 2% of the RMS in g1's,
// so the element floor is 3% of each tensor's RMS (f16: an eighth of it, 3 bits more).
TEST(GpuPrecisionLayerNorm, BiasGradientFromTheLayerNormGradient) {
  for (CompareOptions o : policies()) {
    o.tol.rms_atol = o.precision == Precision::bf16 ? 3e-2 : 3e-2 / 8;
    SCOPED_TRACE(policy_name(o));
    const DType t = low(o);
    for (int64_t dim : {768, 100, 37, 2048})
      for (int64_t rows : {int64_t{37}, dim == 2048 ? int64_t{129} : int64_t{1001}}) {
        const Shape shape{rows, dim};
        SCOPED_TRACE(shape_str(shape));
        compare_with_cpu([&](GpuCase& c) { return projected_norm(c, shape, t); }, o);
      }
    GpuCase c;
    Var loss = sum(projected_norm(c, {4, 64}, t));
    Model m(c.g, {.device = Device::cuda, .precision = o.precision});
    Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {loss.id()}});
    int sums = 0;
    for (const PlanStep& s : p.plan().steps) sums += s.op == Op::layer_norm_grad && s.out.size() == 4;
    EXPECT_EQ(sums, 1) << p.plan().str();
  }
}

// layer_norm_grad with dx_sums as a step of its own, on f32 and bf16 data, with and
// without dr: dx and its column sums against the CPU's, on every row path. 2048-wide rows
// take 129 rows: at a thousand, a column sum of f32 dx that cancels to a thousandth of
// its terms came out 2e-4 apart (measured on the H200), past the f32 tolerance.
TEST(GpuPrecisionLayerNorm, DxSumsMatchTheCpu) {
  for (DType t : {DType::f32, DType::bf16})
    for (bool with_dr : {false, true})
      for (int64_t dim : {768, 100, 37, 2048})
        for (int64_t rows : {int64_t{37}, dim == 2048 ? int64_t{129} : int64_t{1001}})
          for (int out : {0, 3}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + (with_dr ? " with dr " : " ") + std::to_string(rows) + "x" +
                         std::to_string(dim) + " output " + std::to_string(out));
            CompareOptions o = t == DType::f32 ? seam::gpu_testing::f32() : seam::gpu_testing::bf16();
            o.gradients = false;
            compare_with_cpu(
                [&](GpuCase& c) {
                  const Shape shape{rows, dim}, d{dim};
                  Var x = cast(c.data("x", shape, -2, 3), t), dy = cast(c.data("dy", shape, -1, 1), t);
                  Var gamma = c.data("gamma", d, 0.5, 1.5);
                  auto st = c.g.add(Op::layer_norm, {x.id(), gamma.id(), c.data("beta", d, -0.5, 0.5).id()});
                  std::vector<ValueId> in{dy.id(), x.id(), st[1], st[2], gamma.id()};
                  if (with_dr) in.push_back(cast(c.data("dr", shape, -1, 1), t).id());
                  auto g = c.g.add(Op::layer_norm_grad, in, {{"dx_sums", int64_t{1}}});
                  return cast(c.g.var(g[static_cast<size_t>(out)]), DType::f32);
                },
                o);
          }
}

// layer_norm_grad from the norm's output (from_output: y and beta in place of x and mean),
// on f32, bf16 and f16 data (16-bit data through the kernel's table of 1 / gamma and
// beta / gamma), with dr and dx's sums, gammas of either sign, on every row path:
// the dx kernel's column sums with 16-byte packs (768) and single values (37, 100), the
// column kernel beside it (1024) and the block path (2048). y and rstd are the same data
// on both sides, not a forward's: in bf16 the CPU's and the GPU's forward round y apart
// by an ulp here and there, which gamma's gradient, summed over a thousand rows that
// cancel, shows past bf16's tolerance. Then a zero gamma, reported.
TEST(GpuPrecisionLayerNorm, GradientFromTheOutputMatchesTheCpu) {
  auto norm_grad = [](GpuCase& c, const Shape& shape, DType t, bool zero) {
    const Shape d{shape.back()}, rows{numel(shape) / shape.back()};
    Var y = cast(c.data("y", shape, -2, 3), t), dy = cast(c.data("dy", shape, -1, 1), t);
    Var sign = c.data("sign", d, -1, 1);  // gamma's signs, mixed
    Var gamma = mul(c.data("gamma", d, 0.5, 1.5), div(sign, abs(sign)));
    if (zero) gamma = mul(gamma, c.g.input("mask", d));
    Var beta = c.data("beta", d, -0.5, 0.5), rstd = c.data("rstd", rows, 0.5, 2);
    Var dr = cast(c.data("dr", shape, -1, 1), t);
    const std::vector<ValueId> in{dy.id(), y.id(), beta.id(), rstd.id(), gamma.id(), dr.id()};
    return c.g.add(Op::layer_norm_grad, in, {{"dx_sums", int64_t{1}}, {"from_output", int64_t{1}}});
  };
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (int64_t dim : {768, 100, 37, 1024, 2048})
      for (int out : {0, 1, 2, 3}) {
        const int64_t rows = dim == 2048 ? 129 : 1001;
        SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::to_string(rows) + "x" + std::to_string(dim) + " output " +
                     std::to_string(out));
        CompareOptions o = t == DType::f32    ? seam::gpu_testing::f32()
                           : t == DType::bf16 ? seam::gpu_testing::bf16()
                                              : seam::gpu_testing::f16();
        o.gradients = false;
        compare_with_cpu(
            [&](GpuCase& c) { return cast(c.g.var(norm_grad(c, {rows, dim}, t, false)[out]), DType::f32); }, o);
      }
  for (int64_t dim : {768, 37, 2048}) {
    SCOPED_TRACE("a zero gamma at " + std::to_string(dim));
    GpuCase c;
    const auto g = norm_grad(c, {8, dim}, DType::bf16, true);
    Model m(c.g, {.device = Device::cuda});
    Program p = m.compile({.mode = Mode::eval, .outputs = {g[0]}});
    std::vector<float> mask(static_cast<size_t>(dim), 1.f);
    mask[5] = 0.f;
    for (const auto& [name, bytes] : c.feeds) p.set_input(name, std::span<const std::byte>(bytes));
    p.set_input("mask", std::span<const float>(mask));
    const std::string e = seam::testing::error_of([&] {
      p.run();
      p.read(c.g.value(g[0]).name);
    });
    EXPECT_NE(e.find("gamma[5] is 0"), std::string::npos) << e;
  }
}

// The fused loss counting the rows its argmax gets right (what the training accuracy
// becomes, fuse_losses): the count equals the CPU's exactly, on each row path (warp and
// block rows, 16-byte packs and single values, one launch or the labels counted first),
// with many ties (values 0..3: the first largest is the argmax) and ignored rows.
TEST(GpuPrecisionLoss, TheFusedLossCountsItsArgmaxAsTheCpu) {
  std::vector<CompareOptions> all = policies();
  all.push_back(seam::gpu_testing::f32());
  for (const CompareOptions& o : all) {
    SCOPED_TRACE(policy_name(o));
    const DType t = o.precision == Precision::f32 ? DType::f32 : low(o);
    // 50304 and 60000 classes: staged in two buffers, or one (16-bit 60000, f32 50304),
    // or streamed (f32 60000); 300 rows: more than one a block.
    for (int64_t classes : {10, 1000, 3000, 2501, 20000, 50304, 60000})
      for (int64_t rows : {int64_t{37}, classes > 3000 ? int64_t{300} : int64_t{3000}}) {
        if (rows == 0) continue;
        SCOPED_TRACE(std::to_string(rows) + " rows of " + std::to_string(classes));
        Graph g;
        Var x = g.input("x", {rows, classes});
        Var y = g.input("y", {rows}, DType::i32);
        Var logits = cast(add(x, g.param("shift", {classes}, Init::zeros())), t);
        Var loss = cross_entropy(logits, y);
        Var correct = count_equal(argmax(logits), y);
        std::mt19937_64 rng(static_cast<uint64_t>(rows * classes));
        std::vector<float> xs(static_cast<size_t>(rows * classes));
        for (auto& v : xs) v = static_cast<float>(rng() % 4);
        std::vector<int32_t> ys(static_cast<size_t>(rows));
        for (auto& l : ys) l = static_cast<int32_t>(rng() % 6);
        for (size_t r = 0; r < ys.size(); r += 5) ys[r] = -100;
        std::vector<int32_t> counts;
        std::vector<float> losses;
        for (Device d : {Device::cpu, Device::cuda}) {
          Model m(g, {.device = d, .precision = o.precision});
          Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {correct.id()}});
          int fused = 0;
          for (const PlanStep& s : p.plan().steps) fused += s.op == Op::cross_entropy_with_grad && s.out.size() == 3;
          EXPECT_EQ(fused, 1) << p.plan().str();
          p.set_input("x", std::span<const float>(xs));
          p.set_input("y", std::span<const int32_t>(ys));
          p.run();
          counts.push_back(p.read_as<int32_t>(correct.name())[0]);
          losses.push_back(p.read_as<float>(loss.name())[0]);
        }
        EXPECT_EQ(counts[0], counts[1]);
        EXPECT_GT(counts[0], 0);
        EXPECT_NEAR(losses[0], losses[1], 1e-3 * std::abs(losses[0]));
      }
  }
}

// Rows whose maximum is not finite, on each row path (warp rows of 1000 classes, block
// rows of 3000 read twice, GPT-2's 50304 staged in shared memory): two +inf logits, the
// label at one (the CPU's shifted sum is inf - inf: NaN), one +inf away from the label,
// a row of -inf only (NaN), a NaN among finite values (NaN), -inf among finite values
// (their terms 0) and a finite row. Each gradient value equals the CPU's, NaN where the
// CPU's is, and the loss is NaN on both.
TEST(GpuPrecisionLoss, RowsWithInfiniteOrNanLogitsMatchTheCpu) {
  for (const CompareOptions& o : {seam::gpu_testing::f32(), bf16()}) {
    SCOPED_TRACE(policy_name(o));
    const DType t = o.precision == Precision::f32 ? DType::f32 : low(o);
    const double tol = o.precision == Precision::f32 ? 1e-5 : 1e-2;
    for (int64_t classes : {int64_t{1000}, int64_t{3000}, int64_t{50304}}) {
      SCOPED_TRACE(std::to_string(classes) + " classes");
      const int64_t rows = 7;
      Graph g;
      Var w = g.param("w", {rows, classes}, Init::zeros());
      Var y = g.input("y", {rows}, DType::i32);
      Var loss = cross_entropy(cast(w, t), y);
      std::mt19937_64 rng(static_cast<uint64_t>(classes));
      std::uniform_real_distribution<float> d(-3.f, 3.f);
      std::vector<float> ws(static_cast<size_t>(rows * classes));
      for (auto& v : ws) v = d(rng);
      auto at = [&](int64_t r, int64_t c) -> float& { return ws[static_cast<size_t>(r * classes + c)]; };
      const float inf = std::numeric_limits<float>::infinity();
      at(0, 5) = inf, at(0, classes - 7) = inf;
      at(1, 123) = inf;
      for (int64_t c = 0; c < classes; ++c) at(2, c) = -inf;
      at(3, 999) = std::numeric_limits<float>::quiet_NaN();
      at(4, 0) = -inf, at(4, classes / 2) = -inf;
      const std::vector<int32_t> ys{5, 7, 3, 2, 0, 11, static_cast<int32_t>(classes - 1)};
      std::vector<std::vector<float>> grads;
      std::vector<float> losses;
      for (Device dev : {Device::cpu, Device::cuda}) {
        Model m(g, {.device = dev, .precision = o.precision});
        Program p = m.compile({.loss = loss.id(), .gradients = true});
        m.write_param("w", seam::testing::bytes_of(ws));
        p.set_input("y", std::span<const int32_t>(ys));
        p.run();
        losses.push_back(p.read_as<float>(loss.name())[0]);
        grads.push_back(p.grad_as<float>("w"));
      }
      EXPECT_TRUE(std::isnan(losses[0]) && std::isnan(losses[1])) << losses[0] << " " << losses[1];
      for (int64_t r = 0; r < rows; ++r) {
        float scale = 0.f;
        for (int64_t c = 0; c < classes; ++c) scale = std::max(scale, std::abs(grads[0][r * classes + c]));
        int bad = 0, nans = 0;
        for (int64_t c = 0; c < classes && bad < 3; ++c) {
          const float cpu = grads[0][r * classes + c], gpu = grads[1][r * classes + c];
          nans += std::isnan(cpu);
          const bool same = std::isnan(cpu) ? std::isnan(gpu) : std::abs(gpu - cpu) <= tol * scale + 1e-12f;
          if (!same) ++bad;
          EXPECT_TRUE(same) << "row " << r << ", class " << c << ": the GPU's " << gpu << ", the CPU's " << cpu;
        }
        // Rows 0 to 3 are NaN throughout on the CPU, rows 4 to 6 nowhere.
        EXPECT_EQ(nans, r < 4 ? classes : 0) << "row " << r;
      }
    }
  }
}

