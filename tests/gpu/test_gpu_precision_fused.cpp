// Generated kernels of fused_elementwise groups at mixed precision, against the CPU plan:
// 16-bit inputs loaded as they are, casts inside programs, each output stored in its own
// dtype; elementwise, ending in sums (one chunk and many, the partials of a 16-bit sum
// added in f32) and ending in a layer norm (rows in registers and not), each forced
// fused, split and timed.
#include <gtest/gtest.h>

#include <random>

#include "../test_util.h"
#include "backend/backend.h"
#include "common/half.h"
#include "gpu_check.h"

using namespace seam;
using seam::testing::count;
using namespace seam::gpu_testing;

namespace {

// The comparison for a 16-bit dtype at its policy, under an epilogue policy.
CompareOptions at(DType low, EpiloguePolicy e = EpiloguePolicy::fastest) {
  CompareOptions o = low == DType::bf16 ? bf16() : f16();
  o.epilogue = e;
  return o;
}

const EpiloguePolicy kPolicies[] = {EpiloguePolicy::fused, EpiloguePolicy::split, EpiloguePolicy::fastest};

std::string trace(DType low, EpiloguePolicy e) {
  return std::string(dtype_name(low)) + ", policy " + std::to_string(static_cast<int>(e));
}

// A random chain of 16-bit values (inputs, and parameters cast to 16 bits), now and then
// through f32 and back (a cast, an op with an f32 parameter, a cast), ending in f32.
Var random_low_chain(GpuCase& c, std::mt19937_64& rng, const Shape& shape, DType low) {
  const Shape row{shape.back()}, col{shape[0], 1};
  Var a = c.param("a", shape, 0.5, 1.5), row_f32 = c.param("row", row, 0.5, 1.5);
  std::vector<Var> pool = {c.data("x", shape, -2, 2, low), cast(a, low), cast(row_f32, low),
                           c.data("col", col, -1, 1, low)};
  auto pick = [&] { return pool[rng() % pool.size()]; };
  auto full = [&] {
    for (int k = 0; k < 20; ++k)
      if (Var v = pick(); v.shape() == shape) return v;
    return pool[0];
  };
  const int steps = 3 + static_cast<int>(rng() % 6);
  for (int i = 0; i < steps; ++i) {
    Var v;
    switch (rng() % 9) {
      case 0: v = relu(full()); break;
      case 1: v = sigmoid(full()); break;
      case 2: v = seam::tanh(full()); break;
      case 3: v = gelu(full(), rng() % 2 == 0); break;
      case 4: v = add(full(), pick()); break;
      case 5: v = mul(full(), pick()); break;
      case 6: v = sub(pick(), full()); break;
      case 7: v = silu(full()); break;
      default: v = cast(mul(cast(full(), DType::f32), row_f32), low); break;  // through f32
    }
    pool.push_back(v);
  }
  return cast(pool.back(), DType::f32);
}

}  // namespace

// Random 16-bit chains: every op computes in float and rounds where the unfused op would
// store, on both sides, so the GPU's kernels agree with the CPU to a few 16-bit ulps.
TEST(GpuPrecisionFused, RandomLowPrecisionChainsMatchTheCpu) {
  std::mt19937_64 rng(7);
  const std::vector<Shape> shapes = {{1, 1}, {3, 7}, {5, 129}, {64, 100}, {257, 1028}};
  for (DType low : {DType::bf16, DType::f16})
    for (int trial = 0; trial < 10; ++trial) {
      const Shape shape = shapes[static_cast<size_t>(trial) % shapes.size()];
      const uint64_t seed = rng();
      for (EpiloguePolicy e : kPolicies) {
        SCOPED_TRACE("trial " + std::to_string(trial) + ", " + shape_str(shape) + ", " + trace(low, e));
        compare_with_cpu(
            [&](GpuCase& c) {
              std::mt19937_64 r(seed);
              return random_low_chain(c, r, shape, low);
            },
            at(low, e));
      }
    }
}

