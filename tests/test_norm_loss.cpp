// The softmax, loss and normalization families: forward values against references
// written out here from PyTorch's definitions (f64, plus one f32 case per family),
// gradients against finite differences, and a bad label failing the run.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "grad_check.h"
#include "test_util.h"
#include "seam/seam.h"

using namespace seam;
using seam::testing::check_gradients;
using seam::testing::GradCase;
using seam::testing::GradCheckOptions;
using seam::testing::random_labels;

namespace {

// Random values in [lo, hi), away from zero so no element is trivially neutral.
std::vector<double> random_values(size_t n, uint64_t seed, double lo = -2, double hi = 2) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& e : v) {
    do e = d(rng);
    while (std::abs(e) < 1e-3);
  }
  return v;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }
std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Field by field: designated initializers that skip members trip -Wmissing-field-initializers.
CompileOptions forward(Mode mode, std::vector<ValueId> outputs) {
  CompileOptions o;
  o.mode = mode;
  o.outputs = std::move(outputs);
  return o;
}

std::vector<double> read_param(const Model& m, const std::string& name) {
  return Program::cast_bytes<double>(m.read_param(name));
}
std::vector<double> read_state(const Model& m, const std::string& name) {
  return Program::cast_bytes<double>(m.read_state(name));
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                     double atol = 1e-12) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << "element " << i;
}

// ---- references ----

// Softmax (or log-softmax) of x along `axis`, from the definition.
std::vector<double> ref_softmax(const std::vector<double>& x, const Shape& s, int64_t axis, bool log) {
  const auto ax = static_cast<size_t>(normalize_axis(axis, s.size()));
  int64_t inner = 1;
  for (size_t d = ax + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t len = s[ax];
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    // The lane of element i: same index on every dim but `axis`.
    const int64_t j = static_cast<int64_t>(i) / inner % len;
    const int64_t first = static_cast<int64_t>(i) - j * inner;
    double denom = 0;
    for (int64_t k = 0; k < len; ++k) denom += std::exp(x[static_cast<size_t>(first + k * inner)]);
    y[i] = log ? x[i] - std::log(denom) : std::exp(x[i]) / denom;
  }
  return y;
}

double ref_cross_entropy(const std::vector<double>& logits, const std::vector<int32_t>& labels, int64_t classes,
                         int64_t ignore_index, double smoothing) {
  double total = 0;
  int count = 0;
  for (size_t r = 0; r < labels.size(); ++r) {
    if (labels[r] == ignore_index) continue;
    const double* z = &logits[r * static_cast<size_t>(classes)];
    double denom = 0;
    for (int64_t c = 0; c < classes; ++c) denom += std::exp(z[c]);
    double mean_nll = 0;
    for (int64_t c = 0; c < classes; ++c) mean_nll += (std::log(denom) - z[c]) / static_cast<double>(classes);
    total += (1 - smoothing) * (std::log(denom) - z[labels[r]]) + smoothing * mean_nll;
    ++count;
  }
  return count ? total / count : 0.0;
}

struct NormRef {
  std::vector<double> y, mean, invstd, var_unbiased;
};

NormRef ref_layer_norm(const std::vector<double>& x, const std::vector<double>& gamma,
                       const std::vector<double>& beta, double eps) {
  const size_t dim = gamma.size(), rows = x.size() / dim;
  NormRef r{std::vector<double>(x.size()), {}, {}, {}};
  for (size_t i = 0; i < rows; ++i) {
    double mean = 0, var = 0;
    for (size_t j = 0; j < dim; ++j) mean += x[i * dim + j] / static_cast<double>(dim);
    for (size_t j = 0; j < dim; ++j) var += std::pow(x[i * dim + j] - mean, 2) / static_cast<double>(dim);
    for (size_t j = 0; j < dim; ++j)
      r.y[i * dim + j] = (x[i * dim + j] - mean) / std::sqrt(var + eps) * gamma[j] + beta[j];
    r.mean.push_back(mean);
    r.invstd.push_back(1 / std::sqrt(var + eps));
  }
  return r;
}

