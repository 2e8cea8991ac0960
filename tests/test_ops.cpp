// Forward values of the elementwise, matmul, reduction, shape and small ops against
// direct references, on random inputs; dropout's statistics and reproducibility.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/half.h"
#include "seam/seam.h"
#include "test_util.h"

using namespace seam;

namespace {

std::vector<double> random_vec(size_t n, uint64_t seed, double lo = -2, double hi = 2) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Runs a forward program over f64 inputs fed by name; returns output `y`.
struct Runner {
  Graph g;
  std::vector<std::pair<std::string, std::vector<double>>> feeds;
  uint64_t seed = 1;
  Var in(const std::string& name, Shape s, double lo = -2, double hi = 2) {
    feeds.emplace_back(name, random_vec(static_cast<size_t>(numel(s)), seed++, lo, hi));
    return g.input(name, std::move(s), DType::f64);
  }
  const std::vector<double>& data(const std::string& name) {
    for (auto& [n, v] : feeds)
      if (n == name) return v;
    throw std::runtime_error("no feed " + name);
  }
  std::vector<double> run(Var y, Mode mode = Mode::eval) {
    Model m(g);
    Program p = m.compile({.mode = mode, .outputs = {y.id()}});
    for (auto& [n, v] : feeds) p.set_input(n, std::span<const double>(v));
    p.run();
    return p.read_as<double>(y.name());
  }
};

}  // namespace

TEST(ElementwiseForward, UnaryOpsMatchTheirFormulas) {
  struct Case {
    std::function<Var(Var)> op;
    std::function<double(double)> ref;
    double lo, hi;
  };
  const double k = std::sqrt(2 / M_PI);
  std::vector<Case> cases = {
      {[](Var x) { return relu(x); }, [](double x) { return x > 0 ? x : 0; }, -2, 2},
      {[](Var x) { return leaky_relu(x, 0.1); }, [](double x) { return x > 0 ? x : 0.1 * x; }, -2, 2},
      {[](Var x) { return sigmoid(x); }, [](double x) { return 1 / (1 + std::exp(-x)); }, -5, 5},
      {[](Var x) { return seam::tanh(x); }, [](double x) { return std::tanh(x); }, -3, 3},
      {[](Var x) { return gelu(x); }, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2))); }, -4, 4},
      {[](Var x) { return gelu(x, true); },
       [&](double x) { return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x))); }, -4, 4},
      {[](Var x) { return silu(x); }, [](double x) { return x / (1 + std::exp(-x)); }, -4, 4},
      {[](Var x) { return seam::exp(x); }, [](double x) { return std::exp(x); }, -3, 3},
      {[](Var x) { return seam::log(x); }, [](double x) { return std::log(x); }, 0.1, 5},
      {[](Var x) { return seam::sqrt(x); }, [](double x) { return std::sqrt(x); }, 0.1, 5},
      {[](Var x) { return seam::pow(x, 3.0); }, [](double x) { return x * x * x; }, -2, 2},
      {[](Var x) { return scale(x, 2.5); }, [](double x) { return 2.5 * x; }, -2, 2},
      {[](Var x) { return neg(x); }, [](double x) { return -x; }, -2, 2},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    Runner r;
    Var x = r.in("x", {7, 129}, cases[i].lo, cases[i].hi);
    auto y = r.run(cases[i].op(x));
    const auto& xs = r.data("x");
    for (size_t j = 0; j < y.size(); ++j) ASSERT_NEAR(y[j], cases[i].ref(xs[j]), 1e-12 * (1 + std::abs(y[j]))) << i;
  }
}

TEST(ElementwiseForward, BinaryBroadcastMatchesIndexArithmetic) {
  Runner r;
  Var a = r.in("a", {2, 1, 3});
  Var b = r.in("b", {7, 1}, 0.5, 2);
  auto y = r.run(div(a, b));  // [2, 7, 3]
  const auto &av = r.data("a"), &bv = r.data("b");
  ASSERT_EQ(y.size(), 42u);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 7; ++j)
      for (int k = 0; k < 3; ++k) ASSERT_DOUBLE_EQ(y[static_cast<size_t>((i * 7 + j) * 3 + k)], av[static_cast<size_t>(i * 3 + k)] / bv[static_cast<size_t>(j)]);
}

