// The elementwise, reduction, shape and small ops on the GPU against the CPU: outputs and
// the gradients of every parameter, on shapes that take each kernel path (float4 with and
// without a scalar tail, collapsed broadcasts, row broadcasts in packs, warp/block/column
// reductions with and without a second pass, tiled and strided transposes, widened
// copies), plus a bad embedding id reported by the device and thrown on the host's next
// read.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "../test_util.h"
#include "ew_cases.h"
#include "gpu_check.h"

using namespace seam;
using seam::gpu_testing::CompareOptions;
using seam::gpu_testing::compare_with_cpu;
using seam::gpu_testing::f32;
using seam::gpu_testing::GpuCase;
using seam::gpu_testing::Tolerance;
using seam::gpu_testing::binary_ops;
using seam::gpu_testing::unary_cases;
using seam::testing::random_floats;

namespace {

CompareOptions no_grad() {
  CompareOptions o = f32();
  o.gradients = false;
  return o;
}

// CUDA's expf, tanhf, erff, logf and powf are within 1-2 ulp of glibc's, not equal to
// them, and gradients such as gelu's (two terms of opposite sign) or pow's (x^(p-1))
// amplify that relative difference; a little headroom over f32() keeps those cases
// from flaking while still catching any real formula error (those are >> 1e-3).
CompareOptions transcendental() { return {Precision::f32, {3e-5, 3e-4, 1e-6}}; }

// Shapes for elementwise ops: tiny ones, an odd one, numel % 4 != 0 (float4 body plus a
// scalar tail: 999 * 1027), and numel % 4 == 0 (float4 only).
const std::vector<Shape> kShapes = {{1}, {3}, {7}, {129}, {3, 7, 129}, {1000, 1027}, {999, 1027}, {512, 1024}};

}  // namespace

TEST(GpuElementwise, EveryUnaryOpAndItsGradientMatchTheCpu) {
  for (auto& u : unary_cases())
    for (auto& s : kShapes) {
      SCOPED_TRACE(u.name + " of " + shape_str(s));
      compare_with_cpu([&](GpuCase& c) { return u.f(c.param("x", s, u.lo, u.hi)); },
                       u.transcendental ? transcendental() : f32());
    }
}

TEST(GpuElementwise, EveryBinaryOpBroadcastsAndMatchesTheCpu) {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{1}, {1}},           {{3}, {3}},           {{3, 7}, {3, 7}},         {{3, 7}, {7}},
      {{3, 1}, {1, 7}},     {{1}, {2, 3, 7}},     {{2, 1, 3}, {7, 1}},      {{129}, {1}},
      {{1, 7}, {7}},        {{5, 1, 129}, {4, 1}}, {{1000, 1027}, {1000, 1027}}, {{999, 1027}, {999, 1027}},
      {{512, 1024}, {1024}}, {{1000, 1}, {1000, 1027}}, {{1024}, {4, 3, 1024}}, {{6, 5, 12}, {5, 12}},
  };
  for (auto& [name, f] : binary_ops())
    for (auto& [sa, sb] : pairs) {
      SCOPED_TRACE(name + " of " + shape_str(sa) + " and " + shape_str(sb));
      // b stays away from 0 so that div and its gradient are tame.
      const double blo = name == "div" ? 0.5 : -1, bhi = name == "div" ? 2 : 1;
      compare_with_cpu([&](GpuCase& c) { return f(c.param("a", sa), c.param("b", sb, blo, bhi)); }, f32());
    }
}

TEST(GpuElementwise, ChainsOfOpsMatchTheCpu) {
  compare_with_cpu(
      [](GpuCase& c) {
        Var x = c.param("x", {64, 129}), w = c.param("w", {129}), b = c.param("b", {64, 1});
        return tanh(add(mul(x, w), b)) * 0.5 - sigmoid(x);
      },
      transcendental());
}

