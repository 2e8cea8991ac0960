// The softmax family, the losses and layer_norm on the GPU against the CPU: outputs and
// the gradients of every parameter, on shapes that take each kernel path (warp per row,
// block per row, strided lanes; register and global column accumulators), plus a bad
// label reported by the device and thrown on the host's next read.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ce_case.h"
#include "gpu_check.h"

using namespace seam;
using seam::gpu_testing::CeCase;
using seam::gpu_testing::describe;
using seam::gpu_testing::CompareOptions;
using seam::gpu_testing::compare_with_cpu;
using seam::gpu_testing::f32;
using seam::gpu_testing::GpuCase;
using seam::gpu_testing::Tolerance;

namespace {

// softmax or log_softmax of a parameter of `shape` with values in [lo, hi).
void compare_softmax(const Shape& shape, int64_t axis, bool log, double lo = -1, double hi = 1) {
  SCOPED_TRACE(std::string(log ? "log_softmax" : "softmax") + " of " + shape_str(shape) + " along axis " +
               std::to_string(axis) + ", values in [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
  compare_with_cpu(
      [&](GpuCase& c) {
        Var x = c.param("x", shape, lo, hi);
        return log ? log_softmax(x, axis) : softmax(x, axis);
      },
      f32());
}


// Twice: as the loss itself (the fused cross_entropy_with_grad, seed 1) and weighted by a
// random factor (cross_entropy and cross_entropy_grad apart: the weight's gradient is
// made after the forward).
void compare_cross_entropy(const CeCase& k) {
  SCOPED_TRACE(describe(k));
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused with its gradient" : "forward and gradient apart");
    CompareOptions o = f32();
    o.output_is_loss = fused;
    compare_with_cpu(
        [&](GpuCase& c) {
          Shape padded = k.shape;
          padded.back() += k.padding;
          Var z = c.param("logits", padded, k.lo, k.hi);
          if (k.padding) z = slice(z, -1, 0, k.shape.back());  // the loss reads the padded rows in place
          const Shape rows(k.shape.begin(), k.shape.end() - 1);
          const auto classes = static_cast<int32_t>(k.shape.back());
          std::uniform_int_distribution<int32_t> pick(0, classes - 1);
          std::vector<int32_t> labels(static_cast<size_t>(numel(rows)));
          for (auto& l : labels) l = pick(c.rng());
          for (size_t r : k.ignored) labels.at(r) = static_cast<int32_t>(k.ignore_index);
          Var l = c.ints("labels", rows, labels);
          return cross_entropy(z, l, k.ignore_index, k.smoothing);
        },
        o);
  }
}

std::vector<size_t> every_row(size_t n) {
  std::vector<size_t> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = i;
  return r;
}

// gamma's and beta's gradients are sums over the rows: an element that cancels (0.08 of
// terms near 1 over 6000 rows) carries the terms' rounding, about 1e-5 in f32 on either
// side, so the element floor follows the tensor's RMS (about sqrt(rows)).
CompareOptions layer_norm_tolerance() {
  CompareOptions o = f32();
  o.tol.rms_atol = 3e-7;
  return o;
}

void compare_layer_norm(const Shape& shape) {
  SCOPED_TRACE("layer_norm of " + shape_str(shape));
  compare_with_cpu(
      [&](GpuCase& c) {
        const Shape dim{shape.back()};
        Var x = c.param("x", shape, -2, 3);
        Var gamma = c.param("gamma", dim, 0.5, 1.5);
        Var beta = c.param("beta", dim, -0.5, 0.5);
        return layer_norm(x, gamma, beta, 1e-5);
      },
      layer_norm_tolerance());
}

}  // namespace

// ---- softmax, log_softmax ----

// Axes 0 and 1 take the strided path (inner > 1), axis -1 the warp path.
TEST(GpuSoftmax, EveryAxisOf3x7x5) {
  for (bool log : {false, true})
    for (int64_t axis : {0, 1, -1}) compare_softmax({3, 7, 5}, axis, log);
}

