// The elementwise, reduction, softmax, shape and small ops with 16-bit storage (bf16,
// f16) on the GPU against the CPU, which runs its f32 kernels on f32 copies of the
// 16-bit operands and rounds every 16-bit result to nearest even when it stores it: both
// compute in f32 from the same 16-bit values, so they differ only where a different
// order of operations (or a CUDA math function 1 ulp off glibc's) puts a result on the
// other side of a rounding boundary (Tolerance::bf16(), Tolerance::f16()). Where the
// f32 computation is the same on both sides (casts, dropout) they agree bit for bit.
//
// Each op is reached directly: its operands are cast to the 16-bit type inside the graph
// (cast(x, bf16) of an f32 parameter is also the working copy the precision pass would
// make) and its result cast back to f32, so the op runs at 16 bits whatever the pass
// decides, and its gradient comes back through the casts. Elementwise fusion is off, so
// each op runs its own kernel rather than a generated one (test_gpu_fused covers those).
// A last group of plain f32 graphs relies on the pass alone.
//
// Shapes take each kernel path at 16 bits: 8-value (16-byte) vectors with and without a
// scalar tail (numel % 8 != 0), broadcasts, odd sizes; reductions with a 16-bit or an
// f32 output, with and without the second pass over chunk partials (add_partials).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "ew_cases.h"
#include "gpu_check.h"

using namespace seam;
using seam::gpu_testing::compare_with_cpu;
using seam::gpu_testing::CompareOptions;
using seam::gpu_testing::GpuCase;
using seam::gpu_testing::Tolerance;
using seam::gpu_testing::binary_ops;
using seam::gpu_testing::unary_cases;

namespace {

struct Low {
  DType dtype;
  const char* name;
  // The policy of the 16-bit type, each op as a kernel of its own.
  CompareOptions options() const {
    CompareOptions o = dtype == DType::bf16 ? gpu_testing::bf16() : gpu_testing::f16();
    o.fuse = false;
    return o;
  }
  CompareOptions no_grad() const {
    CompareOptions o = options();
    o.gradients = false;
    return o;
  }
  CompareOptions exact() const {
    CompareOptions o = options();
    o.tol = Tolerance::exact();
    return o;
  }
};
constexpr Low kLows[] = {{DType::bf16, "bf16"}, {DType::f16, "f16"}};

Var to_f32(Var x) { return cast(x, DType::f32); }

// A parameter stored in the 16-bit type: its f32 master, cast.
Var low_param(GpuCase& c, const Low& l, const std::string& name, Shape shape, double lo = -1, double hi = 1) {
  return cast(c.param(name, std::move(shape), lo, hi), l.dtype);
}

// A 16-bit graph input fed as 16-bit bytes, each value one of `levels` evenly spaced in
// [lo, hi] (few levels make ties), or uniform in [lo, hi) when levels is 0.
Var low_input(GpuCase& c, const Low& l, const std::string& name, Shape shape, double lo, double hi, int levels = 0) {
  Var v = c.g.input(name, shape, l.dtype);
  std::uniform_real_distribution<double> u(lo, hi);
  std::uniform_int_distribution<int> k(0, std::max(levels - 1, 0));
  std::vector<uint16_t> bits(static_cast<size_t>(numel(shape)));
  for (auto& b : bits) {
    const double x = levels > 1 ? lo + (hi - lo) * k(c.rng()) / (levels - 1) : u(c.rng());
    b = l.dtype == DType::bf16 ? float_to_bf16(static_cast<float>(x)) : float_to_f16(static_cast<float>(x));
  }
  std::vector<std::byte> bytes(bits.size() * 2);
  std::memcpy(bytes.data(), bits.data(), bytes.size());
  c.feeds.emplace_back(name, std::move(bytes));
  return v;
}

// sum or mean; with f32_out the result is written in f32 from the 16-bit input (the
// "dtype" attribute the precision pass and fold_casts set), else in the input's dtype.
Var reduce(Var x, bool is_mean, const std::vector<int64_t>& axes, bool keepdims, bool f32_out) {
  Attrs at{{"axes", axes}, {"keepdims", int64_t{keepdims}}};
  if (f32_out) at.set("dtype", std::string("f32"));
  Var y = x.graph().add1(is_mean ? Op::mean : Op::sum, {x.id()}, at);
  return f32_out ? y : to_f32(y);
}

// Elementwise shapes: tiny ones, odd ones, numel % 8 != 0 (8-value vectors plus a scalar
// tail: 999 * 1027 and 3 * 7 * 129), numel % 8 == 0 (vectors only).
const std::vector<Shape> kShapes = {{1}, {3}, {7}, {129}, {3, 7, 129}, {999, 1027}, {512, 1024}};

}  // namespace