// Batch norm of x [N, C, H*W...] with batch statistics (training) or given ones.
NormRef ref_batch_norm(const std::vector<double>& x, const Shape& s, const std::vector<double>& gamma,
                       const std::vector<double>& beta, double eps, const std::vector<double>* mean_in = nullptr,
                       const std::vector<double>* var_in = nullptr) {
  const size_t n = static_cast<size_t>(s[0]), ch = static_cast<size_t>(s[1]);
  const size_t inner = x.size() / (n * ch), count = n * inner;
  auto at = [&](size_t b, size_t c, size_t k) { return (b * ch + c) * inner + k; };
  NormRef r{std::vector<double>(x.size()), {}, {}, {}};
  for (size_t c = 0; c < ch; ++c) {
    double mean = 0, ss = 0;
    for (size_t b = 0; b < n; ++b)
      for (size_t k = 0; k < inner; ++k) mean += x[at(b, c, k)] / static_cast<double>(count);
    for (size_t b = 0; b < n; ++b)
      for (size_t k = 0; k < inner; ++k) ss += std::pow(x[at(b, c, k)] - mean, 2);
    double var = ss / static_cast<double>(count);
    r.var_unbiased.push_back(ss / static_cast<double>(count - 1));
    if (mean_in) mean = (*mean_in)[c], var = (*var_in)[c];
    for (size_t b = 0; b < n; ++b)
      for (size_t k = 0; k < inner; ++k)
        r.y[at(b, c, k)] = (x[at(b, c, k)] - mean) / std::sqrt(var + eps) * gamma[c] + beta[c];
    r.mean.push_back(mean);
    r.invstd.push_back(1 / std::sqrt(var + eps));
  }
  return r;
}

// Runs softmax or log_softmax of a fed f64 or f32 tensor; returns the output as double.
std::vector<double> run_softmax(const std::vector<double>& x, const Shape& s, int64_t axis, bool log,
                                DType dtype = DType::f64) {
  Graph g;
  Var in = g.input("x", s, dtype);
  Var y = log ? log_softmax(in, axis) : softmax(in, axis);
  Model m(g);
  Program p = m.compile(forward(Mode::eval, {y.id()}));
  if (dtype == DType::f64) {
    p.set_input("x", std::span<const double>(x));
    p.run();
    return p.read_as<double>(y.name());
  }
  auto xf = to_float(x);
  p.set_input("x", std::span<const float>(xf));
  p.run();
  return to_double(p.read_as<float>(y.name()));
}

// Runs cross_entropy on fed logits and labels.
double run_cross_entropy(const std::vector<double>& logits, const Shape& s, const std::vector<int32_t>& labels,
                         int64_t ignore_index, double smoothing, DType dtype = DType::f64) {
  Graph g;
  Var z = g.input("logits", s, dtype);
  Var l = g.input("labels", Shape(s.begin(), s.end() - 1), DType::i32);
  Var loss = cross_entropy(z, l, ignore_index, smoothing);
  Model m(g);
  Program p = m.compile(forward(Mode::eval, {loss.id()}));
  p.set_input("labels", std::span<const int32_t>(labels));
  if (dtype == DType::f64) {
    p.set_input("logits", std::span<const double>(logits));
    p.run();
    return p.read_as<double>(loss.name()).at(0);
  }
  auto zf = to_float(logits);
  p.set_input("logits", std::span<const float>(zf));
  p.run();
  return p.read_as<float>(loss.name()).at(0);
}

}  // namespace

// ---------------------------------------------------------------- softmax

TEST(Softmax, ForwardMatchesReferenceOnEveryAxis) {
  const Shape s{3, 7, 5};
  auto x = random_values(105, 1);
  for (bool log : {false, true})
    for (int64_t axis : {0, 1, 2, -1}) {
      SCOPED_TRACE((log ? "log_softmax axis " : "softmax axis ") + std::to_string(axis));
      expect_near_all(run_softmax(x, s, axis, log), ref_softmax(x, s, axis, log), 1e-13);
    }
  auto w = random_values(129, 2);
  for (bool log : {false, true})
    for (int64_t axis : {0, -1}) {
      SCOPED_TRACE((log ? "log_softmax [1,129] axis " : "softmax [1,129] axis ") + std::to_string(axis));
      expect_near_all(run_softmax(w, {1, 129}, axis, log), ref_softmax(w, {1, 129}, axis, log), 1e-13);
    }
}