// Rows up to 1024 take the warp path (1, 3, 7: one value per lane; 129: eight; 768:
// twenty-four; 1000: thirty-two), longer ones the block path.
TEST(GpuSoftmax, RowLengthsOfTheWarpAndBlockPaths) {
  for (bool log : {false, true})
    for (int64_t len : {1, 3, 7, 32, 33, 129, 768, 1000, 1024, 1025, 5000}) compare_softmax({37, len}, -1, log);
}

TEST(GpuSoftmax, LargeLogitsStayFinite) {
  for (bool log : {false, true}) {
    compare_softmax({9, 10}, -1, log, -50, 50);
    compare_softmax({5, 1000}, -1, log, -50, 50);
    compare_softmax({4, 3000}, -1, log, -50, 50);
    compare_softmax({300, 4}, 0, log, -50, 50);
  }
}

// More rows than the grids have warps or blocks: every kernel loops over rows.
TEST(GpuSoftmax, MoreRowsThanTheGridCovers) {
  for (bool log : {false, true}) {
    compare_softmax({20000, 8}, -1, log);
    compare_softmax({600, 1500}, -1, log);
    compare_softmax({2, 2000, 3}, 1, log);  // long strided lanes
  }
}

// ---- losses ----

TEST(GpuLoss, CrossEntropyOnRowsOfTenAndAThousandClasses) {
  compare_cross_entropy({.shape = {64, 10}});
  compare_cross_entropy({.shape = {32, 1000}});
  compare_cross_entropy({.shape = {1, 1}});
  compare_cross_entropy({.shape = {16, 3000}});  // one block per row
}

// Padded classes (absorb_class_slices): rows of 1000 and 50304 whose last 3 and 47
// columns are padding, the first read in 16-byte packs up to the pack that holds the
// boundary, one of 13 columns at a time.
TEST(GpuLoss, CrossEntropyOnPaddedRows) {
  compare_cross_entropy({.shape = {32, 997}, .padding = 3});
  compare_cross_entropy({.shape = {8, 50257}, .smoothing = 0.1, .ignored = {2}, .padding = 47});
  compare_cross_entropy({.shape = {7, 20000}, .ignored = {3}});  // two f32 rows staged a block
  compare_cross_entropy({.shape = {5, 50304}, .ignored = {2}});  // one f32 row staged (one buffer)
  compare_cross_entropy({.shape = {3, 60000}, .ignored = {0}});  // a row past the shared memory: streamed
  compare_cross_entropy({.shape = {2, 5, 10}, .padding = 3});
}

TEST(GpuLoss, CrossEntropyOnBatchTimeClasses) {
  compare_cross_entropy({.shape = {2, 5, 37}});
  compare_cross_entropy({.shape = {3, 4, 1000}, .smoothing = 0.1, .ignored = {0, 7}});
}

TEST(GpuLoss, CrossEntropyWithLabelSmoothing) {
  compare_cross_entropy({.shape = {64, 10}, .smoothing = 0.1});
  compare_cross_entropy({.shape = {32, 1000}, .smoothing = 0.1});
  compare_cross_entropy({.shape = {8, 2500}, .smoothing = 0.1});
  compare_cross_entropy({.shape = {16, 10}, .smoothing = 1.0});
}

TEST(GpuLoss, CrossEntropyIgnoresRows) {
  compare_cross_entropy({.shape = {64, 10}, .ignored = {0, 3, 4, 63}});
  compare_cross_entropy({.shape = {32, 1000}, .smoothing = 0.1, .ignored = {1, 2, 31}});
  compare_cross_entropy({.shape = {8, 2500}, .ignored = {5}});
  // A class index as ignore_index: rows labelled 3 do not count, -100 would be out of range.
  compare_cross_entropy({.shape = {64, 10}, .smoothing = 0.1, .ignored = {6, 9}, .ignore_index = 3});
}

TEST(GpuLoss, CrossEntropyWithEveryRowIgnoredIsZero) {
  compare_cross_entropy({.shape = {6, 10}, .ignored = every_row(6)});
  compare_cross_entropy({.shape = {4, 2000}, .smoothing = 0.1, .ignored = every_row(4)});
}

TEST(GpuLoss, CrossEntropyLargeLogits) {
  compare_cross_entropy({.shape = {64, 10}, .lo = -50, .hi = 50});
  compare_cross_entropy({.shape = {16, 1000}, .smoothing = 0.1, .lo = -50, .hi = 50});
  compare_cross_entropy({.shape = {4, 3000}, .lo = -50, .hi = 50});
}