TEST(GpuReduce, SumAndMeanOverEveryAxisPattern) {
  for (const Shape& s : {Shape{5, 7, 129}, Shape{8, 16, 9, 9}, Shape{2, 1, 33, 1}})
    for (int mask = 0; mask < (1 << s.size()); ++mask)
      for (bool is_mean : {false, true}) {
        std::vector<int64_t> axes;  // mask 0: none listed, i.e. every axis
        for (size_t d = 0; d < s.size(); ++d)
          if (mask & (1 << d)) axes.push_back(static_cast<int64_t>(d));
        const bool keepdims = (mask % 3) == 1;
        SCOPED_TRACE(std::string(is_mean ? "mean" : "sum") + " of " + shape_str(s) + " over " + shape_str(axes) +
                     (keepdims ? " keepdims" : ""));
        compare_with_cpu(
            [&](GpuCase& c) {
              Var x = c.param("x", s);
              return is_mean ? mean(x, axes, keepdims) : sum(x, axes, keepdims);
            },
            f32());
      }
}

TEST(GpuReduce, LargeAndLopsidedReductions) {
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
  };
  const std::vector<Case> cases = {
      {{4099, 257}, {0}},      // columns, split into chunks plus a second pass
      {{4099, 264}, {0}},      // columns in 16-byte packs, a tile partly past the width
      {{16, 64, 768}, {0}},    // few rows of many packed columns: one chunk
      {{4099, 257}, {1}},      // warp per row
      {{4099, 257}, {}},       // everything: block per chunk plus a second pass
      {{1000, 1027}, {}},      //
      {{2, 40000}, {1}},       // few long rows: blocks in chunks
      {{40000, 3}, {0}},       // narrow columns: strided block reduction
      {{3, 5000, 40}, {1}},    // columns with an outer kept dim
      {{64, 3, 5000}, {-1}},   // block per row
      {{8, 16, 9, 9}, {0, 2, 3}},  // batch-norm style: kept channel between reduced dims
      {{32, 64, 56, 56}, {0, 2, 3}},
      {{1000, 3, 7}, {1}},     // thread per output
  };
  for (auto& k : cases)
    for (bool is_mean : {false, true}) {
      SCOPED_TRACE(std::string(is_mean ? "mean" : "sum") + " of " + shape_str(k.shape) + " over " +
                   shape_str(k.axes));
      compare_with_cpu(
          [&](GpuCase& c) {
            Var x = c.param("x", k.shape);
            return is_mean ? mean(x, k.axes) : sum(x, k.axes);
          },
          f32());
    }
}

// A column sum in row chunks leaves the tile's count of finished chunks at zero for the
// next run: each run after the first, with new values, gives their sums (a count left
// over would make no block the last, and the output would keep the previous run's).
TEST(GpuReduce, ChunkedColumnSumsRunAgainOnNewValues) {
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
  };
  for (const Case& k : {Case{{4099, 257}, {0}}, Case{{4099, 264}, {0}}, Case{{3, 5000, 40}, {1}}}) {
    SCOPED_TRACE("sum over " + shape_str(k.shape));
    Graph g;
    Var x = g.input("x", k.shape);
    Var y = sum(x, k.axes);
    Model cpu(g, {.seed = 1}), gpu(g, {.seed = 1, .device = Device::cuda});
    Program pc = cpu.compile({.mode = Mode::eval, .outputs = {y.id()}});
    Program pg = gpu.compile({.mode = Mode::eval, .outputs = {y.id()}});
    const size_t n = static_cast<size_t>(numel(k.shape));
    for (uint64_t seed : {1, 2, 3}) {
      const auto v = random_floats(n, seed);
      pc.set_input("x", std::span<const float>(v));
      pg.set_input("x", std::span<const float>(v));
      pc.run();
      pg.run();
      seam::gpu_testing::expect_close(pg.read_as<float>(y.name()), pc.read_as<float>(y.name()), f32().tol,
                                      "run with seed " + std::to_string(seed));
    }
  }
}

