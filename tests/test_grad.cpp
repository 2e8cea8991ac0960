// Every op's gradient against central finite differences in double, on random inputs,
// with broadcasting and awkward sizes (1, 3, 7, 129).
#include <gtest/gtest.h>

#include <cmath>

#include "grad_check.h"

using namespace seam;
using seam::testing::check_gradients;
using seam::testing::GradCase;
using seam::testing::GradCheckOptions;

namespace {

struct UnaryCase {
  const char* name;
  std::function<Var(Var)> f;
  double lo, hi;  // input range where the op is smooth
};

const UnaryCase kUnary[] = {
    {"relu", [](Var x) { return relu(x); }, -1, 1},
    {"leaky_relu", [](Var x) { return leaky_relu(x, 0.2); }, -1, 1},
    {"sigmoid", [](Var x) { return sigmoid(x); }, -3, 3},
    {"tanh", [](Var x) { return seam::tanh(x); }, -3, 3},
    {"gelu", [](Var x) { return gelu(x); }, -3, 3},
    {"gelu_tanh", [](Var x) { return gelu(x, true); }, -3, 3},
    {"silu", [](Var x) { return silu(x); }, -3, 3},
    {"exp", [](Var x) { return seam::exp(x); }, -2, 2},
    {"log", [](Var x) { return seam::log(x); }, 0.2, 3},
    {"sqrt", [](Var x) { return seam::sqrt(x); }, 0.2, 3},
    {"pow", [](Var x) { return seam::pow(x, 2.5); }, 0.2, 2},
    {"scale", [](Var x) { return scale(x, -1.7); }, -1, 1},
    {"neg", [](Var x) { return neg(x); }, -1, 1},
    {"abs", [](Var x) { return seam::abs(x); }, -1, 1},
    {"erf", [](Var x) { return seam::erf(x); }, -2, 2},
};

}  // namespace

class UnaryGrad : public ::testing::TestWithParam<std::tuple<int, Shape>> {};

TEST_P(UnaryGrad, MatchesFiniteDifferences) {
  auto [k, shape] = GetParam();
  const UnaryCase& u = kUnary[k];
  SCOPED_TRACE(u.name);
  check_gradients([&](GradCase& c) { return u.f(c.param("x", shape, u.lo, u.hi)); });
}

INSTANTIATE_TEST_SUITE_P(AllUnary, UnaryGrad,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kUnary))),
                                            ::testing::Values(Shape{1}, Shape{3, 7}, Shape{129})));

TEST(BinaryGrad, BroadcastingAllOps) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 7}, {3, 7}}, {{3, 7}, {7}}, {{3, 1}, {1, 7}}, {{1}, {2, 3, 7}}, {{129}, {1}}, {{2, 1, 3}, {7, 1}}};
  for (auto& [sa, sb] : shapes) {
    for (int op = 0; op < 6; ++op) {
      SCOPED_TRACE(shape_str(sa) + " op " + std::to_string(op) + " " + shape_str(sb));
      check_gradients([&](GradCase& c) {
        Var a = c.param("a", sa, 0.5, 2), b = c.param("b", sb, -2, -0.5);
        switch (op) {
          case 0: return add(a, b);
          case 1: return sub(a, b);
          case 2: return mul(a, b);
          case 3: return div(a, b);
          case 4: return maximum(a, neg(b) * 0.9);
          default: return minimum(a, neg(b) * 1.1);
        }
      });
    }
  }
}

TEST(BinaryGrad, SameValueOnBothSidesAccumulates) {
  check_gradients([](GradCase& c) {
    Var x = c.param("x", {3, 7});
    return mul(x, x) + x;
  });
}

TEST(MatmulGrad, TwoDimensionalAllTransposes) {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE("ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
      check_gradients([&](GradCase& c) {
        Var a = c.param("a", ta ? Shape{7, 3} : Shape{3, 7});
        Var b = c.param("b", tb ? Shape{5, 7} : Shape{7, 5});
        return matmul(a, b, ta, tb);
      });
    }
}

TEST(MatmulGrad, BatchedInputSharedWeight) {
  for (int tb = 0; tb < 2; ++tb)
    check_gradients([&](GradCase& c) {
      Var a = c.param("a", {2, 3, 7});
      Var b = c.param("b", tb ? Shape{1, 7} : Shape{7, 1});
      return matmul(a, b, false, tb);
    });
}

TEST(MatmulGrad, BatchedBothAndBroadcastBatch) {
  check_gradients([](GradCase& c) {
    return matmul(c.param("a", {2, 3, 7}), c.param("b", {2, 5, 7}), false, true);
  });
  check_gradients([](GradCase& c) {
    return matmul(c.param("a", {2, 1, 7, 3}), c.param("b", {3, 7, 5}), true, false);
  });
}

TEST(LinearGrad, WithAndWithoutBias) {
  check_gradients([](GradCase& c) {
    return linear(c.param("x", {3, 7}), c.param("w", {5, 7}), c.param("b", {5}));
  });
  check_gradients([](GradCase& c) { return linear(c.param("x", {2, 3, 7}), c.param("w", {1, 7})); });
  check_gradients([](GradCase& c) { return linear(c.param("x", {129}), c.param("w", {3, 129}), c.param("b", {3})); });
}

