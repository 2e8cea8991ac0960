// Whole networks at bf16 and f16 on the GPU against the CPU plan at the same policy: the
// shapes of the bench workloads (GELU MLP, gated residual MLP, post-norm residual MLP),
// small, forward and every parameter's gradient through the loss.
#include <gtest/gtest.h>

#include <cmath>

#include "../test_util.h"
#include "gpu_check.h"

using namespace seam;
using namespace seam::gpu_testing;

namespace {

CompareOptions loss_at(Precision p) {
  CompareOptions o = p == Precision::bf16 ? bf16() : f16();
  o.output_is_loss = true;
  return o;
}

Var gelu_mlp_of(GpuCase& c, int64_t classes) {
  Var x = c.data("x", {96, 64});
  Var y = c.labels("y", {96}, classes);
  Var h = gelu(nn::linear(x, 128, "fc1"), true);
  h = gelu(nn::linear(h, 128, "fc2"), true);
  return cross_entropy(nn::linear(h, classes, "fc3"), y);
}

Var gelu_mlp(GpuCase& c) { return gelu_mlp_of(c, 24); }

// h += gamma * down(silu(gate(h)) * up(h)), as W3.
Var gated_residual(GpuCase& c) {
  Var x = c.data("x", {64, 48});
  Var y = c.labels("y", {64}, 16);
  Var h = nn::linear(x, 64, "in");
  for (int b = 0; b < 2; ++b) {
    const std::string n = "block" + std::to_string(b);
    Var u = mul(silu(nn::linear(h, 96, n + ".gate")), nn::linear(h, 96, n + ".up"));
    Var gamma = c.param(n + ".gamma", {64}, 0.05, 0.2);
    h = add(h, mul(gamma, nn::linear(u, 64, n + ".down")));
  }
  return cross_entropy(nn::linear(h, 16, "head"), y);
}

// h = layer_norm(h + down(gelu(up(h)))), as W4.
Var post_norm_residual(GpuCase& c) {
  Var x = c.data("x", {64, 48});
  Var y = c.labels("y", {64}, 16);
  Var h = nn::linear(x, 64, "in");
  for (int b = 0; b < 2; ++b) {
    const std::string n = "block" + std::to_string(b);
    Var f = nn::linear(gelu(nn::linear(h, 128, n + ".up"), true), 64, n + ".down");
    h = nn::layer_norm(add(h, f), n + ".norm");
  }
  return cross_entropy(nn::linear(h, 16, "head"), y);
}

}  // namespace

TEST(GpuPrecisionModel, GeluMlpMatchesTheCpuAt16Bits) {
  for (Precision p : {Precision::bf16, Precision::f16}) {
    SCOPED_TRACE(precision_name(p));
    compare_with_cpu(gelu_mlp, loss_at(p));
  }
}

TEST(GpuPrecisionModel, GatedResidualMlpMatchesTheCpuAt16Bits) {
  for (Precision p : {Precision::bf16, Precision::f16}) {
    SCOPED_TRACE(precision_name(p));
    compare_with_cpu(gated_residual, loss_at(p));
  }
}

TEST(GpuPrecisionModel, PostNormResidualMlpMatchesTheCpuAt16Bits) {
  for (Precision p : {Precision::bf16, Precision::f16}) {
    SCOPED_TRACE(precision_name(p));
    compare_with_cpu(post_norm_residual, loss_at(p));
  }
}

TEST(GpuPrecisionModel, EveryEpiloguePolicyMatchesTheCpuAtBf16) {
  for (EpiloguePolicy e : {EpiloguePolicy::fused, EpiloguePolicy::split, EpiloguePolicy::split_t}) {
    CompareOptions o = loss_at(Precision::bf16);
    o.epilogue = e;
    compare_with_cpu(gelu_mlp, o);
  }
}