TEST(GpuReduce, BroadcastToMatchesTheCpu) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 1, 7}, {2, 3, 5, 7}}, {{1}, {4, 5}}, {{129}, {1000, 129}}, {{7, 1}, {7, 33}}, {{2, 3}, {2, 3}}};
  for (auto& [from, to] : cases) {
    SCOPED_TRACE(shape_str(from) + " to " + shape_str(to));
    compare_with_cpu([&](GpuCase& c) { return broadcast_to(c.param("x", from), to); }, f32());
  }
}

TEST(GpuShape, TransposeAndPermuteMatchTheCpu) {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{3, 7}, {1, 0}},
      {{1000, 1027}, {1, 0}},          // tiled
      {{2, 3, 4, 5}, {0, 2, 3, 1}},    // NCHW -> NHWC, tiled batch
      {{2, 3, 4, 5}, {0, 3, 1, 2}},    // NHWC -> NCHW
      {{2, 3, 4, 5}, {1, 0, 2, 3}},    // innermost stays: widened strided copy
      {{2, 3, 4, 5}, {3, 2, 1, 0}},
      {{2, 3, 4, 5}, {0, 2, 1, 3}},
      {{64, 129, 33}, {2, 0, 1}},
      {{8, 16, 9, 9}, {0, 2, 3, 1}},
      {{4, 1, 6}, {2, 1, 0}},
      {{16, 8, 12, 64}, {0, 2, 1, 3}},  // attention heads: rows of 64 floats move as float4
      {{6, 3, 32, 32}, {0, 2, 3, 1}},   // an RGB batch to NHWC: too narrow for tiles
      {{6, 32, 32, 3}, {0, 3, 1, 2}},   // and back
  };
  for (auto& [shape, perm] : cases) {
    SCOPED_TRACE(shape_str(shape) + " permuted by " + shape_str(perm));
    compare_with_cpu([&](GpuCase& c) { return permute(c.param("x", shape), perm); }, f32());
  }
  compare_with_cpu([](GpuCase& c) { return transpose(c.param("x", {5, 6, 7}), 0, 2); }, f32());
}