TEST(ReduceGrad, SumAndMeanOverAxes) {
  for (bool keep : {false, true})
    for (auto axes : std::vector<std::vector<int64_t>>{{}, {0}, {1}, {-1}, {0, 2}}) {
      check_gradients([&](GradCase& c) { return sum(c.param("x", {3, 7, 2}), axes, keep); });
      check_gradients([&](GradCase& c) { return mean(c.param("x", {3, 7, 2}), axes, keep); });
    }
}

TEST(ReduceGrad, BroadcastTo) {
  check_gradients([](GradCase& c) { return broadcast_to(c.param("x", {3, 1}), {2, 3, 7}); });
}

TEST(ShapeGrad, ReshapeFlattenTransposePermute) {
  check_gradients([](GradCase& c) { return mul(reshape(c.param("x", {3, 7}), {7, -1}), c.data("d", {7, 3})); });
  check_gradients([](GradCase& c) { return seam::tanh(flatten(c.param("x", {2, 3, 7}))); });
  check_gradients([](GradCase& c) { return transpose(c.param("x", {3, 7})); });
  check_gradients([](GradCase& c) { return permute(c.param("x", {2, 3, 7}), {2, 0, 1}); });
}

TEST(ShapeGrad, ConcatAndSlice) {
  check_gradients([](GradCase& c) {
    return concat({c.param("a", {3, 2}), c.param("b", {3, 7}), c.param("c", {3, 1})}, 1);
  });
  check_gradients([](GradCase& c) { return slice(c.param("x", {7, 3}), 0, 1, 6, 2); });
  check_gradients([](GradCase& c) { return slice(c.param("x", {3, 129}), -1, -100, -1); });
}

TEST(MiscGrad, CopyCastAndStopGradient) {
  check_gradients([](GradCase& c) { return copy(c.param("x", {3, 7})); });
}

TEST(MiscGrad, CastPassesTheGradientBackInTheInputsDtype) {
  // Through f32 and back: the forward rounds to f32, a staircase at fine steps, so the
  // function is kept linear in x and differenced over a step far above f32's rounding
  // (its error ~ 6e-8 / 1e-2).
  GradCheckOptions o;
  o.step = 1e-2;
  o.rtol = 1e-4;
  o.atol = 1e-6;
  EXPECT_GT(check_gradients(
                [](GradCase& c) {
                  Var x = c.param("x", {3, 7}), w = c.param("w", {7}, 0.5, 1.5);
                  return mul(cast(cast(x, DType::f32), DType::f64), w);
                },
                o),
            0u);
  // Into an integer type: no gradient flows (the value is a staircase everywhere).
  Graph g;
  Var x = g.param("x", {4}, Init::uniform(-3, 3), true, DType::f64);
  Var y = sum(mul(cast(cast(x, DType::i32), DType::f64), x));
  Model m(g, {.seed = 1});
  Program p = m.compile({.loss = y.id(), .gradients = true});
  p.run();
  const auto xv = Program::cast_bytes<double>(m.read_param("x"));
  const auto gx = p.grad_as<double>("x");
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(gx[i], std::trunc(xv[i])) << i;  // only the direct use of x
}

TEST(MiscGrad, StopGradientBlocksOnlyItsBranch) {
  // d/dx sum(x * stop(exp(x))) = exp(x): the stopped branch gives a value, no gradient.
  Graph g;
  Var x = g.param("x", {3, 7}, Init::uniform(-1, 1), true, DType::f64);
  Var loss = sum(mul(x, stop_gradient(seam::exp(x))));
  Model m(g, {.seed = 5});
  Program p = m.compile({.loss = loss.id(), .gradients = true});
  p.run();
  auto xs = Program::cast_bytes<double>(m.read_param("x"));
  auto gx = p.grad_as<double>("x");
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(gx[i], std::exp(xs[i]), 1e-12);
}

TEST(MiscGrad, NoGradientIntoStoppedOrIntegerValues) {
  Graph g;
  Var w = g.param("w", {4}, Init::ones(), true, DType::f64);
  g.param("unused", {2}, Init::ones(), true, DType::f64);
  Var loss = sum(stop_gradient(w) * 2.0);
  Model m(g);
  Program p = m.compile({.loss = loss.id(), .gradients = true});
  p.run();
  for (double v : p.grad_as<double>("w")) EXPECT_EQ(v, 0.0);
  for (double v : p.grad_as<double>("unused")) EXPECT_EQ(v, 0.0);
}

TEST(MiscGrad, EmbeddingWithRepeatedIds) {
  check_gradients([](GradCase& c) {
    Var ids = c.labels("ids", {3, 7}, 5);  // 21 lookups into 5 rows: rows repeat
    return embedding(ids, c.param("w", {5, 3}));
  });
}

TEST(MiscGrad, DropoutUsesTheSameMaskInBackward) {
  check_gradients([](GradCase& c) { return dropout(c.param("x", {7, 129}), 0.3); });
}
