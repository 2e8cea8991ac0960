// Optimizers against their reference formulas (PyTorch's documented definitions of
// torch.optim.SGD, Adam and AdamW, and clip_grad_norm_), step by step; schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "seam/seam.h"
#include "test_util.h"

using namespace seam;

namespace {

// A model whose loss is sum(w * g) + sum(b * gb): the gradient of each parameter is
// whatever the test feeds as g, so updates can be checked against hand-written formulas.
struct Harness {
  static constexpr int kW = 7, kB = 3;
  Graph g;
  Var w, b, gw, gb, loss;
  Harness() {
    w = g.param("w", {kW}, Init::uniform(-1, 1), true, DType::f64);
    b = g.param("b", {kB}, Init::uniform(-1, 1), /*decay=*/false, DType::f64);
    gw = g.input("gw", {kW}, DType::f64);
    gb = g.input("gb", {kB}, DType::f64);
    loss = add(sum(mul(w, gw)), sum(mul(b, gb)));
  }
};

// Reference state for one parameter tensor.
struct Ref {
  std::vector<double> p, m, v;
  bool decay;
};

void reference_step(const OptimizerConfig& c, std::vector<Ref>& refs, std::vector<std::vector<double>> grads,
                    int64_t t) {
  if (c.clip_norm > 0) {
    double sq = 0;
    for (auto& g : grads)
      for (double x : g) sq += x * x;
    double coef = std::min(1.0, c.clip_norm / (std::sqrt(sq) + 1e-6));
    for (auto& g : grads)
      for (double& x : g) x *= coef;
  }
  double lr = c.schedule.lr_at(c.lr, t);
  for (size_t k = 0; k < refs.size(); ++k) {
    Ref& r = refs[k];
    double wd = r.decay ? c.weight_decay : 0.0;
    for (size_t i = 0; i < r.p.size(); ++i) {
      double g = grads[k][i];
      if (c.kind == OptimizerConfig::Kind::sgd) {
        g += wd * r.p[i];
        if (c.momentum != 0) {
          r.m[i] = t == 0 ? g : c.momentum * r.m[i] + (1 - c.dampening) * g;
          g = c.nesterov ? g + c.momentum * r.m[i] : r.m[i];
        }
        r.p[i] -= lr * g;
      } else {
        if (c.kind == OptimizerConfig::Kind::adamw) r.p[i] *= 1 - lr * wd;
        else g += wd * r.p[i];
        r.m[i] = c.beta1 * r.m[i] + (1 - c.beta1) * g;
        r.v[i] = c.beta2 * r.v[i] + (1 - c.beta2) * g * g;
        double mhat = r.m[i] / (1 - std::pow(c.beta1, t + 1));
        double vhat = r.v[i] / (1 - std::pow(c.beta2, t + 1));
        r.p[i] -= lr * mhat / (std::sqrt(vhat) + c.eps);
      }
    }
  }
}

void check_against_reference(const OptimizerConfig& c, int steps = 6) {
  Harness h;
  Model m(h.g, {.seed = 9});
  Program p = m.compile({.loss = h.loss.id(), .optimizer = c});
  std::vector<Ref> refs = {{Program::cast_bytes<double>(m.read_param("w")), {}, {}, true},
                           {Program::cast_bytes<double>(m.read_param("b")), {}, {}, false}};
  for (auto& r : refs) r.m.assign(r.p.size(), 0), r.v.assign(r.p.size(), 0);
  std::mt19937_64 rng(4);
  std::normal_distribution<double> nd(0, 2);
  for (int t = 0; t < steps; ++t) {
    std::vector<double> gw(Harness::kW), gb(Harness::kB);
    for (auto& x : gw) x = nd(rng);
    for (auto& x : gb) x = nd(rng);
    p.set_input("gw", std::span<const double>(gw));
    p.set_input("gb", std::span<const double>(gb));
    p.run();
    reference_step(c, refs, {gw, gb}, t);
    auto w = Program::cast_bytes<double>(m.read_param("w"));
    auto b = Program::cast_bytes<double>(m.read_param("b"));
    for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(w[i], refs[0].p[i], 1e-12) << c.str() << " step " << t;
    for (size_t i = 0; i < b.size(); ++i) ASSERT_NEAR(b[i], refs[1].p[i], 1e-12) << c.str() << " step " << t;
  }
  EXPECT_EQ(m.state().step, steps);
}

}  // namespace