// ---------------------------------------------------------------------------------------
// Elementwise

TEST(GpuPrecisionEw, EveryUnaryOpAndItsGradientMatchTheCpu) {
  for (const Low& l : kLows)
    for (auto& u : unary_cases())
      for (auto& s : kShapes) {
        SCOPED_TRACE(std::string(l.name) + " " + u.name + " of " + shape_str(s));
        compare_with_cpu([&](GpuCase& c) { return to_f32(u.f(low_param(c, l, "x", s, u.lo, u.hi))); }, l.options());
      }
}

TEST(GpuPrecisionEw, EveryBinaryOpBroadcastsAndMatchesTheCpu) {
  // Same shapes (vectors, with and without a tail), a row or column broadcast, both sides
  // broadcast, scalars, and odd rank-3 walks.
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{1}, {1}},
      {{3}, {3}},
      {{3, 7}, {3, 7}},
      {{3, 7}, {7}},
      {{3, 1}, {1, 7}},
      {{1}, {2, 3, 7}},
      {{2, 1, 3}, {7, 1}},
      {{129}, {1}},
      {{1, 7}, {7}},
      {{5, 1, 129}, {4, 1}},
      {{999, 1027}, {999, 1027}},
      {{512, 1024}, {512, 1024}},
      {{512, 1024}, {1024}},
      {{1000, 1}, {1000, 1027}},
      {{33, 17}, {1, 17}},
      {{1024}, {4, 3, 1024}},  // rows, the repeated one first
      {{6, 5, 24}, {5, 24}},   // rows of 120: 15 packs
      {{6, 5, 12}, {5, 12}},   // rows of 60: not whole packs, strided
  };
  for (const Low& l : kLows)
    for (auto& [name, f] : binary_ops())
      for (auto& [sa, sb] : pairs) {
        SCOPED_TRACE(std::string(l.name) + " " + name + " of " + shape_str(sa) + " and " + shape_str(sb));
        // b stays away from 0 so that div and its gradient are tame.
        const double blo = name == "div" ? 0.5 : -1, bhi = name == "div" ? 2 : 1;
        compare_with_cpu(
            [&](GpuCase& c) { return to_f32(f(low_param(c, l, "a", sa), low_param(c, l, "b", sb, blo, bhi))); },
            l.options());
      }
}

TEST(GpuPrecisionEw, ChainsOfOpsStayAt16Bits) {
  // Every intermediate is stored in 16 bits on both sides, so the chain rounds alike.
  for (const Low& l : kLows) {
    SCOPED_TRACE(l.name);
    compare_with_cpu(
        [&](GpuCase& c) {
          Var x = low_param(c, l, "x", {64, 129}), w = low_param(c, l, "w", {129}), b = low_param(c, l, "b", {64, 1});
          return to_f32(sub(scale(tanh(add(mul(x, w), b)), 0.5), sigmoid(x)));
        },
        l.options());
  }
}

TEST(GpuPrecisionEw, SixteenBitInputsFeedTheKernelsDirectly) {
  for (const Low& l : kLows) {
    SCOPED_TRACE(l.name);
    compare_with_cpu(
        [&](GpuCase& c) {
          Var x = low_input(c, l, "x", {37, 129}, -2, 2);
          return to_f32(mul(gelu(x), low_param(c, l, "w", {129})));
        },
        l.options());
  }
}

// ---------------------------------------------------------------------------------------
// Reductions

TEST(GpuPrecisionReduce, SumAndMeanOverEveryAxisPattern) {
  for (const Low& l : kLows)
    for (const Shape& s : {Shape{5, 7, 129}, Shape{8, 16, 9, 9}, Shape{2, 1, 33, 1}})
      for (int mask = 0; mask < (1 << s.size()); ++mask)
        for (bool is_mean : {false, true})
          for (bool f32_out : {false, true}) {
            if (is_mean == f32_out && mask % 2 == 1) continue;  // half the pairs are enough for odd masks
            std::vector<int64_t> axes;  // mask 0: none listed, i.e. every axis
            for (size_t d = 0; d < s.size(); ++d)
              if (mask & (1 << d)) axes.push_back(static_cast<int64_t>(d));
            const bool keepdims = (mask % 3) == 1;
            SCOPED_TRACE(std::string(l.name) + " " + (is_mean ? "mean" : "sum") + " of " + shape_str(s) + " over " +
                         shape_str(axes) + (keepdims ? " keepdims" : "") + (f32_out ? " into f32" : ""));
            compare_with_cpu(
                [&](GpuCase& c) { return reduce(low_param(c, l, "x", s), is_mean, axes, keepdims, f32_out); },
                l.options());
          }
}