TEST(Softmax, LargeLogitsStayFinite) {
  // exp(1000) overflows a double: only a max-shifted kernel gets these right.
  std::vector<double> x = {1000, 999, 998, -1000};
  auto y = run_softmax(x, {4}, 0, false);
  auto ly = run_softmax(x, {4}, 0, true);
  const double denom = 1 + std::exp(-1.0) + std::exp(-2.0);
  EXPECT_NEAR(y[0], 1 / denom, 1e-15);
  EXPECT_EQ(y[3], 0.0);
  EXPECT_NEAR(ly[2], -2 - std::log(denom), 1e-12);
  EXPECT_NEAR(ly[3], -2000 - std::log(denom), 1e-9);
}

TEST(Softmax, Float32MatchesReference) {
  const Shape s{3, 7, 5};
  auto x = to_double(to_float(random_values(105, 3)));
  for (bool log : {false, true})
    expect_near_all(run_softmax(x, s, 1, log, DType::f32), ref_softmax(x, s, 1, log), 1e-5, 1e-7);
}

TEST(Softmax, GradMatchesFiniteDifferences) {
  const std::vector<std::pair<Shape, int64_t>> cases = {
      {{1}, 0}, {{3}, 0}, {{7}, -1}, {{129}, 0}, {{3, 7, 5}, 0}, {{3, 7, 5}, 1}, {{3, 7, 5}, -1}, {{1, 129}, 0}};
  for (auto& [shape, axis] : cases)
    for (bool log : {false, true}) {
      SCOPED_TRACE(shape_str(shape) + (log ? " log_softmax axis " : " softmax axis ") + std::to_string(axis));
      check_gradients([&](GradCase& c) {
        Var x = c.param("x", shape, -2, 2);
        return log ? log_softmax(x, axis) : softmax(x, axis);
      });
    }
}

// ---------------------------------------------------------------- losses

TEST(Loss, CrossEntropyForwardMatchesReference) {
  const int64_t classes = 5;
  auto logits = random_values(6 * classes, 4);
  auto labels = random_labels(6, classes, 5);
  EXPECT_NEAR(run_cross_entropy(logits, {6, classes}, labels, -100, 0),
              ref_cross_entropy(logits, labels, classes, -100, 0), 1e-13);

  auto ignored = labels;
  ignored[1] = ignored[4] = -100;
  EXPECT_NEAR(run_cross_entropy(logits, {6, classes}, ignored, -100, 0),
              ref_cross_entropy(logits, ignored, classes, -100, 0), 1e-13);

  // A custom ignore index; -100 is then an out-of-range label, so not used here.
  auto custom = labels;
  custom[0] = 2;
  EXPECT_NEAR(run_cross_entropy(logits, {6, classes}, custom, 2, 0.1),
              ref_cross_entropy(logits, custom, classes, 2, 0.1), 1e-13);

  EXPECT_NEAR(run_cross_entropy(logits, {6, classes}, ignored, -100, 0.1),
              ref_cross_entropy(logits, ignored, classes, -100, 0.1), 1e-13);

  std::vector<int32_t> all_ignored(6, -100);
  EXPECT_EQ(run_cross_entropy(logits, {6, classes}, all_ignored, -100, 0.1), 0.0);
}

TEST(Loss, CrossEntropyOverSequences) {
  const int64_t b = 2, t = 3, classes = 7;
  auto logits = random_values(static_cast<size_t>(b * t * classes), 6);
  auto labels = random_labels(static_cast<size_t>(b * t), classes, 7);
  labels[4] = -100;
  EXPECT_NEAR(run_cross_entropy(logits, {b, t, classes}, labels, -100, 0.1),
              ref_cross_entropy(logits, labels, classes, -100, 0.1), 1e-13);
}

TEST(Loss, CrossEntropyFloat32MatchesReference) {
  auto logits = to_double(to_float(random_values(8 * 11, 8)));
  auto labels = random_labels(8, 11, 9);
  labels[3] = -100;
  double want = ref_cross_entropy(logits, labels, 11, -100, 0.1);
  EXPECT_NEAR(run_cross_entropy(logits, {8, 11}, labels, -100, 0.1, DType::f32), want, 1e-5 * std::abs(want));
}