TEST(ElementwiseForward, Float32WithinItsPrecision) {
  Graph g;
  Var x = g.input("x", {129});
  Var y = gelu(x) * sigmoid(x);
  Model m(g);
  Program p = m.compile({.mode = Mode::eval, .outputs = {y.id()}});
  auto xd = random_vec(129, 3);
  std::vector<float> xf(xd.begin(), xd.end());
  p.set_input("x", std::span<const float>(xf));
  p.run();
  auto out = p.read_as<float>(y.name());
  for (size_t i = 0; i < xf.size(); ++i) {
    double v = xf[i], ref = 0.5 * v * (1 + std::erf(v / std::sqrt(2))) / (1 + std::exp(-v));
    EXPECT_NEAR(out[i], ref, 1e-5 * std::max(1.0, std::abs(ref)));
  }
}

TEST(MatmulForward, AllLayoutsAgainstNaiveLoops) {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (Shape batch : {Shape{}, Shape{3}}) {
        const int64_t m = 5, n = 7, k = 129;
        Runner r;
        Shape as = batch, bs = batch;
        as.push_back(ta ? k : m), as.push_back(ta ? m : k);
        bs.push_back(tb ? n : k), bs.push_back(tb ? k : n);
        if (!batch.empty() && tb) bs = {n, k};  // shared 2D weight with a batched input
        auto y = r.run(matmul(r.in("a", as), r.in("b", bs), ta, tb));
        const auto &A = r.data("a"), &B = r.data("b");
        int64_t nb = batch.empty() ? 1 : batch[0];
        for (int64_t q = 0; q < nb; ++q)
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double s = 0;
              for (int64_t l = 0; l < k; ++l) {
                double av = A[static_cast<size_t>(q * m * k + (ta ? l * m + i : i * k + l))];
                int64_t boff = bs.size() == 2 ? 0 : q * k * n;
                double bv = B[static_cast<size_t>(boff + (tb ? j * k + l : l * n + j))];
                s += av * bv;
              }
              ASSERT_NEAR(y[static_cast<size_t>((q * m + i) * n + j)], s, 1e-10) << ta << tb;
            }
      }
}

TEST(MatmulForward, LinearAddsTheBiasPerRow) {
  Runner r;
  Var x = r.in("x", {2, 3, 4}), w = r.in("w", {5, 4}), b = r.in("b", {5});
  auto y = r.run(linear(x, w, b));
  const auto &X = r.data("x"), &W = r.data("w"), &B = r.data("b");
  for (size_t row = 0; row < 6; ++row)
    for (size_t o = 0; o < 5; ++o) {
      double s = B[o];
      for (size_t i = 0; i < 4; ++i) s += X[row * 4 + i] * W[o * 4 + i];
      ASSERT_NEAR(y[row * 5 + o], s, 1e-12);
    }
}

// matmul_act_grad with dx_sums: dx = (dy w) * gelu'(pre) and dx's column sums, against
// the formula in double.
TEST(MatmulForward, ActivationGradientSumsItsColumns) {
  for (int64_t m : {5, 33}) {
    Runner r;
    Var dy = r.in("dy", {m, 6}), w = r.in("w", {6, 4}), pre = r.in("pre", {m, 4}, -3, 3);
    const auto out = r.g.add(Op::matmul_act_grad, {dy.id(), w.id(), pre.id()},
                             {{"act", std::string("gelu_tanh")}, {"dx_sums", int64_t{1}}});
    const auto sums = r.run(r.g.var(out[1]));
    ASSERT_EQ(sums.size(), 4u);
    const auto &DY = r.data("dy"), &W = r.data("w"), &P = r.data("pre");
    for (size_t j = 0; j < 4; ++j) {
      double want = 0;
      for (size_t i = 0; i < static_cast<size_t>(m); ++i) {
        double g = 0;
        for (size_t o = 0; o < 6; ++o) g += DY[i * 6 + o] * W[o * 4 + j];
        const double x = P[i * 4 + j], c = std::sqrt(2 / M_PI), t = std::tanh(c * (x + 0.044715 * x * x * x));
        want += g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x));
      }
      EXPECT_NEAR(sums[j], want, 1e-12) << "m = " << m << ", column " << j;
    }
  }
}