TEST(GpuPrecisionReduce, LargeAndLopsidedReductions) {
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
  };
  const std::vector<Case> cases = {
      {{4099, 257}, {0}},          // columns, in chunks plus the second pass (add_partials)
      {{4099, 264}, {0}},          // columns in 16-byte packs, a tile partly past the width
      {{16, 64, 768}, {0}},        // few rows of many packed columns: one chunk
      {{2048, 2304}, {0}},         // a bias gradient's column sums (linear_grad_weight_bias split)
      {{4099, 257}, {1}},          // warp per row
      {{4099, 257}, {}},           // everything: block per chunk plus the second pass
      {{2, 40000}, {1}},           // few long rows: blocks in chunks
      {{40000, 3}, {0}},           // narrow columns
      {{3, 5000, 40}, {1}},        // columns with an outer kept dim
      {{64, 3, 5000}, {-1}},       // block per row
      {{8, 16, 9, 9}, {0, 2, 3}},  // kept channel between reduced dims
      {{1000, 3, 7}, {1}},         // thread per output
  };
  for (const Low& l : kLows)
    for (auto& k : cases)
      for (bool f32_out : {false, true})
        for (bool is_mean : {false, true}) {
          SCOPED_TRACE(std::string(l.name) + " " + (is_mean ? "mean" : "sum") + " of " + shape_str(k.shape) + " over " +
                       shape_str(k.axes) + (f32_out ? " into f32" : ""));
          compare_with_cpu(
              [&](GpuCase& c) { return reduce(low_param(c, l, "x", k.shape), is_mean, k.axes, false, f32_out); },
              l.options());
        }
}

TEST(GpuPrecisionReduce, BroadcastToMatchesTheCpu) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 1, 7}, {2, 3, 5, 7}}, {{1}, {4, 5}}, {{129}, {1000, 129}}, {{7, 1}, {7, 33}}, {{2, 3}, {2, 3}}};
  for (const Low& l : kLows)
    for (auto& [from, to] : cases) {
      SCOPED_TRACE(std::string(l.name) + " " + shape_str(from) + " to " + shape_str(to));
      compare_with_cpu([&](GpuCase& c) { return to_f32(broadcast_to(low_param(c, l, "x", from), to)); }, l.options());
    }
}

// ---------------------------------------------------------------------------------------
// Softmax

TEST(GpuPrecisionSoftmax, SoftmaxAndLogSoftmaxWithGradientsMatchTheCpu) {
  struct Case {
    Shape shape;
    int64_t axis;
  };
  const std::vector<Case> cases = {
      {{37, 129}, -1},    // warp per row
      {{64, 10}, -1},     // short rows
      {{8, 1000}, -1},    // warp per row, 32 values a lane
      {{4, 3000}, -1},    // block per row
      {{5, 7, 33}, 1},    // strided lanes
      {{2, 3, 4, 5}, 0},  //
      {{1, 1}, -1},       //
  };
  for (const Low& l : kLows)
    for (bool log_form : {false, true})
      for (auto& k : cases) {
        SCOPED_TRACE(std::string(l.name) + (log_form ? " log_softmax" : " softmax") + " of " + shape_str(k.shape) +
                     " axis " + std::to_string(k.axis));
        compare_with_cpu(
            [&](GpuCase& c) {
              Var x = low_param(c, l, "x", k.shape, -4, 4);
              return to_f32(log_form ? log_softmax(x, k.axis) : softmax(x, k.axis));
            },
            l.options());
      }
  // Large logits: the max is subtracted before exp at 16 bits too.
  for (const Low& l : kLows) {
    SCOPED_TRACE(std::string(l.name) + " large logits");
    compare_with_cpu(
        [&](GpuCase& c) {
          return to_f32(softmax(low_input(c, l, "x", {16, 300}, 100, 200)));
        },
        l.no_grad());
  }
}