TEST(Loss, OutOfRangeLabelThrowsNamingIt) {
  for (int32_t bad : {5, -3}) {
    Graph g;
    Var z = g.input("logits", {4, 5}, DType::f64);
    Var l = g.input("labels", {4}, DType::i32);
    Var loss = cross_entropy(z, l);
    Model m(g);
    Program p = m.compile(forward(Mode::eval, {loss.id()}));
    auto logits = random_values(20, 10);
    std::vector<int32_t> labels = {0, 4, bad, -100};
    p.set_input("logits", std::span<const double>(logits));
    p.set_input("labels", std::span<const int32_t>(labels));
    try {
      p.run();
      ADD_FAILURE() << "label " << bad << " did not throw";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("label " + std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("row 2"), std::string::npos) << msg;
    }
  }
}

TEST(Loss, MseForwardMatchesReference) {
  for (DType dtype : {DType::f64, DType::f32}) {
    auto pred = to_double(to_float(random_values(21, 11)));
    auto target = to_double(to_float(random_values(21, 12)));
    double want = 0;
    for (size_t i = 0; i < pred.size(); ++i) want += std::pow(pred[i] - target[i], 2) / 21.0;
    Graph g;
    Var loss = mse(g.input("p", {3, 7}, dtype), g.input("t", {3, 7}, dtype));
    Model m(g);
    Program p = m.compile(forward(Mode::eval, {loss.id()}));
    double got;
    if (dtype == DType::f64) {
      p.set_input("p", std::span<const double>(pred));
      p.set_input("t", std::span<const double>(target));
      p.run();
      got = p.read_as<double>(loss.name()).at(0);
    } else {
      auto pf = to_float(pred), tf = to_float(target);
      p.set_input("p", std::span<const float>(pf));
      p.set_input("t", std::span<const float>(tf));
      p.run();
      got = p.read_as<float>(loss.name()).at(0);
    }
    EXPECT_NEAR(got, want, (dtype == DType::f64 ? 1e-14 : 1e-5) * want);
  }
}

TEST(Loss, CrossEntropyGradMatchesFiniteDifferences) {
  struct Case {
    Shape shape;
    double smoothing;
    std::vector<size_t> ignored_rows;
  };
  const std::vector<Case> cases = {{{4, 5}, 0, {}},        {{6, 7}, 0, {1, 4}},     {{6, 7}, 0.1, {0, 5}},
                                   {{2, 3, 7}, 0.1, {2}},  {{3, 1}, 0, {}},         {{1, 129}, 0.1, {}}};
  for (const Case& k : cases) {
    SCOPED_TRACE(shape_str(k.shape) + " smoothing " + std::to_string(k.smoothing));
    check_gradients([&](GradCase& c) {
      Var z = c.param("logits", k.shape, -2, 2);
      Var l = c.labels("labels", Shape(k.shape.begin(), k.shape.end() - 1), static_cast<int32_t>(k.shape.back()));
      auto* labels = reinterpret_cast<int32_t*>(c.feeds.back().second.data());
      for (size_t r : k.ignored_rows) labels[r] = -100;
      return cross_entropy(z, l, -100, k.smoothing);
    });
  }
}

TEST(Loss, CrossEntropyGradIsZeroWhenEveryRowIsIgnored) {
  Graph g;
  Var z = g.param("z", {3, 4}, Init::uniform(-1, 1), true, DType::f64);
  Var l = g.input("labels", {3}, DType::i32);
  Var loss = cross_entropy(z, l);
  Model m(g);
  CompileOptions o;
  o.loss = loss.id();
  o.gradients = true;
  Program p = m.compile(o);
  std::vector<int32_t> labels(3, -100);
  p.set_input("labels", std::span<const int32_t>(labels));
  p.run();
  for (double v : p.grad_as<double>("z")) EXPECT_EQ(v, 0.0);
}

TEST(Loss, MseGradMatchesFiniteDifferences) {
  check_gradients([](GradCase& c) { return mse(c.param("p", {3, 7}), c.param("t", {3, 7})); });
  check_gradients([](GradCase& c) { return mse(c.param("p", {129}), c.data("t", {129})); });
  check_gradients([](GradCase& c) { return mse(c.param("p", {1}), c.param("t", {1})); });
}

// ---------------------------------------------------------------- normalization