// linear_grad_input_bias: dx = dy w and dy's column sums, against the formula in double
// on the values the inputs hold (f32 ones rounded from the draws); db in f64 from f32
// inputs too (sums_dtype).
TEST(MatmulForward, InputGradientSumsDyColumns) {
  struct Case {
    DType t;
    std::string sums;
    double dx_tol, db_tol;
  };
  constexpr size_t n = 6, k = 4;
  for (const Case& c : {Case{DType::f64, "", 1e-12, 1e-12}, Case{DType::f32, "", 1e-4, 1e-4},
                        Case{DType::f32, "f64", 1e-4, 1e-12}})
    for (size_t m : {5, 33}) {
      SCOPED_TRACE(std::string(dtype_name(c.t)) + " sums '" + c.sums + "', m = " + std::to_string(m));
      std::vector<double> dyv = random_vec(m * n, 1), wv = random_vec(n * k, 2);
      Graph g;
      Var dy = g.input("dy", {static_cast<int64_t>(m), n}, c.t), w = g.input("w", {n, k}, c.t);
      const auto out = g.add(Op::linear_grad_input_bias, {dy.id(), w.id()}, {{"sums_dtype", c.sums}});
      EXPECT_EQ(g.value(out[1]).type.dtype, c.sums == "f64" ? DType::f64 : c.t);
      Model model(g);
      Program p = model.compile({.mode = Mode::eval, .outputs = {out[0], out[1]}});
      for (auto [name, v] : {std::pair{"dy", &dyv}, std::pair{"w", &wv}}) {
        if (c.t == DType::f64) {
          p.set_input(name, std::span<const double>(*v));
          continue;
        }
        const std::vector<float> f(v->begin(), v->end());
        v->assign(f.begin(), f.end());  // the reference reads what the op reads
        p.set_input(name, std::span<const float>(f));
      }
      p.run();
      auto read = [&](ValueId v) {
        const std::string& name = g.value(v).name;
        if (g.value(v).type.dtype == DType::f64) return p.read_as<double>(name);
        const auto f = p.read_as<float>(name);
        return std::vector<double>(f.begin(), f.end());
      };
      const auto dx = read(out[0]), db = read(out[1]);
      ASSERT_EQ(dx.size(), m * k);
      ASSERT_EQ(db.size(), n);
      for (size_t i = 0; i < m; ++i)
        for (size_t j = 0; j < k; ++j) {
          double want = 0;
          for (size_t o = 0; o < n; ++o) want += dyv[i * n + o] * wv[o * k + j];
          EXPECT_NEAR(dx[i * k + j], want, c.dx_tol) << "dx[" << i << ", " << j << "]";
        }
      for (size_t o = 0; o < n; ++o) {
        double want = 0;
        for (size_t i = 0; i < m; ++i) want += dyv[i * n + o];
        EXPECT_NEAR(db[o], want, c.db_tol) << "db[" << o << "]";
      }
    }
}

TEST(ReduceForward, SumAndMeanOverAxes) {
  Runner r;
  Var x = r.in("x", {3, 4, 5});
  Var sv = sum(x, {0, 2}), mv = mean(x, {-1}, true);
  auto s = r.run(sv);
  auto mn = r.run(mv);
  const auto& X = r.data("x");
  for (int j = 0; j < 4; ++j) {
    double ref = 0;
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 5; ++k) ref += X[static_cast<size_t>((i * 4 + j) * 5 + k)];
    EXPECT_NEAR(s[static_cast<size_t>(j)], ref, 1e-12);
  }
  ASSERT_EQ(mn.size(), 12u);
  for (int i = 0; i < 12; ++i) {
    double ref = 0;
    for (int k = 0; k < 5; ++k) ref += X[static_cast<size_t>(i * 5 + k)];
    EXPECT_NEAR(mn[static_cast<size_t>(i)], ref / 5, 1e-12);
  }
}

