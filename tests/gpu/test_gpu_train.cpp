// The optimizer kernel against the CPU, and twenty whole training steps of an MLP and a
// CNN on the GPU against the CPU, parameters compared at the end.
#include <gtest/gtest.h>

#include <random>

#include "gpu_check.h"

using namespace seam;
using seam::gpu_testing::expect_close;
using seam::gpu_testing::Tolerance;

namespace {

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Batch random_batch(size_t rows, size_t dim, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  Batch b;
  b.x.resize(rows * dim);
  for (auto& v : b.x) v = nd(rng);
  b.y.resize(rows);
  for (auto& v : b.y) v = static_cast<int32_t>(rng() % static_cast<uint64_t>(classes));
  return b;
}

// Trains the same model on both devices for `steps` steps and compares every parameter.
void train_both(Graph& g, Var loss, const OptimizerConfig& opt, size_t rows, size_t dim, int steps, Tolerance tol,
                bool tf32) {
  std::vector<std::vector<float>> params[2];
  for (int d = 0; d < 2; ++d) {
    Model m(g, {.seed = 5, .device = d ? Device::cuda : Device::cpu, .tf32 = tf32});
    Program p = m.compile({.loss = loss.id(), .optimizer = opt});
    for (int s = 0; s < steps; ++s) {
      Batch b = random_batch(rows, dim, 10, static_cast<uint64_t>(s));
      p.set_input("x", std::span<const float>(b.x));
      p.set_input("y", std::span<const int32_t>(b.y));
      p.run();
    }
    EXPECT_EQ(m.state().step, steps);
    for (ValueId id : g.params()) params[d].push_back(Program::cast_bytes<float>(m.read_param(g.value(id).name)));
    for (ValueId id : g.states()) params[d].push_back(Program::cast_bytes<float>(m.read_state(g.value(id).name)));
  }
  std::vector<std::string> names;
  for (ValueId id : g.params()) names.push_back(g.value(id).name);
  for (ValueId id : g.states()) names.push_back(g.value(id).name);
  for (size_t i = 0; i < names.size(); ++i) expect_close(params[1][i], params[0][i], tol, names[i]);
}

}  // namespace

TEST(GpuOptimizer, EveryOptimizerMatchesTheCpu) {
  std::vector<OptimizerConfig> configs = {OptimizerConfig::sgd(0.1), OptimizerConfig::sgd(0.05, 0.9, true),
                                          OptimizerConfig::adam(1e-2), OptimizerConfig::adamw(1e-2, 0.1)};
  configs[1].weight_decay = 0.01;
  configs[2].weight_decay = 0.05;
  auto clipped = OptimizerConfig::adamw(3e-3, 0.01);
  clipped.clip_norm = 0.5;
  clipped.schedule = {Schedule::Kind::cosine, 2, 1, 0.1, 6, 1e-4};
  configs.push_back(clipped);
  for (auto& c : configs) {
    SCOPED_TRACE(c.str());
    Graph g;
    Var w = g.param("w", {1000}, Init::uniform(-1, 1));
    Var b = g.param("b", {37}, Init::uniform(-1, 1), false);
    Var gw = g.input("gw", {1000}), gb = g.input("gb", {37});
    Var loss = add(sum(mul(w, gw)), sum(mul(b, gb)));
    std::vector<float> p[2][2];
    for (int d = 0; d < 2; ++d) {
      Model m(g, {.seed = 2, .device = d ? Device::cuda : Device::cpu});
      Program prog = m.compile({.loss = loss.id(), .optimizer = c});
      std::mt19937_64 rng(8);
      std::normal_distribution<float> nd(0, 1);
      for (int s = 0; s < 8; ++s) {
        std::vector<float> a(1000), bb(37);
        for (auto& v : a) v = nd(rng);
        for (auto& v : bb) v = nd(rng);
        prog.set_input("gw", std::span<const float>(a));
        prog.set_input("gb", std::span<const float>(bb));
        prog.run();
      }
      p[d][0] = Program::cast_bytes<float>(m.read_param("w"));
      p[d][1] = Program::cast_bytes<float>(m.read_param("b"));
    }
    expect_close(p[1][0], p[0][0], {1e-5, 1e-6}, "w");
    expect_close(p[1][1], p[0][1], {1e-5, 1e-6}, "b");
  }
}

TEST(GpuTraining, TwentyMlpStepsMatchTheCpu) {
  const int64_t batch = 64;
  Graph g;
  Var x = g.input("x", {batch, 784});
  Var y = g.input("y", {batch}, DType::i32);
  Var h = relu(nn::linear(x, 256, "fc1"));
  h = dropout(h, 0.2);
  h = gelu(nn::linear(h, 128, "fc2"), true);
  Var loss = cross_entropy(nn::linear(h, 10, "fc3"), y);
  auto opt = OptimizerConfig::adamw(1e-3, 0.01);
  opt.schedule.warmup_steps = 5;
  train_both(g, loss, opt, batch, 784, 20, {1e-4, 1e-5}, /*tf32=*/false);
  train_both(g, loss, OptimizerConfig::sgd(0.05, 0.9), batch, 784, 20, {5e-3, 1e-3}, /*tf32=*/true);
}

TEST(GpuTraining, TwentyCnnStepsMatchTheCpu) {
  const int64_t batch = 16;
  Graph g;
  Var x = g.input("x", {batch, 1, 28, 28});
  Var y = g.input("y", {batch}, DType::i32);
  // No conv bias before batch norm: the norm removes it, so its true gradient is zero and
  // Adam would only amplify rounding noise in it (as any framework's would).
  Var h = relu(nn::batch_norm(nn::conv2d(x, 8, 3, "conv1", {.padding = {1, 1}}, false), "bn1"));
  h = max_pool2d(h, {2, 2});
  h = relu(nn::batch_norm(nn::conv2d(h, 16, 3, "conv2", {.padding = {1, 1}}, false), "bn2"));
  h = max_pool2d(h, {2, 2});
  Var logits = nn::linear(dropout(flatten(h), 0.25), 10, "fc");
  Var loss = cross_entropy(logits, y);
  train_both(g, loss, OptimizerConfig::adam(1e-3), batch, 784, 20, {1e-4, 1e-5}, /*tf32=*/false);
}