TEST(Norm, LayerNormForwardMatchesReference) {
  for (DType dtype : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const double eps = 1e-5;
    Graph g;
    Var x = g.input("x", {2, 3, 7}, dtype);
    Var gamma = g.param("gamma", {7}, Init::uniform(-1, 1), true, dtype);
    Var beta = g.param("beta", {7}, Init::uniform(-1, 1), true, dtype);
    auto out = g.add(Op::layer_norm, {x.id(), gamma.id(), beta.id()}, {{"eps", eps}});
    Model m(g, {.seed = 2});
    Program p = m.compile(forward(Mode::eval, {out[0], out[1], out[2]}));
    auto xs = to_double(to_float(random_values(42, 13)));
    std::vector<double> y, mean, rstd, gs, bs;
    if (dtype == DType::f64) {
      p.set_input("x", std::span<const double>(xs));
      p.run();
      y = p.read_as<double>(g.value(out[0]).name);
      mean = p.read_as<double>(g.value(out[1]).name);
      rstd = p.read_as<double>(g.value(out[2]).name);
      gs = read_param(m, "gamma"), bs = read_param(m, "beta");
    } else {
      auto xf = to_float(xs);
      p.set_input("x", std::span<const float>(xf));
      p.run();
      y = to_double(p.read_as<float>(g.value(out[0]).name));
      mean = to_double(p.read_as<float>(g.value(out[1]).name));
      rstd = to_double(p.read_as<float>(g.value(out[2]).name));
      gs = to_double(Program::cast_bytes<float>(m.read_param("gamma")));
      bs = to_double(Program::cast_bytes<float>(m.read_param("beta")));
    }
    NormRef want = ref_layer_norm(xs, gs, bs, eps);
    const double rtol = dtype == DType::f64 ? 1e-12 : 1e-5;
    expect_near_all(y, want.y, rtol, dtype == DType::f64 ? 1e-14 : 1e-6);
    expect_near_all(mean, want.mean, rtol, dtype == DType::f64 ? 1e-14 : 1e-6);
    expect_near_all(rstd, want.invstd, rtol);
  }
}

TEST(Norm, BatchNormTrainingNormalizesAndUpdatesRunningStats) {
  const Shape s{3, 2, 2, 3};
  const double momentum = 0.3, eps = 1e-5;
  Graph g;
  Var x = g.input("x", s, DType::f64);
  Var gamma = g.param("gamma", {2}, Init::uniform(-1, 1), true, DType::f64);
  Var beta = g.param("beta", {2}, Init::uniform(-1, 1), true, DType::f64);
  Var rm = g.state("rm", {2}, Init::constant(0.5), DType::f64);
  Var rv = g.state("rv", {2}, Init::constant(2.0), DType::f64);
  auto out = g.add(Op::batch_norm, {x.id(), gamma.id(), beta.id(), rm.id(), rv.id()},
                   {{"momentum", momentum}, {"eps", eps}});
  Model m(g, {.seed = 4});
  Program p = m.compile(forward(Mode::train, {out[0], out[1], out[2]}));
  auto gs = read_param(m, "gamma"), bs = read_param(m, "beta");
  std::vector<double> want_rm(2, 0.5), want_rv(2, 2.0);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    auto xs = random_values(36, 20 + static_cast<uint64_t>(run), -1.0 + run, 2.0 + 3 * run);
    p.set_input("x", std::span<const double>(xs));
    p.run();
    NormRef want = ref_batch_norm(xs, s, gs, bs, eps);
    expect_near_all(p.read_as<double>(g.value(out[0]).name), want.y, 1e-12, 1e-14);
    expect_near_all(p.read_as<double>(g.value(out[1]).name), want.mean, 1e-12, 1e-14);
    expect_near_all(p.read_as<double>(g.value(out[2]).name), want.invstd, 1e-12);
    // torch.nn.BatchNorm2d: the running variance takes the unbiased batch variance.
    for (size_t c = 0; c < 2; ++c) {
      want_rm[c] = (1 - momentum) * want_rm[c] + momentum * want.mean[c];
      want_rv[c] = (1 - momentum) * want_rv[c] + momentum * want.var_unbiased[c];
    }
    expect_near_all(read_state(m, "rm"), want_rm, 1e-12, 1e-14);
    expect_near_all(read_state(m, "rv"), want_rv, 1e-12);
  }
}