TEST(Optimizer, PlainSgd) { check_against_reference(OptimizerConfig::sgd(0.1)); }

TEST(Optimizer, SgdMomentumWithWeightDecayAndDampening) {
  auto c = OptimizerConfig::sgd(0.05, 0.9);
  c.weight_decay = 0.01;
  c.dampening = 0.1;
  check_against_reference(c);
}

TEST(Optimizer, Nesterov) {
  auto c = OptimizerConfig::sgd(0.05, 0.9, true);
  c.weight_decay = 1e-3;
  check_against_reference(c);
}

TEST(Optimizer, Adam) {
  check_against_reference(OptimizerConfig::adam(1e-2));
  auto c = OptimizerConfig::adam(3e-3, 0.8, 0.95, 1e-6);
  c.weight_decay = 0.1;  // L2 added to the gradient, decay-flagged parameters only
  check_against_reference(c);
}

TEST(Optimizer, AdamWDecouplesWeightDecay) { check_against_reference(OptimizerConfig::adamw(1e-2, 0.1)); }

TEST(Optimizer, GradientClippingByGlobalNorm) {
  auto c = OptimizerConfig::adamw(1e-2, 0.05);
  c.clip_norm = 1.0;  // the random gradients have norm ~6, so clipping is active
  check_against_reference(c);
  auto s = OptimizerConfig::sgd(0.1, 0.9);
  s.clip_norm = 100.0;  // inactive
  check_against_reference(s);
}

TEST(Optimizer, ScheduledLearningRateFollowsTheStepCounter) {
  auto c = OptimizerConfig::sgd(0.1, 0.5);
  c.schedule = {Schedule::Kind::cosine, /*warmup*/ 2, 1, 0.1, /*total*/ 4, 0.01};
  check_against_reference(c, 8);
  c.schedule = {Schedule::Kind::step, 1, /*step_size*/ 2, /*gamma*/ 0.5};
  check_against_reference(c, 7);
}

TEST(Optimizer, ReportsLearningRateAndGradientNorm) {
  Harness h;
  Model m(h.g);
  auto c = OptimizerConfig::sgd(0.5);
  c.schedule.warmup_steps = 4;
  Program p = m.compile({.loss = h.loss.id(), .optimizer = c});
  std::vector<double> gw(Harness::kW, 1.0), gb(Harness::kB, 2.0);
  p.set_input("gw", std::span<const double>(gw));
  p.set_input("gb", std::span<const double>(gb));
  p.run();
  EXPECT_DOUBLE_EQ(m.state().lr, 0.5 / 4);
  EXPECT_NEAR(m.state().grad_norm, std::sqrt(7.0 + 12.0), 1e-12);
  p.run();
  EXPECT_DOUBLE_EQ(m.state().lr, 0.5 * 2 / 4);
}

TEST(Schedule, Shapes) {
  Schedule warm{Schedule::Kind::constant, 4};
  EXPECT_DOUBLE_EQ(warm.lr_at(1.0, 0), 0.25);
  EXPECT_DOUBLE_EQ(warm.lr_at(1.0, 3), 1.0);
  EXPECT_DOUBLE_EQ(warm.lr_at(1.0, 100), 1.0);
  Schedule step{Schedule::Kind::step, 0, 10, 0.5};
  EXPECT_DOUBLE_EQ(step.lr_at(1.0, 9), 1.0);
  EXPECT_DOUBLE_EQ(step.lr_at(1.0, 10), 0.5);
  EXPECT_DOUBLE_EQ(step.lr_at(1.0, 25), 0.25);
  Schedule cos{Schedule::Kind::cosine, 0, 1, 0.1, 100, 0.1};
  EXPECT_DOUBLE_EQ(cos.lr_at(1.0, 0), 1.0);
  EXPECT_NEAR(cos.lr_at(1.0, 50), 0.55, 1e-12);
  EXPECT_NEAR(cos.lr_at(1.0, 100), 0.1, 1e-12);
  EXPECT_NEAR(cos.lr_at(1.0, 500), 0.1, 1e-12);
}