// ---------------------------------------------------------------------------------------
// Shape ops: they move 16-bit elements (2 bytes, widened when aligned)

TEST(GpuPrecisionShape, TransposeConcatAndSliceMove16BitElements) {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> perms = {
      {{3, 7}, {1, 0}},
      {{999, 1027}, {1, 0}},            // tiled
      {{2, 3, 4, 5}, {0, 2, 3, 1}},     // tiled batch
      {{2, 3, 4, 5}, {1, 0, 2, 3}},     // innermost stays: a strided copy
      {{16, 8, 12, 64}, {0, 2, 1, 3}},  // rows of 64 values move in 16-byte units
      {{4, 1, 6}, {2, 1, 0}},
  };
  for (const Low& l : kLows) {
    for (auto& [shape, perm] : perms) {
      SCOPED_TRACE(std::string(l.name) + " " + shape_str(shape) + " permuted by " + shape_str(perm));
      compare_with_cpu([&](GpuCase& c) { return to_f32(permute(low_param(c, l, "x", shape), perm)); }, l.options());
    }
    SCOPED_TRACE(std::string(l.name) + " concat");
    compare_with_cpu(
        [&](GpuCase& c) {
          return to_f32(concat({low_param(c, l, "a", {3, 7}), low_param(c, l, "b", {3, 5})}, 1));
        },
        l.options());
    compare_with_cpu(
        [&](GpuCase& c) {
          return to_f32(concat(
              {low_param(c, l, "a", {64, 256}), low_param(c, l, "b", {64, 128}), low_param(c, l, "d", {64, 3})}, 1));
        },
        l.options());
    compare_with_cpu(
        [&](GpuCase& c) {
          return to_f32(concat({low_param(c, l, "a", {2, 3, 4}), low_param(c, l, "b", {1, 3, 4})}, 0));
        },
        l.options());
  }
  struct SliceCase {
    Shape shape;
    int64_t axis, start, end, step;
  };
  const std::vector<SliceCase> slices = {
      {{10, 129}, 1, 3, 100, 7},     {{10, 129}, 0, -4, 10, 1},    {{8, 16, 9, 9}, 2, 1, 9, 2},
      {{512, 1024}, 1, 256, 768, 1}, {{999, 1027}, 1, 1, 1025, 1}, {{3, 4, 64}, -1, 8, 40, 1},
  };
  for (const Low& l : kLows)
    for (auto& k : slices) {
      SCOPED_TRACE(std::string(l.name) + " slice of " + shape_str(k.shape) + " axis " + std::to_string(k.axis) + " [" +
                   std::to_string(k.start) + ":" + std::to_string(k.end) + ":" + std::to_string(k.step) + "]");
      compare_with_cpu(
          [&](GpuCase& c) { return to_f32(slice(low_param(c, l, "x", k.shape), k.axis, k.start, k.end, k.step)); },
          l.options());
    }
}

// ---------------------------------------------------------------------------------------
// Small ops

TEST(GpuPrecisionMisc, CastsBetweenEveryTypeMatchTheCpuBitForBit) {
  const std::vector<DType> floats = {DType::f32, DType::bf16, DType::f16};
  for (const Low& l : kLows)
    for (DType from : floats)
      for (DType to : floats)
        for (const Shape& s : {Shape{999}, Shape{37, 129}, Shape{1000, 1024}}) {
          SCOPED_TRACE(std::string(l.name) + " policy: " + dtype_name(from) + " -> " + dtype_name(to) + " of " +
                       shape_str(s));
          compare_with_cpu([&](GpuCase& c) { return to_f32(cast(cast(c.param("x", s, -3, 3), from), to)); }, l.exact());
        }
  for (const Low& l : kLows) {
    SCOPED_TRACE(l.name);
    CompareOptions no_grad = l.exact();
    no_grad.gradients = false;
    // f16 overflows to inf past 65520 alike on both sides, but the GPU must produce finite
    // values here: bf16 takes the large magnitudes, f16 its subnormals.
    if (l.dtype == DType::bf16)
      compare_with_cpu([&](GpuCase& c) { return to_f32(cast(c.data("x", {1000}, -1e6, 1e6), l.dtype)); }, no_grad);
    else
      compare_with_cpu([&](GpuCase& c) { return to_f32(cast(c.data("x", {999}, -1e-5, 1e-5), l.dtype)); }, no_grad);
    // 16 bits to and from the integer types: truncation toward zero, saturation, and
    // integers that 16 bits round (below f16's largest finite value).
    compare_with_cpu([&](GpuCase& c) { return cast(low_input(c, l, "x", {1001}, -300, 300), DType::i32); }, no_grad);
    compare_with_cpu(
        [&](GpuCase& c) { return cast(cast(low_input(c, l, "x", {1001}, -10, 300), DType::u8), DType::i32); }, no_grad);
    compare_with_cpu([&](GpuCase& c) { return to_f32(cast(c.labels("ids", {1000}, 60000), l.dtype)); }, no_grad);
    compare_with_cpu([&](GpuCase& c) { return to_f32(cast(cast(c.labels("ids", {100}, 256), DType::u8), l.dtype)); },
                     no_grad);
    // full in the 16-bit type.
    compare_with_cpu([&](GpuCase& c) { return to_f32(full(c.g, {4, 5}, 1.7, l.dtype)); }, no_grad);
    compare_with_cpu([&](GpuCase& c) { return to_f32(full(c.g, {1000, 1027}, -3.25, l.dtype)); }, no_grad);
  }
}