TEST(GpuShape, TransposeMovesElementsOfEverySize) {
  // 4 bytes (i32), 2 (bf16), 1 (u8), 8 (f64); the float ones carry gradients back through
  // the same kernels in their own dtype.
  compare_with_cpu([](GpuCase& c) { return permute(c.labels("ids", {37, 129}, 1000), {1, 0}); }, no_grad());
  compare_with_cpu([](GpuCase& c) { return permute(c.labels("ids", {4, 5, 6}, 1000), {2, 0, 1}); }, no_grad());
  for (DType t : {DType::bf16, DType::f16, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    compare_with_cpu([&](GpuCase& c) { return cast(permute(cast(c.param("x", {37, 129}), t), {1, 0}), DType::f32); },
                     f32());
    compare_with_cpu(
        [&](GpuCase& c) { return cast(permute(cast(c.param("x", {3, 4, 5, 6}), t), {0, 2, 1, 3}), DType::f32); },
        f32());
  }
  compare_with_cpu(
      [](GpuCase& c) { return cast(permute(cast(c.data("x", {33, 65}, 0, 250), DType::u8), {1, 0}), DType::f32); },
      no_grad());
  compare_with_cpu(
      [](GpuCase& c) {
        return cast(permute(cast(c.data("x", {3, 5, 64}, 0, 250), DType::u8), {1, 0, 2}), DType::f32);
      },
      no_grad());
}

TEST(GpuShape, ConcatMatchesTheCpu) {
  compare_with_cpu([](GpuCase& c) { return concat({c.param("a", {3, 7}), c.param("b", {3, 5})}, 1); }, f32());
  compare_with_cpu(
      [](GpuCase& c) { return concat({c.param("a", {2, 3, 4}), c.param("b", {1, 3, 4}), c.param("d", {4, 3, 4})}, 0); },
      f32());
  compare_with_cpu(
      [](GpuCase& c) { return concat({c.param("a", {2, 3, 4, 5}), c.param("b", {2, 3, 1, 5})}, -2); }, f32());
  compare_with_cpu(
      [](GpuCase& c) { return concat({c.param("a", {64, 256}), c.param("b", {64, 128}), c.param("d", {64, 3})}, 1); },
      f32());
  compare_with_cpu(
      [](GpuCase& c) { return concat({c.labels("a", {5, 3}, 100), c.labels("b", {5, 2}, 100)}, 1); }, no_grad());
  compare_with_cpu(
      [](GpuCase& c) {
        return cast(concat({cast(c.param("a", {6, 7}), DType::bf16), cast(c.param("b", {6, 9}), DType::bf16)}, 1),
                    DType::f32);
      },
      f32());
}

TEST(GpuShape, SliceAndItsGradientMatchTheCpu) {
  struct Case {
    Shape shape;
    int64_t axis, start, end, step;
  };
  const std::vector<Case> cases = {
      {{10, 129}, 1, 3, 100, 7},    {{10, 129}, 0, -4, 10, 1},   {{10, 129}, 0, 0, 10, 3},
      {{8, 16, 9, 9}, 2, 1, 9, 2},  {{1000, 1027}, 1, 1, 1025, 1}, {{512, 1024}, 1, 256, 768, 1},
      {{512, 1024}, 0, 7, 500, 5},  {{7}, 0, -100, 100, 2},      {{3, 4, 64}, -1, 8, 40, 1},
  };
  for (auto& k : cases) {
    SCOPED_TRACE(shape_str(k.shape) + " axis " + std::to_string(k.axis) + " [" + std::to_string(k.start) + ":" +
                 std::to_string(k.end) + ":" + std::to_string(k.step) + "]");
    compare_with_cpu([&](GpuCase& c) { return slice(c.param("x", k.shape), k.axis, k.start, k.end, k.step); },
                     f32());
  }
}

TEST(GpuMisc, FullMatchesTheCpu) {
  // Every gradient test above also starts from full (the loss's seed).
  compare_with_cpu([](GpuCase& c) { return add(c.param("x", {3, 7}), full(c.g, {3, 7}, 2.5)); }, f32());
  compare_with_cpu([](GpuCase& c) { return add(c.param("x", {3, 7}), full(c.g, {7}, 0.0)); }, f32());
  compare_with_cpu([](GpuCase& c) { return full(c.g, {5, 3}, -7.9, DType::i32); }, no_grad());
  compare_with_cpu([](GpuCase& c) { return cast(full(c.g, {4, 5}, 1.7, DType::bf16), DType::f32); }, no_grad());
  compare_with_cpu([](GpuCase& c) { return cast(full(c.g, {4, 5}, 1e-6, DType::f16), DType::f32); }, no_grad());
  compare_with_cpu([](GpuCase& c) { return cast(full(c.g, {9}, 300, DType::u8), DType::f32); }, no_grad());
  compare_with_cpu([](GpuCase& c) { return cast(full(c.g, {1000, 1027}, -3.25, DType::f64), DType::f32); },
                   no_grad());
}

TEST(GpuMisc, CastRoundTripsMatchTheCpu) {
  for (DType t : {DType::bf16, DType::f16, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    compare_with_cpu([&](GpuCase& c) { return cast(cast(c.param("x", {37, 129}, -3, 3), t), DType::f32); }, f32());
    // Large magnitudes: f16 overflows to inf past 65520 on both sides alike, so only bf16
    // and f64 take them.
    if (t != DType::f16)
      compare_with_cpu([&](GpuCase& c) { return cast(cast(c.data("x", {1000}, -1e6, 1e6), t), DType::f32); },
                       no_grad());
  }
  // f16 subnormals.
  compare_with_cpu([](GpuCase& c) { return cast(cast(c.data("x", {999}, -1e-5, 1e-5), DType::f16), DType::f32); },
                   no_grad());
  // Truncation toward zero and saturation.
  compare_with_cpu([](GpuCase& c) { return cast(c.data("x", {1000}, -300, 300), DType::i32); }, no_grad());
  compare_with_cpu([](GpuCase& c) { return cast(c.data("x", {1000}, -3e9, 3e9), DType::i32); }, no_grad());
  compare_with_cpu([](GpuCase& c) { return cast(cast(c.data("x", {1000}, -10, 300), DType::u8), DType::f32); },
                   no_grad());
  // Integers to floats: i32 -> f32 rounds to nearest even, i32 -> bf16 rounds twice as
  // the CPU does (through f32).
  compare_with_cpu([](GpuCase& c) { return cast(c.labels("ids", {1000}, 2000000000), DType::f32); }, no_grad());
  compare_with_cpu(
      [](GpuCase& c) { return cast(cast(c.labels("ids", {1000}, 2000000000), DType::bf16), DType::f32); },
      no_grad());
  compare_with_cpu(
      [](GpuCase& c) { return cast(cast(cast(c.labels("ids", {1000}, 100000), DType::f16), DType::i32), DType::f32); },
      no_grad());
  compare_with_cpu([](GpuCase& c) { return cast(cast(c.labels("ids", {100}, 1000), DType::u8), DType::i32); },
                   no_grad());
}

TEST(GpuMisc, CopyMatchesTheCpu) {
  compare_with_cpu([](GpuCase& c) { return copy(c.param("x", {33, 65})); }, f32());
}

TEST(GpuMisc, ArgmaxMatchesTheCpu) {
  compare_with_cpu([](GpuCase& c) { return argmax(c.data("x", {37, 129})); }, no_grad());       // warp per row
  compare_with_cpu([](GpuCase& c) { return argmax(c.data("x", {37, 129}), 0); }, no_grad());    // strided
  compare_with_cpu([](GpuCase& c) { return argmax(c.data("x", {4, 5, 6}), 1); }, no_grad());
  compare_with_cpu([](GpuCase& c) { return argmax(c.data("x", {1000, 10})); }, no_grad());      // short rows
  compare_with_cpu([](GpuCase& c) { return argmax(c.data("x", {3, 5000})); }, no_grad());
  // Padded rows (the slice absorbed): only the first 997 or 10 columns are candidates.
  compare_with_cpu([](GpuCase& c) { return argmax(slice(c.data("x", {37, 1000}), 1, 0, 997)); }, no_grad());
  compare_with_cpu([](GpuCase& c) { return argmax(slice(c.data("x", {37, 16}), 1, 0, 10)); }, no_grad());
  // Ties: relu of mostly negative values leaves rows of zeros; the first index wins.
  compare_with_cpu([](GpuCase& c) { return argmax(relu(c.data("x", {64, 40}, -3, 0.1))); }, no_grad());
  compare_with_cpu([](GpuCase& c) { return argmax(relu(c.data("x", {64, 40}, -3, 0.1)), 0); }, no_grad());
  compare_with_cpu([](GpuCase& c) { return argmax(relu(c.data("x", {16, 300}, -3, 0.01))); }, no_grad());
  // 16-bit rows in 16-byte packs (padded, and with ties), and ones no multiple of 8.
  for (DType t : {DType::bf16, DType::f16}) {
    compare_with_cpu([&](GpuCase& c) { return argmax(slice(c.data("x", {37, 1000}, -1, 1, t), 1, 0, 997)); },
                     no_grad());
    compare_with_cpu([&](GpuCase& c) { return argmax(relu(c.data("x", {16, 304}, -3, 0.01, t))); }, no_grad());
    compare_with_cpu([&](GpuCase& c) { return argmax(c.data("x", {9, 1001}, -1, 1, t)); }, no_grad());
  }
}

TEST(GpuMisc, DropoutMasksAreTheCpusBitForBit) {
  // Same seed and step on both devices, the same Philox draws, the same float products:
  // forward and gradient are equal bit for bit.
  const CompareOptions exact(Precision::f32, Tolerance::exact());
  for (const Shape& s : {Shape{64, 129}, Shape{999}, Shape{1000, 1027}, Shape{3}}) {
    SCOPED_TRACE(shape_str(s));
    compare_with_cpu([&](GpuCase& c) { return dropout(c.param("x", s), 0.3); }, exact);
  }
  // Two dropouts of one value draw from different streams.
  compare_with_cpu(
      [](GpuCase& c) {
        Var x = c.param("x", {33, 40});
        return add(dropout(x, 0.5), dropout(x, 0.5));
      },
      exact);
  // Evaluation: the identity.
  CompareOptions eval = exact.in_mode(Mode::eval);
  eval.gradients = false;
  compare_with_cpu([](GpuCase& c) { return dropout(c.data("x", {10, 10}), 0.5); }, eval);
}

TEST(GpuMisc, EmbeddingAndItsGradientMatchTheCpu) {
  // Repeated ids: the gradient adds several rows of dy into one row of dweight.
  compare_with_cpu([](GpuCase& c) { return embedding(c.labels("ids", {5, 7}, 11), c.param("w", {11, 33})); }, f32());
  compare_with_cpu([](GpuCase& c) { return embedding(c.labels("ids", {200}, 50), c.param("w", {50, 64})); }, f32());
  compare_with_cpu([](GpuCase& c) { return embedding(c.labels("ids", {4, 64}, 3), c.param("w", {3, 128})); }, f32());
}

// The gradient's own report, on its four-wide path (rows of 8 values, added by 16-byte
// atomics) and its scalar one (rows of 6): an evaluation plan of the gradient alone, as
// a forward embedding would report the id first.
TEST(GpuMisc, AnEmbeddingGradientsIdOutOfRangeIsReported) {
  for (int64_t dim : {8, 6}) {
    SCOPED_TRACE("rows of " + std::to_string(dim));
    Graph g;
    Var ids = g.input("ids", {3}, DType::i32);
    Var dy = g.input("dy", {3, dim});
    Var dw = g.add1(Op::embedding_grad, {dy.id(), ids.id()}, {{"num", int64_t{4}}});
    Model m(g, {.device = Device::cuda});
    Program p = m.compile({.mode = Mode::eval, .outputs = {dw.id()}});
    const std::vector<float> d = random_floats(static_cast<size_t>(3 * dim), 3);
    p.set_input("dy", std::span<const float>(d));
    std::vector<int32_t> good{3, 0, 3}, bad{0, 4, 1};
    p.set_input("ids", std::span<const int32_t>(good));
    p.run();
    const std::vector<float> sums = p.read_as<float>(dw.name());
    const auto n = static_cast<size_t>(dim);
    for (size_t c = 0; c < n; ++c) {  // row 3 adds positions 0 and 2, row 0 is position 1's
      EXPECT_FLOAT_EQ(sums[3 * n + c], d[c] + d[2 * n + c]);
      EXPECT_EQ(sums[c], d[n + c]);
    }
    p.set_input("ids", std::span<const int32_t>(bad));
    try {
      p.run();
      p.read(dw.name());
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("id 4 at position 1"), std::string::npos) << e.what();
    }
  }
}

TEST(GpuMisc, AnEmbeddingIdOutOfRangeIsReportedOnRead) {
  Graph g;
  Var ids = g.input("ids", {3}, DType::i32);
  Var w = g.param("w", {4, 8}, Init::uniform(-1, 1));
  Var y = embedding(ids, w);
  Model m(g, {.device = Device::cuda});
  Program p = m.compile({.mode = Mode::eval, .outputs = {y.id()}});
  std::vector<int32_t> good{3, 0, 3};
  p.set_input("ids", std::span<const int32_t>(good));
  p.run();
  EXPECT_NO_THROW(p.read(y.name()));
  std::vector<int32_t> bad{0, 4, 1};
  p.set_input("ids", std::span<const int32_t>(bad));
  try {
    p.run();  // kernels cannot throw: the device records the id, the next read throws
    p.read(y.name());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 4 at position 1"), std::string::npos) << e.what();
  }
  // The report is cleared once thrown: good ids read cleanly again.
  p.set_input("ids", std::span<const int32_t>(good));
  p.run();
  EXPECT_NO_THROW(p.read(y.name()));
}