TEST(Norm, BatchNormEvalUsesRunningStats) {
  const Shape s{4, 3};
  const double eps = 1e-3;
  Graph g;
  Var x = g.input("x", s, DType::f64);
  Var gamma = g.param("gamma", {3}, Init::uniform(-1, 1), true, DType::f64);
  Var beta = g.param("beta", {3}, Init::uniform(-1, 1), true, DType::f64);
  Var rm = g.state("rm", {3}, Init::zeros(), DType::f64);
  Var rv = g.state("rv", {3}, Init::ones(), DType::f64);
  auto out = g.add(Op::batch_norm, {x.id(), gamma.id(), beta.id(), rm.id(), rv.id()}, {{"eps", eps}});
  Model m(g, {.seed = 5});
  std::vector<double> rms = {0.3, -0.7, 1.1}, rvs = {0.5, 2.0, 0.9};
  m.write_state("rm", std::as_bytes(std::span<const double>(rms)));
  m.write_state("rv", std::as_bytes(std::span<const double>(rvs)));
  Program p = m.compile(forward(Mode::eval, {out[0], out[1], out[2]}));
  auto xs = random_values(12, 21);
  p.set_input("x", std::span<const double>(xs));
  p.run();
  NormRef want = ref_batch_norm(xs, s, read_param(m, "gamma"), read_param(m, "beta"), eps, &rms, &rvs);
  expect_near_all(p.read_as<double>(g.value(out[0]).name), want.y, 1e-12, 1e-14);
  expect_near_all(p.read_as<double>(g.value(out[1]).name), rms, 0);
  expect_near_all(p.read_as<double>(g.value(out[2]).name), want.invstd, 1e-12);
  expect_near_all(read_state(m, "rm"), rms, 0, 0);  // evaluation leaves them alone
  expect_near_all(read_state(m, "rv"), rvs, 0, 0);
}

TEST(Norm, BatchNormFloat32MatchesReference) {
  const Shape s{2, 3, 2, 2};
  Graph g;
  Var x = g.input("x", s, DType::f32);
  Var gamma = g.param("gamma", {3}, Init::uniform(-1, 1), true, DType::f32);
  Var beta = g.param("beta", {3}, Init::uniform(-1, 1), true, DType::f32);
  Var y = batch_norm(x, gamma, beta, g.state("rm", {3}, Init::zeros(), DType::f32),
                     g.state("rv", {3}, Init::ones(), DType::f32), 0.1, 1e-5);
  Model m(g, {.seed = 6});
  Program p = m.compile(forward(Mode::train, {y.id()}));
  auto xf = to_float(random_values(24, 22));
  p.set_input("x", std::span<const float>(xf));
  p.run();
  NormRef want = ref_batch_norm(to_double(xf), s, to_double(Program::cast_bytes<float>(m.read_param("gamma"))),
                                to_double(Program::cast_bytes<float>(m.read_param("beta"))), 1e-5);
  expect_near_all(to_double(p.read_as<float>(y.name())), want.y, 1e-5, 1e-6);
}

TEST(Norm, LayerNormGradMatchesFiniteDifferences) {
  for (Shape s : {Shape{3, 7}, Shape{2, 3, 5}, Shape{129}, Shape{4, 1}}) {
    SCOPED_TRACE(shape_str(s));
    check_gradients([&](GradCase& c) {
      Shape dim{s.back()};
      return layer_norm(c.param("x", s, -2, 2), c.param("gamma", dim), c.param("beta", dim));
    });
  }
}