TEST(GpuPrecisionMisc, CopyMatchesTheCpu) {
  for (const Low& l : kLows) {
    SCOPED_TRACE(l.name);
    compare_with_cpu([&](GpuCase& c) { return to_f32(copy(low_param(c, l, "x", {33, 65}))); }, l.exact());
  }
}

TEST(GpuPrecisionMisc, ArgmaxReads16BitValues) {
  for (const Low& l : kLows) {
    SCOPED_TRACE(l.name);
    const CompareOptions o = l.no_grad();
    compare_with_cpu([&](GpuCase& c) { return argmax(cast(c.data("x", {37, 129}), l.dtype)); }, o);     // warp per row
    compare_with_cpu([&](GpuCase& c) { return argmax(cast(c.data("x", {37, 129}), l.dtype), 0); }, o);  // strided
    compare_with_cpu([&](GpuCase& c) { return argmax(cast(c.data("x", {4, 5, 6}), l.dtype), 1); }, o);
    compare_with_cpu([&](GpuCase& c) { return argmax(cast(c.data("x", {1000, 10}), l.dtype)); }, o);
    compare_with_cpu([&](GpuCase& c) { return argmax(cast(c.data("x", {3, 5000}), l.dtype)); }, o);
    // Ties, which rounding to 16 bits makes common: the first index of the largest wins.
    compare_with_cpu([&](GpuCase& c) { return argmax(low_input(c, l, "x", {64, 129}, 0, 1, 4)); }, o);
    compare_with_cpu([&](GpuCase& c) { return argmax(low_input(c, l, "x", {64, 40}, 0, 1, 4), 0); }, o);
    compare_with_cpu([&](GpuCase& c) { return argmax(low_input(c, l, "x", {16, 300}, -1, 1, 3)); }, o);
  }
}

TEST(GpuPrecisionMisc, DropoutMasksAreTheCpusBitForBit) {
  // The same Philox draws, the same f32 products of the same 16-bit values, rounded once.
  for (const Low& l : kLows) {
    for (const Shape& s : {Shape{64, 129}, Shape{999}, Shape{1000, 1027}, Shape{3}, Shape{7, 9}}) {
      SCOPED_TRACE(std::string(l.name) + " " + shape_str(s));
      compare_with_cpu([&](GpuCase& c) { return to_f32(dropout(low_param(c, l, "x", s), 0.3)); }, l.exact());
    }
    SCOPED_TRACE(std::string(l.name) + " two streams, evaluation");
    compare_with_cpu(
        [&](GpuCase& c) {
          Var x = low_param(c, l, "x", {33, 40});
          return to_f32(add(dropout(x, 0.5), dropout(x, 0.5)));
        },
        l.exact());
    CompareOptions eval = l.exact().in_mode(Mode::eval);
    eval.gradients = false;
    compare_with_cpu([&](GpuCase& c) { return to_f32(dropout(low_input(c, l, "x", {10, 10}, -1, 1), 0.5)); }, eval);
  }
}