TEST(GpuLoss, CrossEntropyManyRows) {
  compare_cross_entropy({.shape = {20000, 10}, .smoothing = 0.1, .ignored = {0, 19999}});
  compare_cross_entropy({.shape = {700, 1100}, .ignored = {3}});
  // Past 2048 rows the fused op counts the rows in a kernel of its own first (20000 too);
  // fewer, every block counts them (the cases above).
  compare_cross_entropy({.shape = {70000, 10}, .smoothing = 0.1, .ignored = {5, 69999}});
}

TEST(GpuLoss, MseMatchesTheCpu) {
  for (Shape s : {Shape{1}, Shape{3, 7}, Shape{7, 129}, Shape{1000, 1000}}) {
    SCOPED_TRACE("mse of " + shape_str(s));
    compare_with_cpu([&](GpuCase& c) { return mse(c.param("p", s), c.param("t", s)); }, f32());
  }
}

// The device reports the label; the next read on the host throws naming it, and clears
// the report so that a good batch reads normally afterwards.
TEST(GpuLoss, OutOfRangeLabelThrowsOnRead) {
  for (bool train : {false, true})  // the forward alone; fused with its gradient
    for (int32_t bad : {10, -3, 1000}) {
      SCOPED_TRACE("label " + std::to_string(bad) + (train ? ", training" : ", evaluation"));
      Graph g;
      Var z = train ? g.param("logits", {4, 10}, Init::uniform(-1, 1)) : g.input("logits", {4, 10});
      Var l = g.input("labels", {4}, DType::i32);
      Var loss = cross_entropy(z, l);
      Model m(g, {.device = Device::cuda});
      CompileOptions o;
      o.mode = train ? Mode::train : Mode::eval;
      o.outputs = {loss.id()};
      if (train) o.loss = loss.id(), o.gradients = true;
      Program p = m.compile(o);
      std::vector<float> logits(40);
      for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 7) * 0.25f - 0.5f;
      std::vector<int32_t> labels = {0, 9, bad, -100};
      if (train) {
        int fused = 0;
        for (auto& s : p.plan().steps) fused += s.op == Op::cross_entropy_with_grad;
        EXPECT_EQ(fused, 1) << p.plan().str();
      } else {
        p.set_input("logits", std::span<const float>(logits));
      }
      p.set_input("labels", std::span<const int32_t>(labels));
      p.run();
      try {
        (void)p.read(loss.name());
        ADD_FAILURE() << "label " << bad << " did not throw";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("label " + std::to_string(bad)), std::string::npos) << msg;
        EXPECT_NE(msg.find("row 2"), std::string::npos) << msg;
      }
      labels[2] = 5;
      p.set_input("labels", std::span<const int32_t>(labels));
      p.run();
      std::vector<float> v;
      EXPECT_NO_THROW(v = p.read_as<float>(loss.name())) << "the report was not cleared";
      ASSERT_EQ(v.size(), 1u);
      EXPECT_TRUE(std::isfinite(v[0]));
      EXPECT_GT(v[0], 0.f);
    }
}

// ---- layer_norm ----

TEST(GpuLayerNorm, WarpPathRows) {
  for (int64_t dim : {7, 129, 768})
    for (int64_t rows : {1, 5, 64, 1000}) compare_layer_norm({rows, dim});
  compare_layer_norm({3, 1});
  compare_layer_norm({2, 3, 1024});
  compare_layer_norm({16384, 32});  // more rows than the backward's blocks have warps
  compare_layer_norm({6000, 768});   // a GPT's rows, several a warp both ways: the next row loaded ahead
}

TEST(GpuLayerNorm, BlockPathRows) {
  for (int64_t rows : {1, 5, 64, 600}) compare_layer_norm({rows, 3000});
  compare_layer_norm({2, 3, 1025});
  compare_layer_norm({17, 5000});  // 16 columns per thread in registers
  compare_layer_norm({9, 9000});   // more: column sums in the block's scratch slice
}

TEST(GpuLayerNorm, OneDimensionalInput) { compare_layer_norm({768}); }