TEST(ShapeForward, PermuteConcatSlice) {
  Runner r;
  Var x = r.in("x", {2, 3, 4});
  auto p = r.run(permute(x, {2, 0, 1}));  // [4, 2, 3]
  const auto& X = r.data("x");
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) ASSERT_EQ(p[static_cast<size_t>((k * 2 + i) * 3 + j)], X[static_cast<size_t>((i * 3 + j) * 4 + k)]);
  Runner c;
  Var a = c.in("a", {2, 1}), b = c.in("b", {2, 3});
  auto y = c.run(concat({a, b}, 1));
  EXPECT_EQ(y, (std::vector<double>{c.data("a")[0], c.data("b")[0], c.data("b")[1], c.data("b")[2], c.data("a")[1],
                                    c.data("b")[3], c.data("b")[4], c.data("b")[5]}));
  Runner s;
  Var v = s.in("v", {10});
  auto sl = s.run(slice(v, 0, -8, 9, 3));  // elements 2, 5, 8
  EXPECT_EQ(sl, (std::vector<double>{s.data("v")[2], s.data("v")[5], s.data("v")[8]}));
}

TEST(MiscForward, ArgmaxTakesTheFirstOfTies) {
  Graph g;
  Var x = g.input("x", {2, 4});
  Var i = argmax(x);
  Model m(g);
  Program p = m.compile({.mode = Mode::eval, .outputs = {i.id()}});
  std::vector<float> v{1, 5, 5, 2, -1, -3, -0.5f, -0.5f};
  p.set_input("x", std::span<const float>(v));
  p.run();
  EXPECT_EQ(p.read_as<int32_t>(i.name()), (std::vector<int32_t>{1, 2}));
}

TEST(MiscForward, CastRoundsToNearestEvenAndSaturatesIntegers) {
  Graph g;
  Var x = g.input("x", {6});
  Var b = cast(x, DType::bf16), h = cast(x, DType::f16), u = cast(x, DType::u8);
  Var back = cast(b, DType::f32);
  Model m(g);
  Program p = m.compile({.mode = Mode::eval, .outputs = {b.id(), h.id(), u.id(), back.id()}});
  // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0); 1 + 3*2^-8 rounds up.
  std::vector<float> v{1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 300.5f, -4.0f, 65519.0f, 1e-7f};
  p.set_input("x", std::span<const float>(v));
  p.run();
  auto bb = p.read_as<uint16_t>(b.name());
  EXPECT_EQ(bf16_to_float(bb[0]), 1.0f);
  EXPECT_EQ(bf16_to_float(bb[1]), 1.0f + 4.0f / 256);
  auto hh = p.read_as<uint16_t>(h.name());
  EXPECT_EQ(f16_to_float(hh[2]), 300.5f);
  EXPECT_EQ(f16_to_float(hh[4]), 65504.0f);
  EXPECT_NEAR(f16_to_float(hh[5]), 1e-7, 3e-8);  // subnormal
  EXPECT_EQ(p.read_as<uint8_t>(u.name()), (std::vector<uint8_t>{1, 1, 255, 0, 255, 0}));
  EXPECT_EQ(p.read_as<float>(back.name())[3], -4.0f);
}

TEST(MiscForward, EmbeddingLooksUpRowsAndRejectsBadIds) {
  Graph g;
  Var ids = g.input("ids", {3}, DType::i32);
  Var w = g.param("w", {4, 2}, Init::uniform(-1, 1));
  Var y = embedding(ids, w);
  Model m(g);
  Program p = m.compile({.mode = Mode::eval, .outputs = {y.id()}});
  std::vector<int32_t> good{3, 0, 3};
  p.set_input("ids", std::span<const int32_t>(good));
  p.run();
  auto wv = Program::cast_bytes<float>(m.read_param("w"));
  EXPECT_EQ(p.read_as<float>(y.name()), (std::vector<float>{wv[6], wv[7], wv[0], wv[1], wv[6], wv[7]}));
  std::vector<int32_t> bad{0, 4, 1};
  p.set_input("ids", std::span<const int32_t>(bad));
  try {
    p.run();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 4 at position 1"), std::string::npos) << e.what();
  }
}