// The update writes the parameters' bf16 working copies beside the masters; a program
// that reads them after training sees what a model made fresh from the masters sees,
// and parameters written by hand reach them before the next run.
TEST(GpuPrecisionModel, TheWorkingCopiesFollowTheMasters) {
  GpuCase c(3);
  Var loss = gelu_mlp(c);
  Model m(c.g, {.seed = 4, .device = Device::cuda, .precision = Precision::bf16});
  Program train = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adamw(1e-2, 0.01)});
  ASSERT_EQ(train.plan().working, DType::bf16);
  for (auto& [name, bytes] : c.feeds) train.set_input(name, bytes);
  for (int s = 0; s < 3; ++s) train.run();
  Program eval = m.compile({.mode = Mode::eval, .outputs = {loss.id()}});
  Model fresh(c.g, {.seed = 4, .device = Device::cuda, .precision = Precision::bf16});
  fresh.load_tensors(m.save_tensors());
  Program fe = fresh.compile({.mode = Mode::eval, .outputs = {loss.id()}});
  for (auto& [name, bytes] : c.feeds) eval.set_input(name, bytes), fe.set_input(name, bytes);
  eval.run();
  fe.run();
  EXPECT_EQ(eval.read(loss.name()), fe.read(loss.name()));
  std::vector<float> zeros(128 * 64, 0.0f);
  m.write_param("fc1.weight", std::as_bytes(std::span(zeros)));
  fresh.write_param("fc1.weight", std::as_bytes(std::span(zeros)));
  eval.run();
  fe.run();
  EXPECT_EQ(eval.read(loss.name()), fe.read(loss.name()));
}

// Parameters stored in bf16 without masters, updated with stochastic rounding: the GPU
// trains as the CPU does (the same draws; a value that lands on the other side of a draw
// because the GEMMs summed in another order differs by one unit, so the comparison is of
// the whole tensor, not of each element). 24 classes make a parameter count the update
// reads four at a time, 23 one that it reads one by one.
namespace {

void expect_training_without_masters_as_the_cpu(int64_t classes) {
  SCOPED_TRACE(classes);
  GpuCase c(5);
  Var loss = gelu_mlp_of(c, classes);
  std::vector<std::vector<float>> params[2];
  std::vector<float> losses[2];
  for (int d = 0; d < 2; ++d) {
    Model m(c.g, {.seed = 6, .device = d ? Device::cuda : Device::cpu, .precision = Precision::bf16,
                  .master_weights = false});
    ASSERT_EQ(m.layout().param_dtype, DType::bf16);
    Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adamw(3e-3, 0.01)});
    for (auto& [name, bytes] : c.feeds) p.set_input(name, bytes);
    for (int s = 0; s < 10; ++s) {
      p.run();
      losses[d].push_back(p.read_as<float>(loss.name()).at(0));
    }
    for (const Slot& s : m.layout().params)
      params[d].push_back(seam::testing::as_floats(m.read_param(s.name), DType::bf16));
  }
  expect_close(losses[1], losses[0], Tolerance(2e-2, INFINITY, INFINITY), "loss curve");
  for (size_t i = 0; i < params[0].size(); ++i)
    expect_close(params[1][i], params[0][i], Tolerance(1e-2, INFINITY, INFINITY), "parameter " + std::to_string(i));
}

}  // namespace

TEST(GpuPrecisionModel, TrainingWithoutMastersMatchesTheCpu) {
  expect_training_without_masters_as_the_cpu(24);
  expect_training_without_masters_as_the_cpu(23);
}

// Under replay of the captured step: an f16 step whose scaled gradients overflow changes
// nothing but the loss scale (halved) and the skip count; the next clean step updates.
TEST(GpuPrecisionModel, ALossScaleSkipUnderReplayChangesOnlyTheScaleAndTheCount) {
  GpuCase c(7);
  Var loss = gelu_mlp(c);
  auto opt = OptimizerConfig::adamw(1e-3, 0.01);
  opt.loss_scaling = {LossScaling::Mode::dynamic, 1e30, 2.0, 0.5, 1000};  // overflows f16 at once
  Model m(c.g, {.seed = 2, .device = Device::cuda, .precision = Precision::f16, .cuda_graph = true});
  Program p = m.compile({.loss = loss.id(), .optimizer = opt});
  for (auto& [name, bytes] : c.feeds) p.set_input(name, bytes);
  const auto before = m.save_tensors();
  p.run();
  StepState st = p.sync_state();
  EXPECT_EQ(st.skipped_steps, 1);
  EXPECT_EQ(st.skip_streak, 1);
  EXPECT_EQ(st.step, 1);
  EXPECT_FLOAT_EQ(static_cast<float>(st.loss_scale), 5e29f);
  const auto after = m.save_tensors();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(after[i].data == before[i].data) << after[i].name;
  // The scale halves each skipped step until the gradients fit, then the step updates.
  for (int s = 0; s < 120 && p.sync_state().skip_streak > 0; ++s) p.run();
  st = p.sync_state();
  EXPECT_EQ(st.skip_streak, 0);
  EXPECT_GT(st.skipped_steps, 50);  // 1e30 down to f16's range: about 85 halvings
  EXPECT_FALSE(m.save_tensors()[0].data == before[0].data);
}