TEST(GpuPrecisionMisc, EmbeddingAndItsGradientMatchTheCpu) {
  // Rows of 33 values (2-byte units), 64 and 128 (16-byte units), 12 (24 bytes: 2-byte
  // units); repeated ids add several rows of dy into one row of dweight, in f32, rounded
  // once.
  struct Case {
    Shape ids;
    int32_t rows;
    int64_t dim;
  };
  const std::vector<Case> cases = {{{5, 7}, 11, 33}, {{200}, 50, 64}, {{4, 64}, 3, 128}, {{9}, 7, 12}};
  for (const Low& l : kLows)
    for (auto& k : cases) {
      SCOPED_TRACE(std::string(l.name) + " ids " + shape_str(k.ids) + " of [" + std::to_string(k.rows) + ", " +
                   std::to_string(k.dim) + "]");
      compare_with_cpu(
          [&](GpuCase& c) {
            return to_f32(embedding(c.labels("ids", k.ids, k.rows), low_param(c, l, "w", {k.rows, k.dim})));
          },
          l.options());
    }
}

TEST(GpuPrecisionMisc, AccumulateAndCountEqualTake16BitScalars) {
  for (const Low& l : kLows) {
    SCOPED_TRACE(l.name);
    compare_with_cpu(
        [&](GpuCase& c) {
          Var acc = c.state("acc", {2}, Init::zeros());
          Var x = low_param(c, l, "x", {33, 9});
          Var total = sum(x);  // a 16-bit scalar
          accumulate(acc, {total, count_equal(c.labels("a", {50}, 3), c.labels("b", {50}, 3))});
          return to_f32(x);
        },
        l.options().with_runs(2));
  }
}

// A weight read by an embedding and by a projection (a language model's tied output
// layer): the projection's weight gradient written into the gradient buffer (in f32 under
// a 16-bit policy, from the GEMM) and the embedding's rows added into it
// (sums_into_embedding_grads), with atomics and sorted; rows 40 to 49 of the 50 are named
// by no id and keep the GEMM's part alone.
TEST(GpuPrecisionMisc, ATiedWeightsEmbeddingRowsAreAddedIntoItsProjectionsGradient) {
  std::vector<CompareOptions> options = {gpu_testing::f32(), gpu_testing::f32().fixed()};
  for (const Low& l : kLows) options.push_back(l.options()), options.push_back(l.options().fixed());
  for (const CompareOptions& o : options) {
    SCOPED_TRACE(std::string(precision_name(o.precision)) + (o.deterministic ? " sorted" : " atomics"));
    compare_with_cpu(
        [](GpuCase& c) {
          Var w = c.param("w", {50, 64});
          Var h = embedding(c.labels("ids", {4, 33}, 40), w);
          return nn::linear_tied(tanh(h), w, "head", false);
        },
        o);
  }
}

// ---------------------------------------------------------------------------------------
// Through the precision pass alone: plain f32 graphs of parameters, whose working copies
// the pass makes 16-bit (its outputs are its business, and compare_with_cpu's).

TEST(GpuPrecisionPolicy, PlainGraphsOfTheseOpsMatchTheCpu) {
  for (const Low& l : kLows) {
    SCOPED_TRACE(l.name);
    const CompareOptions o = l.options();
    compare_with_cpu([](GpuCase& c) { return gelu(add(c.param("x", {37, 129}), c.param("b", {129}))); }, o);
    compare_with_cpu([](GpuCase& c) { return mul(tanh(c.param("x", {999, 17})), c.param("s", {999, 1})); }, o);
    compare_with_cpu([](GpuCase& c) { return sum(c.param("x", {4099, 257}), {0}); }, o);
    compare_with_cpu([](GpuCase& c) { return mean(relu(c.param("x", {8, 16, 9, 9})), {0, 2, 3}); }, o);
    compare_with_cpu([](GpuCase& c) { return softmax(c.param("x", {37, 129}, -4, 4)); }, o);
    compare_with_cpu([](GpuCase& c) { return log_softmax(c.param("x", {5, 7, 33}, -4, 4), 1); }, o);
    compare_with_cpu([](GpuCase& c) { return permute(c.param("x", {2, 3, 4, 5}), {0, 2, 3, 1}); }, o);
    compare_with_cpu(
        [](GpuCase& c) {
          return concat({slice(c.param("a", {6, 40}), 1, 3, 30, 2), c.param("b", {6, 9})}, 1);
        },
        o);
    compare_with_cpu([](GpuCase& c) { return embedding(c.labels("ids", {200}, 50), c.param("w", {50, 64})); }, o);
    CompareOptions exact = o;
    exact.tol = Tolerance::exact();
    compare_with_cpu([](GpuCase& c) { return dropout(c.param("x", {64, 129}), 0.3); }, exact);
  }
}