// layer_norm_grad from the norm's output (from_output: y and beta in place of x and mean,
// xhat = (y - beta) / gamma) gives the gradients taken from the input, with dr and dx's
// column sums, gammas of either sign; a zero gamma is an error that names it.
TEST(Norm, LayerNormGradFromTheOutputMatchesTheInputs) {
  for (Shape s : {Shape{5, 7}, Shape{2, 3, 16}}) {
    SCOPED_TRACE(shape_str(s));
    const Shape dim{s.back()};
    const auto d = static_cast<size_t>(s.back()), n = static_cast<size_t>(numel(s));
    Graph g;
    Var x = g.input("x", s, DType::f64), dy = g.input("dy", s, DType::f64), dr = g.input("dr", s, DType::f64);
    Var gamma = g.input("gamma", dim, DType::f64), beta = g.input("beta", dim, DType::f64);
    auto st = g.add(Op::layer_norm, {x.id(), gamma.id(), beta.id()});
    const Attrs sums{{"dx_sums", int64_t{1}}};
    Attrs from_y = sums;
    from_y.set("from_output", int64_t{1});
    auto a = g.add(Op::layer_norm_grad, {dy.id(), x.id(), st[1], st[2], gamma.id(), dr.id()}, sums);
    auto b = g.add(Op::layer_norm_grad, {dy.id(), st[0], beta.id(), st[2], gamma.id(), dr.id()}, from_y);
    std::vector<ValueId> outs(a.begin(), a.end());
    outs.insert(outs.end(), b.begin(), b.end());
    Model m(g, {});
    Program p = m.compile(forward(Mode::eval, outs));
    std::vector<double> gs = random_values(d, 7, 0.5, 1.5), bs = random_values(d, 8, -1, 1);
    for (size_t j = 0; j < d; j += 2) gs[j] = -gs[j];
    for (const char* in : {"x", "dy", "dr"}) {
      const std::vector<double> v = random_values(n, in[1] + 11, -2, 2);
      p.set_input(in, std::span<const double>(v));
    }
    p.set_input("beta", std::span<const double>(bs));
    p.set_input("gamma", std::span<const double>(gs));
    p.run();
    for (size_t i = 0; i < a.size(); ++i) {
      SCOPED_TRACE("output " + std::to_string(i));
      expect_near_all(p.read_as<double>(g.value(b[i]).name), p.read_as<double>(g.value(a[i]).name), 1e-10, 1e-12);
    }
    gs[2] = 0;
    p.set_input("gamma", std::span<const double>(gs));
    const std::string e = seam::testing::error_of([&] { p.run(); });
    EXPECT_NE(e.find("gamma[2] is 0"), std::string::npos) << e;
  }
  // Its inputs as the op states them: beta of gamma's type, the flag 0 or 1.
  Graph g;
  Var y = g.input("y", {4, 6}), dy = g.input("dy", {4, 6}), rstd = g.input("rstd", {4});
  Var gamma = g.input("gamma", {6}), beta = g.input("beta", {6}), short_beta = g.input("b5", {5});
  auto grad = [&](Var b, int64_t flag) {
    return seam::testing::error_of([&] {
      g.add(Op::layer_norm_grad, {dy.id(), y.id(), b.id(), rstd.id(), gamma.id()}, {{"from_output", flag}});
    });
  };
  EXPECT_NE(grad(short_beta, 1).find("beta must be gamma's type f32[6], got f32[5]"), std::string::npos)
      << grad(short_beta, 1);
  EXPECT_NE(grad(beta, 2).find("from_output must be 0 or 1, got 2"), std::string::npos) << grad(beta, 2);
  EXPECT_EQ(grad(beta, 1), "");
}

TEST(Norm, BatchNormTrainingGradMatchesFiniteDifferences) {
  for (Shape s : {Shape{4, 3}, Shape{2, 3, 2, 3}, Shape{1, 2, 3, 1}}) {
    SCOPED_TRACE(shape_str(s));
    check_gradients([&](GradCase& c) {
      Shape ch{s[1]};
      return batch_norm(c.param("x", s, -2, 2), c.param("gamma", ch), c.param("beta", ch),
                        c.state("rm", ch, 0.0), c.state("rv", ch, 1.0), 0.1, 1e-5);
    });
  }
}

TEST(Norm, BatchNormEvalGradMatchesFiniteDifferences) {
  GradCheckOptions o;
  o.mode = Mode::eval;
  for (Shape s : {Shape{4, 3}, Shape{2, 3, 2, 2}}) {
    SCOPED_TRACE(shape_str(s));
    check_gradients(
        [&](GradCase& c) {
          Shape ch{s[1]};
          return batch_norm(c.param("x", s, -2, 2), c.param("gamma", ch), c.param("beta", ch),
                            c.state("rm", ch, 0.2), c.state("rv", ch, 0.7), 0.1, 1e-5);
        },
        o);
  }
}