TEST(Optimizer, InvalidSettingsAreRejected) {
  auto bad = OptimizerConfig::adam(1e-3, 1.0);
  EXPECT_THROW(bad.validate(), Error);
  auto nest = OptimizerConfig::sgd(0.1, 0.0, true);
  EXPECT_THROW(nest.validate(), Error);
  Harness h;
  Model m(h.g);
  EXPECT_THROW(m.compile({.mode = Mode::eval, .loss = h.loss.id(), .optimizer = OptimizerConfig::sgd(0.1)}), Error);
}

// The moments a model keeps are its optimizer's: one for SGD with momentum, two for
// Adam; checkpoints carry as many, and a file with an extra all-zero slot still loads.
TEST(OptimizerState, AModelKeepsAsManyMomentsAsItsOptimizer) {
  Graph g;
  Var loss = seam::testing::mlp_loss(g, 8, 12, {16}, 4);
  Model sgd(g, {.seed = 1});
  const size_t before = sgd.device_bytes();
  Program p = sgd.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1, 0.9)});
  const size_t moment = sgd.layout().param_bytes;  // f32 moments of f32 parameters
  EXPECT_EQ(sgd.device_bytes(), before + moment);
  std::vector<HostTensor> saved = sgd.save_tensors();
  int m = 0, v = 0;
  for (const HostTensor& t : saved) {
    m += t.name.rfind("optimizer.m/", 0) == 0;
    v += t.name.rfind("optimizer.v/", 0) == 0;
  }
  EXPECT_EQ(m, static_cast<int>(sgd.layout().params.size()));
  EXPECT_EQ(v, 0);
  // A second moment slot of zeros (as older checkpoints of SGD models carry) is dropped;
  // one that is not zero does not belong to this optimizer, and nothing is loaded.
  std::vector<HostTensor> with_v = saved;
  for (const HostTensor& t : saved)
    if (t.name.rfind("optimizer.m/", 0) == 0)
      with_v.push_back({"optimizer.v/" + t.name.substr(12), t.type, std::vector<std::byte>(t.data.size())});
  sgd.load_tensors(with_v);
  const auto w0 = sgd.read_param(sgd.layout().params[0].name);
  // A refused load names the problem and leaves the parameters as they were.
  auto expect_refused = [&](const std::vector<HostTensor>& tensors, const std::string& what) {
    try {
      sgd.load_tensors(tensors);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(sgd.read_param(sgd.layout().params[0].name), w0);
  };
  with_v.back().data[0] = std::byte{1};
  for (HostTensor& t : with_v)
    if (t.name == sgd.layout().params[0].name) t.data.assign(t.data.size(), std::byte{0});
  expect_refused(with_v, "keeps 2 moments a parameter, this model's keeps 1");
  // Second moments without first ones name what is missing.
  std::vector<HostTensor> v_only;
  for (const HostTensor& t : with_v)
    if (t.name.rfind("optimizer.m/", 0) != 0) v_only.push_back(t);
  expect_refused(v_only, "'optimizer.v/*' are given without 'optimizer.m/*'");
  // Adam needs two: not on a model whose programs hold one.
  try {
    Program q = sgd.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-3)});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("keeps 2 moments a parameter, but this model's state holds 1"),
              std::string::npos)
        << e.what();
  }
  // A model of its own for Adam takes the SGD checkpoint: its second moments start at zero.
  Model adam(g, {.seed = 1});
  Program a = adam.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-3)});
  EXPECT_EQ(adam.device_bytes(), before + 2 * moment);
  adam.load_tensors(saved);
  for (const HostTensor& t : adam.save_tensors()) {
    if (t.name.rfind("optimizer.v/", 0) != 0) continue;
    for (std::byte b : t.data) ASSERT_EQ(b, std::byte{0}) << t.name;
  }
}