// One group loads a 16-bit input, casts it to f32, adds an f32 bias, casts back, applies
// an activation in 16 bits and leaves in f32 again: the plan runs it as one generated
// kernel (no cast left standalone), which stores 16-bit and f32 outputs side by side.
TEST(GpuPrecisionFused, MixedDtypeGroupsMatchTheCpu) {
  const Shape shape{96, 64};
  auto build = [&](DType low) {
    return [&, low](GpuCase& c) {
      Var x = c.data("x", shape, -1, 1, low);
      Var r = add(cast(x, DType::f32), c.param("bias", {shape.back()}));
      Var h = gelu(cast(r, low), true);
      return mul(cast(h, DType::f32), c.param("s", {shape.back()}, 0.5, 1.5));
    };
  };
  for (DType low : {DType::bf16, DType::f16})
    for (EpiloguePolicy e : kPolicies) {
      SCOPED_TRACE(trace(low, e));
      compare_with_cpu(build(low), at(low, e));
    }
  GpuCase c;
  Var loss = sum(build(DType::bf16)(c));
  Model m(c.g, {.device = Device::cuda, .precision = Precision::bf16});
  Program p = m.compile({.loss = loss.id(), .gradients = true});
  EXPECT_EQ(count(p.plan(), Op::cast), 0) << p.plan().str();
  EXPECT_GT(count(p.plan(), Op::fused_elementwise), 0) << p.plan().str();
  for (auto& [step, what] : p.executable().stats().choices)
    if (p.plan().steps.at(static_cast<size_t>(step)).op == Op::fused_elementwise) {
      EXPECT_EQ(what.find("rejected"), std::string::npos) << what;
    }
}

// 16-bit operands read four at a time (8 bytes) and one at a time: broadcast rows
// (contiguous) and columns (constant along the rows), rows of a multiple of 4 and not,
// forward alone so that the group walks elementwise.
TEST(GpuPrecisionFused, BroadcastLowOperandsReadAsVectorsMatchTheCpu) {
  for (DType low : {DType::bf16, DType::f16})
    for (const Shape& shape : std::vector<Shape>{{64, 100}, {33, 1028}, {5, 7}, {3, 4, 8}}) {
      SCOPED_TRACE(std::string(dtype_name(low)) + " " + shape_str(shape));
      CompareOptions o = at(low);
      o.gradients = false;
      compare_with_cpu(
          [&](GpuCase& c) {
            Var x = c.data("x", shape, -1, 1, low);
            Var row = c.data("row", {shape.back()}, 0.5, 1.5, low);
            Shape col_shape = shape;
            col_shape.back() = 1;
            Var col = c.param("col", col_shape);  // f32, joined through a cast
            return cast(seam::tanh(add(mul(x, row), cast(col, low))), DType::f32);
          },
          o);
    }
  // Rows of a multiple of 4, aligned: the kernel reads and writes four values at a time.
  GpuCase c;
  Var x = c.data("x", {64, 100}, -1, 1, DType::bf16);
  Var y = seam::tanh(mul(x, c.data("row", {100}, -1, 1, DType::bf16)));
  Model m(c.g, {.device = Device::cuda});
  Program p = m.compile({.outputs = {y.id()}});
  int fused = 0;
  for (auto& [step, what] : p.executable().stats().choices)
    if (p.plan().steps.at(static_cast<size_t>(step)).op == Op::fused_elementwise) {
      ++fused;
      EXPECT_NE(what.find("vector width 4"), std::string::npos) << what;
    }
  EXPECT_EQ(fused, 1) << p.plan().str();
}