// embedding_grad's addend (a tied weight's other gradient): the rows added into it, in
// its dtype; a wrong shape or dtype is refused by name.
TEST(MiscForward, EmbeddingGradientAddsItsRowsIntoAnAddend) {
  Graph g;
  Var dy = g.input("dy", {3, 2});
  Var ids = g.input("ids", {3}, DType::i32);
  Var acc = g.input("acc", {4, 2});
  Var dw = g.var(g.add1(Op::embedding_grad, {dy.id(), ids.id(), acc.id()}, {{"num", int64_t{4}}}).id());
  Model m(g);
  Program p = m.compile({.mode = Mode::eval, .outputs = {dw.id()}});
  const std::vector<float> d{1, 2, 3, 4, 5, 6}, a{10, 20, 30, 40, 50, 60, 70, 80};
  const std::vector<int32_t> rows{3, 0, 3};
  p.set_input("dy", std::span<const float>(d));
  p.set_input("ids", std::span<const int32_t>(rows));
  p.set_input("acc", std::span<const float>(a));
  p.run();
  EXPECT_EQ(p.read_as<float>(dw.name()), (std::vector<float>{13, 24, 30, 40, 50, 60, 76, 88}));
  auto error_of = [&](Shape shape, DType t) {
    return seam::testing::error_of([&] {
      g.add(Op::embedding_grad, {dy.id(), ids.id(), g.input("a" + std::to_string(g.values().size()), shape, t).id()},
            {{"num", int64_t{4}}});
    });
  };
  EXPECT_NE(error_of({5, 2}, DType::f32).find("acc must have dweight's shape [4,2], got [5,2]"), std::string::npos)
      << error_of({5, 2}, DType::f32);
  EXPECT_NE(error_of({4, 2}, DType::bf16).find("acc must have dy's dtype or the one it computes in (f32), got bf16"),
            std::string::npos)
      << error_of({4, 2}, DType::bf16);
}

TEST(Dropout, DropsAboutPScalesTheRestAndIsReproducible) {
  Graph g;
  Var x = g.input("x", {200, 100});
  Var y = dropout(x, 0.3), z = dropout(x, 0.3);
  Var loss = sum(y);
  std::vector<float> ones(20000, 1.0f);
  auto run_once = [&](uint64_t seed, int64_t step) {
    Model m(g, {.seed = seed});
    m.state().step = step;
    Program p = m.compile({.mode = Mode::train, .outputs = {y.id(), z.id()}});
    p.set_input("x", std::span<const float>(ones));
    p.run();
    return std::pair{p.read_as<float>(y.name()), p.read_as<float>(z.name())};
  };
  auto [a, a2] = run_once(1, 0);
  size_t zeros = 0;
  for (float v : a) {
    if (v == 0) ++zeros;
    else ASSERT_FLOAT_EQ(v, 1.0f / 0.7f);
  }
  EXPECT_NEAR(static_cast<double>(zeros) / 20000, 0.3, 0.015);
  EXPECT_EQ(run_once(1, 0).first, a);   // same seed and step: same mask
  EXPECT_NE(run_once(1, 1).first, a);   // the next step draws a new mask
  EXPECT_NE(run_once(2, 0).first, a);   // another seed too
  EXPECT_NE(a2, a);                     // and so does another dropout node
  Model m(g);
  Program eval = m.compile({.mode = Mode::eval, .outputs = {y.id()}});
  eval.set_input("x", std::span<const float>(ones));
  eval.run();
  EXPECT_EQ(eval.read_as<float>(y.name()), ones);  // identity in evaluation
  (void)loss;
}

TEST(MiscForward, CountEqualSkipsIgnoredLabelsAndAccumulateSumsOnlyInTraining) {
  Graph g;
  Var pred = g.input("pred", {5}, DType::i32);
  Var labels = g.input("labels", {5}, DType::i32);
  Var v = g.input("v", {});
  Var n = count_equal(pred, labels);
  Var acc = g.state("acc", {2}, Init::zeros());
  accumulate(acc, {v, n});  // no output reads it: the plan keeps it for its effect
  std::vector<int32_t> p{1, 2, 3, 4, 5}, l{1, 0, 3, -100, 5};
  std::vector<float> val{0.25f};
  for (Mode mode : {Mode::train, Mode::eval}) {
    Model m(g);
    Program prog = m.compile({.mode = mode, .outputs = {n.id()}});
    prog.set_input("pred", std::span<const int32_t>(p));
    prog.set_input("labels", std::span<const int32_t>(l));
    prog.set_input("v", std::span<const float>(val));
    prog.run();
    prog.run();
    EXPECT_EQ(prog.read_as<int32_t>(n.name())[0], 3);
    auto a = Program::cast_bytes<float>(m.read_state("acc"));
    if (mode == Mode::train) EXPECT_EQ(a, (std::vector<float>{0.5f, 6.0f}));
    else EXPECT_EQ(a, (std::vector<float>{0.0f, 0.0f}));
  }
}