// Groups of 16-bit values ending in sums: stored in 16 bits (the chunks' partials added
// in f32, then rounded) or in f32, over both walks, one chunk and many.
TEST(GpuPrecisionFused, LowGroupsEndingInReductionsMatchTheCpu) {
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
    bool keepdims, mean, f32_result;
  };
  const std::vector<Case> cases = {
      {{4096, 64}, {0}, false, false, false},  // columns, many chunks, a bf16 sum
      {{4096, 64}, {0}, false, false, true},   // columns, many chunks, summed into f32
      {{37, 1000}, {0}, true, true, false},    // columns, one chunk
      {{301, 1001}, {0}, false, false, true},  // columns, one lane a thread
      {{64, 8192}, {1}, true, false, false},   // rows, many chunks
      {{300, 33}, {-1}, false, true, true},    // rows, one chunk
      {{128, 257}, {}, false, false, true},    // everything
  };
  for (DType low : {DType::bf16, DType::f16})
    for (const Case& k : cases)
      for (EpiloguePolicy e : kPolicies) {
        SCOPED_TRACE(shape_str(k.shape) + " axes " + shape_str(k.axes) + (k.mean ? " mean" : " sum") +
                     (k.f32_result ? " into f32, " : ", ") + trace(low, e));
        compare_with_cpu(
            [&](GpuCase& c) {
              Var x = c.data("x", k.shape, -2, 2, low);
              Var w = cast(c.param("w", {k.shape.back()}, 0.5, 1.5), low);
              Var t = seam::tanh(add(mul(x, w), cast(c.param("b", {k.shape.back()}), low)));
              Attrs attrs{{"axes", k.axes}, {"keepdims", int64_t{k.keepdims}}};
              if (k.f32_result) attrs.set("dtype", std::string("f32"));
              Var r = c.g.add1(k.mean ? Op::mean : Op::sum, {t.id()}, attrs);
              return sigmoid(cast(r, DType::f32));
            },
            at(low, e));
      }
}

// A 16-bit residual add + layer norm with f32 gamma and beta: y in 16 bits, the
// statistics in f32; rows in registers, and longer ones kept in y between the passes.
TEST(GpuPrecisionFused, LowGroupsEndingInALayerNormMatchTheCpu) {
  for (DType low : {DType::bf16, DType::f16})
    for (const Shape& shape : std::vector<Shape>{{64, 1024}, {9, 700}, {5, 3000}, {7, 1}, {2, 3, 40}})
      for (EpiloguePolicy e : kPolicies) {
        SCOPED_TRACE(shape_str(shape) + ", " + trace(low, e));
        compare_with_cpu(
            [&](GpuCase& c) {
              const Shape dim{shape.back()};
              Var h = add(c.data("x", shape, -1, 1, low), mul(cast(c.param("r", shape), low), c.data("s", dim, -1, 1, low)));
              Var y = layer_norm(h, c.param("gamma", dim, 0.5, 1.5), c.param("beta", dim), 1e-5);
              return cast(add(seam::tanh(y), h), DType::f32);
            },
            at(low, e));
      }
  // f32 data whose normalized rows a 16-bit GEMM reads: the group stores y in 16 bits (the
  // cast is its store), rows past 1024 computed again in each pass rather than kept in y.
  for (DType low : {DType::bf16, DType::f16})
    for (const Shape& shape : std::vector<Shape>{{9, 700}, {5, 3000}})
      for (EpiloguePolicy e : kPolicies) {
        SCOPED_TRACE("f32 rows " + shape_str(shape) + ", " + trace(low, e));
        compare_with_cpu(
            [&](GpuCase& c) {
              const Shape dim{shape.back()};
              Var h = add(c.data("x", shape), c.param("r", shape));
              Var y = layer_norm(h, c.param("gamma", dim, 0.5, 1.5), c.param("beta", dim), 1e-5);
              return seam::tanh(cast(matmul(cast(y, low), cast(c.param("w", {shape.back(), 8}), low)), DType::f32));
            },
            at(low, e));
      }
  GpuCase c;
  Var x = c.data("x", {16, 64}, -1, 1, DType::bf16);
  Var h = add(x, c.data("r", {16, 64}, -1, 1, DType::bf16));
  Var y = layer_norm(h, c.param("gamma", {64}), c.param("beta", {64}), 1e-5);
  Model m(c.g, {.device = Device::cuda, .precision = Precision::bf16});
  Program p = m.compile({.outputs = {y.id()}});
  EXPECT_EQ(count(p.plan(), Op::layer_norm), 0) << p.plan().str();
  EXPECT_EQ(count(p.plan(), Op::fused_elementwise), 1) << p.plan().str();
}
