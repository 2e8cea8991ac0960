// The precision policy on the CPU: what the pass makes of a graph, the CPU's 16-bit
// storage, training at bf16 and f16 against f32, and the errors of bad overrides.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <cmath>

#include "common/half.h"
#include "common/stochastic.h"
#include "model_checks.h"
#include "seam/seam.h"
#include "ops/registry.h"
#include "test_util.h"

namespace seam::testing {
namespace {


// A classifier MLP whose layers are scopes "fc1", "fc2", ... (what overrides name).
Var scoped_mlp(Graph& g, int64_t batch, int64_t in, const std::vector<int64_t>& hidden, int64_t classes) {
  Var h = g.input("x", {batch, in});
  Var y = g.input("y", {batch}, DType::i32);
  int layer = 0;
  for (int64_t w : hidden) {
    const std::string n = "fc" + std::to_string(++layer);
    auto s = g.scope(n);
    h = relu(nn::linear(h, w, n));
  }
  const std::string n = "fc" + std::to_string(++layer);
  auto s = g.scope(n);
  return cross_entropy(nn::linear(h, classes, n), y);
}

// Losses of `steps` AdamW steps of an MLP on one fixed batch at a precision.
std::vector<float> losses(Precision p, int steps, std::vector<PrecisionOverride> overrides = {}) {
  Graph g;
  Var loss = scoped_mlp(g, 64, 48, {96, 64}, 10);
  Model m(g, {.seed = 3, .precision = p, .precision_overrides = std::move(overrides)});
  Program prog = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adamw(3e-3, 0.01)});
  const auto x = random_floats(64 * 48, 1);
  const auto y = random_labels(64, 10, 2);
  prog.set_input("x", std::span<const float>(x));
  prog.set_input("y", std::span<const int32_t>(y));
  std::vector<float> out;
  for (int s = 0; s < steps; ++s) {
    prog.run();
    out.push_back(prog.read_as<float>(loss.name()).at(0));
  }
  return out;
}

TEST(Precision, GemmsReadAndWrite16BitsWhileMastersAndTheirGradientsStayF32) {
  for (Precision p : {Precision::bf16, Precision::f16}) {
    const DType low = *low_dtype(p);
    Graph g;
    Var loss = mlp_loss(g, 32, 40, {64}, 10);
    Model m(g, {.precision = p});
    Program prog = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-3)});
    const Plan& plan = prog.plan();
    int gemms = 0;
    for (const PlanStep& s : plan.steps) {
      if (!is_gemm(s.op)) continue;
      ++gemms;
      for (const BufferRef& b : s.in)
        if (is_float(b.type.dtype)) {
          EXPECT_EQ(b.type.dtype, low) << s.name;
        }
      // Forward and input-gradient GEMMs write 16 bits; weight gradients go to the f32
      // gradient buffer straight from the GEMM (its cast folded in).
      for (const BufferRef& b : s.out)
        if (is_float(b.type.dtype)) {
          EXPECT_EQ(b.type.dtype, b.region == Region::grads ? DType::f32 : low) << s.name;
        }
    }
    EXPECT_GE(gemms, 4);
    for (const Binding& b : plan.grads) EXPECT_EQ(b.ref.type.dtype, DType::f32) << b.name;
    for (const Slot& s : m.layout().params) EXPECT_EQ(s.type.dtype, DType::f32) << s.name;
    EXPECT_EQ(plan.output(loss.name())->ref.type.dtype, DType::f32);
    // No cast is left on a GEMM's result: each folded into the GEMM that made it. (The
    // step that last wrote a cast's input before it is not a GEMM.)
    for (size_t j = 0; j < plan.steps.size(); ++j) {
      const PlanStep& s = plan.steps[j];
      if (s.op != Op::cast) continue;
      for (size_t i = j; i-- > 0;) {
        const PlanStep& t = plan.steps[i];
        bool writes = false;
        for (const BufferRef& o : t.out) writes = writes || (o.region == s.in[0].region && o.offset == s.in[0].offset);
        if (!writes) continue;
        EXPECT_FALSE(is_gemm(t.op)) << s.name << " casts " << t.name << "'s result";
        break;
      }
    }
  }
}

// A convolution's weight gradient folds its cast as a GEMM's does: written in f32 from
// 16-bit operands, no cast kernel after it, and the same training as the unfused plan.
TEST(Precision, ConvolutionWeightGradientsAreWrittenInF32WithoutACast) {
  Graph g;
  Var x = g.input("x", {4, 3, 8, 8});
  Var h = relu(nn::conv2d(x, 6, 3, "c1", {.padding = {1, 1}}));
  Var logits = nn::linear(flatten(h), 5, "fc");
  Var loss = cross_entropy(logits, g.input("y", {4}, DType::i32));
  for (Precision p : {Precision::bf16, Precision::f16}) {
    Model m(g, {.seed = 2, .precision = p});
    Program prog = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
    int wgrads = 0;
    for (const PlanStep& s : prog.plan().steps) {
      if (s.op != Op::conv2d_grad_weight) continue;
      ++wgrads;
      EXPECT_EQ(s.in[0].type.dtype, *low_dtype(p)) << s.name;
      EXPECT_EQ(s.out[0].type.dtype, DType::f32) << s.name;
      EXPECT_EQ(s.out[0].region, Region::grads) << s.name;
    }
    EXPECT_EQ(wgrads, 1);
    Model u(g, {.seed = 2, .precision = p});
    Program unfused = u.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1), .fuse = false});
    const auto xs = random_floats(4 * 3 * 8 * 8, 9);
    const std::vector<int32_t> ys{0, 3, 1, 4};
    for (Program* q : {&prog, &unfused}) {
      q->set_input("x", std::span<const float>(xs));
      q->set_input("y", std::span<const int32_t>(ys));
      q->run();
    }
    // Unfused, the gradient is rounded to 16 bits before its cast back: within that rounding.
    const auto a = as_floats(m.read_param("c1.weight"), DType::f32), b = as_floats(u.read_param("c1.weight"), DType::f32);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-3 * (1 + std::abs(b[i]))) << i;
  }
}

// A parameter broadcast over the batch (a position table): its gradient is dy summed over
// the batch, which sum_to writes as a sum keeping the axis and a reshape dropping it. The
// cast to the f32 gradient folds into the sum, which drops the axis itself: the sum is
// written in f32 straight into the gradient buffer, not rounded to 16 bits first, and no
// cast kernel runs.
TEST(Precision, ABroadcastParametersGradientIsSummedIntoF32) {
  Graph g;
  Var x = g.input("x", {4, 6, 8});
  Var h = add(tanh(nn::linear(x, 8, "fc")), g.param("pos", {6, 8}, Init::normal(0, 0.1)));
  Var loss = cross_entropy(reshape(nn::linear(h, 5, "head"), {24, 5}), g.input("y", {24}, DType::i32));
  for (Precision p : {Precision::bf16, Precision::f16}) {
    SCOPED_TRACE(precision_name(p));
    Model m(g, {.seed = 2, .precision = p});
    Program prog = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
    const Binding* pos = prog.plan().grad("pos");
    ASSERT_NE(pos, nullptr);
    int sums = 0;
    for (const PlanStep& s : prog.plan().steps) {
      if (s.op == Op::cast) EXPECT_NE(s.out[0].region, Region::grads) << prog.plan().str();  // the input's cast stays
      if (s.op != Op::sum || s.out[0].region != Region::grads || s.out[0].offset != pos->ref.offset) continue;
      ++sums;
      EXPECT_EQ(s.out[0].type, (TensorType{DType::f32, {6, 8}}));
      EXPECT_EQ(s.attrs.i("keepdims"), 0);
    }
    EXPECT_EQ(sums, 1) << prog.plan().str();
    Model u(g, {.seed = 2, .precision = p});
    Program unfused = u.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1), .fuse = false});
    const auto xs = random_floats(4 * 6 * 8, 5);
    std::vector<int32_t> ys(24);
    for (size_t i = 0; i < ys.size(); ++i) ys[i] = static_cast<int32_t>(i * 7 % 5);
    for (Program* q : {&prog, &unfused}) {
      q->set_input("x", std::span<const float>(xs));
      q->set_input("y", std::span<const int32_t>(ys));
      q->run();
    }
    // Unfused, the sum is rounded to 16 bits before its cast back: within that rounding.
    const auto a = as_floats(m.read_param("pos"), DType::f32), b = as_floats(u.read_param("pos"), DType::f32);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-3 * (1 + std::abs(b[i]))) << i;
  }
}

TEST(Precision, StoredValuesAre16BitValuesAndReadBackInTheGraphsDtype) {
  Graph g;
  Var x = g.input("x", {8, 24});
  Var logits = nn::linear(relu(nn::linear(x, 32, "fc1")), 5, "fc2");
  for (Precision p : {Precision::bf16, Precision::f16}) {
    Model m(g, {.seed = 1, .precision = p});
    Program prog = m.compile({.mode = Mode::eval, .outputs = {logits.id()}});
    EXPECT_EQ(prog.plan().output(logits.name())->ref.type.dtype, *low_dtype(p));
    const auto in = random_floats(8 * 24, 5);
    prog.set_input("x", std::span<const float>(in));
    prog.run();
    const auto out = prog.read_as<float>(logits.name());
    ASSERT_EQ(out.size(), 40u);
    for (float v : out) {
      const float back = p == Precision::bf16 ? bf16_to_float(float_to_bf16(v)) : f16_to_float(float_to_f16(v));
      EXPECT_EQ(back, v) << "not a " << precision_name(p) << " value";
    }
    // The same model in f32 gives nearly the same logits.
    Model ref(g, {.seed = 1});
    Program rp = ref.compile({.mode = Mode::eval, .outputs = {logits.id()}});
    rp.set_input("x", std::span<const float>(in));
    rp.run();
    const auto want = rp.read_as<float>(logits.name());
    double err = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) err += std::pow(out[i] - want[i], 2), norm += std::pow(want[i], 2);
    EXPECT_LT(std::sqrt(err / norm), p == Precision::bf16 ? 2e-2 : 3e-3);
  }
}

TEST(Precision, Bf16AndF16TrainingTrackTheF32LossCurve) {
  const auto ref = losses(Precision::f32, 40);
  EXPECT_LT(ref.back(), 0.5 * ref.front());  // it learns
  for (Precision p : {Precision::bf16, Precision::f16}) {
    const auto got = losses(p, 40);
    for (size_t s = 0; s < ref.size(); ++s)
      EXPECT_NEAR(got[s], ref[s], 0.03 + 0.05 * ref[s]) << precision_name(p) << " step " << s;
  }
}

TEST(Precision, AnOverrideKeepsALayerInF32) {
  Graph g;
  Var loss = scoped_mlp(g, 16, 20, {32}, 4);
  Model m(g, {.precision = Precision::bf16, .precision_overrides = {{"fc2", Precision::f32}}});
  Program prog = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
  bool saw_fc1 = false, saw_fc2 = false;
  for (const PlanStep& s : prog.plan().steps) {
    if (s.op != Op::linear && s.op != Op::linear_act) continue;
    const DType want = s.name.rfind("fc2", 0) == 0 ? DType::f32 : DType::bf16;
    (want == DType::f32 ? saw_fc2 : saw_fc1) = true;
    EXPECT_EQ(s.in[0].type.dtype, want) << s.name;
    EXPECT_EQ(s.out[0].type.dtype, want) << s.name;
  }
  EXPECT_TRUE(saw_fc1 && saw_fc2);
  // And the other way round: one layer in bf16 in an f32 model.
  Model m2(g, {.precision_overrides = {{"fc1", Precision::bf16}}});
  Program p2 = m2.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
  int low = 0;
  for (const PlanStep& s : p2.plan().steps)
    if (is_gemm(s.op) && s.in[0].type.dtype == DType::bf16) ++low;
  EXPECT_GE(low, 2);  // fc1's forward and its weight gradient
  const auto a = losses(Precision::f32, 5), b = losses(Precision::f32, 5, {{"fc3", Precision::bf16}});
  for (size_t s = 0; s < a.size(); ++s) EXPECT_NEAR(a[s], b[s], 0.02 + 0.02 * a[s]);
}

TEST(Precision, BadOverridesNameTheLayer) {
  Graph g;
  Var loss = scoped_mlp(g, 4, 6, {8}, 3);
  auto make = [&](std::vector<PrecisionOverride> o) {
    return error_of([&] { Model m(g, {.precision = Precision::bf16, .precision_overrides = std::move(o)}); });
  };
  std::string e = make({{"fc9", Precision::f32}});
  EXPECT_NE(e.find("precision override 'fc9': the graph has no node or scope of that name"), std::string::npos) << e;
  e = make({{"fc1", Precision::tf32}});
  EXPECT_NE(e.find("precision override 'fc1': tf32 is a policy for a whole model"), std::string::npos) << e;
  e = make({{loss.name(), Precision::f16}});
  EXPECT_NE(e.find("cross_entropy node '" + loss.name() + "' computes in f32 at every precision"), std::string::npos)
      << e;
  EXPECT_EQ(make({{"fc1", Precision::f32}}), "");
}

TEST(Precision, FusedAndUnfusedPlansAgreeAt16Bits) {
  Graph g;
  Var loss = mlp_loss(g, 32, 24, {48, 48}, 6);
  for (Precision p : {Precision::bf16, Precision::f16}) {
    std::vector<std::vector<float>> grads;
    for (bool fuse : {true, false}) {
      Model m(g, {.seed = 9, .precision = p});
      Program prog = m.compile({.loss = loss.id(), .gradients = true, .fuse = fuse});
      const auto x = random_floats(32 * 24, 3);
      const auto y = random_labels(32, 6, 4);
      prog.set_input("x", std::span<const float>(x));
      prog.set_input("y", std::span<const int32_t>(y));
      prog.run();
      grads.push_back(prog.grad_as<float>("fc1.weight"));
    }
    double err = 0, norm = 0;
    for (size_t i = 0; i < grads[0].size(); ++i)
      err += std::pow(grads[0][i] - grads[1][i], 2), norm += std::pow(grads[1][i], 2);
    EXPECT_LT(std::sqrt(err / norm), p == Precision::bf16 ? 2e-2 : 3e-3) << precision_name(p);
  }
}

TEST(Precision, TheUpdateKeepsTheWorkingCopiesInPlaceOfCastKernels) {
  Graph g;
  Var loss = scoped_mlp(g, 16, 20, {32}, 4);
  Model m(g, {.seed = 4, .precision = Precision::bf16});
  Program train = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-2)});
  const Plan& plan = train.plan();
  ASSERT_EQ(plan.working, DType::bf16);
  int reads = 0;
  for (const PlanStep& s : plan.steps) {
    for (const BufferRef& b : s.in) reads += b.region == Region::working;
    if (s.op == Op::cast) {
      EXPECT_NE(s.in[0].region, Region::params) << s.name << ": a parameter cast left as a step";
    }
  }
  EXPECT_EQ(reads, 5);  // both layers forward (weight, bias), fc2.weight for the input gradient
  const auto x = random_floats(16 * 20, 1);
  const auto y = random_labels(16, 4, 2);
  train.set_input("x", std::span<const float>(x));
  train.set_input("y", std::span<const int32_t>(y));
  for (int s = 0; s < 3; ++s) train.run();
  // An evaluation program reads the copies the update wrote: its loss is the one a model
  // made fresh from the trained masters computes.
  Program eval = m.compile({.mode = Mode::eval, .outputs = {loss.id()}});
  eval.set_input("x", std::span<const float>(x));
  eval.set_input("y", std::span<const int32_t>(y));
  eval.run();
  Model fresh(g, {.seed = 4, .precision = Precision::bf16});
  fresh.load_tensors(m.save_tensors());
  Program fe = fresh.compile({.mode = Mode::eval, .outputs = {loss.id()}});
  fe.set_input("x", std::span<const float>(x));
  fe.set_input("y", std::span<const int32_t>(y));
  fe.run();
  EXPECT_EQ(eval.read(loss.name()), fe.read(loss.name()));
  // Parameters written by hand reach the copies before the next run.
  const auto before = eval.read(loss.name());
  std::vector<float> zeros(32 * 20, 0.0f);
  m.write_param("fc1.weight", std::as_bytes(std::span(zeros)));
  eval.run();
  EXPECT_NE(eval.read(loss.name()), before);
  fresh.write_param("fc1.weight", std::as_bytes(std::span(zeros)));
  fe.run();
  EXPECT_EQ(eval.read(loss.name()), fe.read(loss.name()));
  m.reset();
  fresh.reset();
  eval.run();
  fe.run();
  EXPECT_EQ(eval.read(loss.name()), fe.read(loss.name()));
}

// Parameters and moments, for bitwise comparisons.
std::vector<HostTensor> trained_state(const Model& m) { return m.save_tensors(); }

TEST(Guard, ANonFiniteLossSkipsTheUpdateAndCountsIt) {
  Graph g;
  Var loss = scoped_mlp(g, 8, 12, {16}, 3);
  auto x = random_floats(8 * 12, 1);
  const auto y = random_labels(8, 3, 2);
  Model m(g, {.seed = 1});
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-2)});
  p.set_input("y", std::span<const int32_t>(y));
  p.set_input("x", std::span<const float>(x));
  p.run();  // one clean step first, so moments are not zero
  const auto before = trained_state(m);
  x[5] = std::nanf("");
  p.set_input("x", std::span<const float>(x));
  p.run();
  StepState st = p.sync_state();
  expect_same(trained_state(m), before);  // parameters and moments untouched
  EXPECT_EQ(st.step, 2);                  // the schedule and dropout still count the step
  EXPECT_EQ(st.skipped_steps, 1);
  EXPECT_EQ(st.skip_streak, 1);
  x[5] = 0.5f;
  p.set_input("x", std::span<const float>(x));
  p.run();
  st = p.sync_state();
  EXPECT_EQ(st.skipped_steps, 1);
  EXPECT_EQ(st.skip_streak, 0);
  EXPECT_FALSE(m.save_tensors()[0].data == before[0].data);  // it updates again
  // Without the guard the NaN reaches the parameters.
  auto off = OptimizerConfig::adam(1e-2);
  off.skip_nonfinite = false;
  Model m2(g, {.seed = 1});
  Program p2 = m2.compile({.loss = loss.id(), .optimizer = off});
  x[5] = std::nanf("");
  p2.set_input("y", std::span<const int32_t>(y));
  p2.set_input("x", std::span<const float>(x));
  p2.run();
  EXPECT_EQ(p2.sync_state().skipped_steps, 0);
  const auto w = Program::cast_bytes<float>(m2.read_param("fc1.weight"));
  EXPECT_TRUE(std::any_of(w.begin(), w.end(), [](float v) { return std::isnan(v); }));
}

// A loss so large that its gradient overflows f16 (dlogits ~ 1e8 / rows > 65504): without
// scaling every step is skipped; dynamic scaling backs off below 1 until it fits, then
// trains.
TEST(Guard, F16OverflowsWithoutScalingAndTrainsWithDynamicScaling) {
  Graph g;
  Var h = g.input("x", {16, 12});
  Var y = g.input("y", {16}, DType::i32);
  {
    auto s = g.scope("fc1");
    h = relu(nn::linear(h, 32, "fc1"));
  }
  Var ce = cross_entropy(nn::linear(h, 4, "fc2"), y);
  Var loss = scale(ce, 1e8);
  const auto x = random_floats(16 * 12, 3);
  const auto labels = random_labels(16, 4, 4);
  auto run = [&](LossScaling::Mode mode, std::vector<float>* ces) {
    auto opt = OptimizerConfig::sgd(5e-9);  // the loss is 1e8 times the cross-entropy
    opt.loss_scaling.mode = mode;
    opt.loss_scaling.init = 1.0;
    Model m(g, {.seed = 2, .precision = Precision::f16});
    Program p = m.compile({.loss = loss.id(), .optimizer = opt, .outputs = {ce.id()}});
    p.set_input("x", std::span<const float>(x));
    p.set_input("y", std::span<const int32_t>(labels));
    for (int s = 0; s < 60; ++s) {
      p.run();
      if (ces) ces->push_back(p.read_as<float>(ce.name()).at(0));
    }
    return p.sync_state();
  };
  const StepState off = run(LossScaling::Mode::off, nullptr);
  EXPECT_EQ(off.skipped_steps, 60);
  EXPECT_EQ(off.skip_streak, 60);
  std::vector<float> ces;
  const StepState dyn = run(LossScaling::Mode::dynamic, &ces);
  EXPECT_GE(dyn.skipped_steps, 3);   // 1e8 / 16 over f16's 65504: a few halvings
  EXPECT_LE(dyn.skipped_steps, 12);
  EXPECT_LT(dyn.loss_scale, 1.0);
  EXPECT_EQ(dyn.skip_streak, 0);
  EXPECT_LT(ces.back(), 0.8 * ces.front()) << "it trains once the scale fits";
}

TEST(Guard, TheLossScaleGrowsAfterEnoughCleanSteps) {
  Graph g;
  Var loss = scoped_mlp(g, 8, 12, {16}, 3);
  auto opt = OptimizerConfig::adam(1e-3);
  opt.loss_scaling = {LossScaling::Mode::dynamic, 8.0, 2.0, 0.5, 3};
  Model m(g, {.seed = 1, .precision = Precision::bf16});
  Program p = m.compile({.loss = loss.id(), .optimizer = opt});
  const auto x = random_floats(8 * 12, 1);
  const auto y = random_labels(8, 3, 2);
  p.set_input("x", std::span<const float>(x));
  p.set_input("y", std::span<const int32_t>(y));
  for (int s = 0; s < 7; ++s) p.run();
  const StepState& st = p.sync_state();
  EXPECT_EQ(st.loss_scale, 32.0);  // x2 after steps 3 and 6
  EXPECT_EQ(st.scale_good, 1);
  EXPECT_EQ(st.skipped_steps, 0);
  // The gradient left after the update is the unscaled one: the same as an unscaled run's.
  Model ref(g, {.seed = 1, .precision = Precision::bf16});
  auto plain = OptimizerConfig::adam(1e-3);
  plain.loss_scaling.mode = LossScaling::Mode::off;
  Program rp = ref.compile({.loss = loss.id(), .optimizer = plain});
  rp.set_input("x", std::span<const float>(x));
  rp.set_input("y", std::span<const int32_t>(y));
  rp.run();
  Model one(g, {.seed = 1, .precision = Precision::bf16});
  Program op = one.compile({.loss = loss.id(), .optimizer = opt});
  op.set_input("x", std::span<const float>(x));
  op.set_input("y", std::span<const int32_t>(y));
  op.run();
  const auto a = op.grad_as<float>("fc1.weight"), b = rp.grad_as<float>("fc1.weight");
  double err = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) err += std::pow(a[i] - b[i], 2), norm += std::pow(b[i], 2);
  EXPECT_LT(std::sqrt(err / norm), 2e-2);  // bf16 rounding of the scaled backward differs
}

TEST(MasterWeights, WithoutMastersParametersAreStoredIn16BitsAndTrain) {
  Graph g;
  Var loss = scoped_mlp(g, 64, 48, {96, 64}, 10);
  Model m(g, {.seed = 3, .precision = Precision::bf16, .master_weights = false});
  EXPECT_EQ(m.layout().param_dtype, DType::bf16);
  Model masters(g, {.seed = 3, .precision = Precision::bf16});
  EXPECT_LE(m.layout().param_bytes, masters.layout().param_bytes / 2 + 64 * m.layout().params.size());  // slots stay aligned
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adamw(3e-3, 0.01)});
  EXPECT_FALSE(p.plan().working) << "the parameters are the 16-bit values";
  for (const Binding& b : p.plan().grads) EXPECT_EQ(b.ref.type.dtype, DType::bf16) << b.name;
  const auto x = random_floats(64 * 48, 1);
  const auto y = random_labels(64, 10, 2);
  p.set_input("x", std::span<const float>(x));
  p.set_input("y", std::span<const int32_t>(y));
  std::vector<float> got;
  for (int s = 0; s < 40; ++s) {
    p.run();
    got.push_back(p.read_as<float>(loss.name()).at(0));
  }
  const auto ref = losses(Precision::bf16, 40);  // with f32 masters
  EXPECT_LT(got.back(), 0.5 * got.front());
  for (size_t s = 0; s < ref.size(); ++s) EXPECT_NEAR(got[s], ref[s], 0.05 + 0.1 * ref[s]) << "step " << s;
  // Checkpoints hold the 16-bit parameters and f32 moments, and load back bitwise.
  const auto saved = m.save_tensors();
  for (const HostTensor& t : saved)
    EXPECT_EQ(t.type.dtype, t.name.rfind("optimizer.", 0) == 0 ? DType::f32 : DType::bf16) << t.name;
  Model again(g, {.seed = 8, .precision = Precision::bf16, .master_weights = false});
  again.load_tensors(saved);
  expect_same(again.save_tensors(), saved);
  // The same run twice: the stochastic rounding is a function of (seed, step, index).
  Model twin(g, {.seed = 3, .precision = Precision::bf16, .master_weights = false});
  Program tp = twin.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adamw(3e-3, 0.01)});
  tp.set_input("x", std::span<const float>(x));
  tp.set_input("y", std::span<const int32_t>(y));
  for (int s = 0; s < 40; ++s) tp.run();
  expect_same(twin.save_tensors(), saved);
}

// A 16-bit parameter read by an elementwise op (a gated residual's gamma) is read as it
// is: no cast of any parameter to f32 is left, forward or backward.
TEST(MasterWeights, ElementwiseOpsReadSixteenBitParametersAsTheyAre) {
  Graph g;
  Var x = g.input("x", {16, 24});
  Var gamma = g.param("gamma", {32}, Init::constant(0.1));
  Var loss = sum(mul(gamma, nn::linear(x, 32, "fc")));
  Model m(g, {.precision = Precision::bf16, .master_weights = false});
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1), .fuse = false});
  for (const PlanStep& s : p.plan().steps) {
    for (const BufferRef& b : s.in) {
      if (b.region == Region::params) {
        EXPECT_EQ(s.op == Op::cast, false) << s.name << " casts a parameter\n" << p.plan().str();
      }
    }
    if (s.op == Op::mul) {
      EXPECT_EQ(s.in[0].type.dtype, DType::bf16) << s.name;
    }
  }
}

// Updates of 1e-4 a step on values near 1, where a bf16 unit is 2^-7: rounded to nearest
// the parameters would never move; rounded stochastically they move by the sum of the
// updates on average.
TEST(MasterWeights, StochasticRoundingKeepsUpdatesBelowHalfAUnit) {
  Graph g;
  Var w = g.param("w", {4096}, Init::ones());
  Var d = g.input("d", {4096});
  Var loss = sum(mul(w, d));
  Model m(g, {.seed = 5, .precision = Precision::bf16, .master_weights = false});
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(1e-4)});
  const std::vector<float> ones(4096, 1.0f);
  p.set_input("d", std::span<const float>(ones));
  for (int s = 0; s < 200; ++s) p.run();
  const auto bits = m.read_param("w");
  double mean = 0;
  std::set<uint16_t> distinct;
  for (size_t i = 0; i < 4096; ++i) {
    uint16_t h;
    std::memcpy(&h, bits.data() + 2 * i, 2);
    distinct.insert(h);
    mean += bf16_to_float(h) / 4096.0;
  }
  EXPECT_NEAR(mean, 1.0 - 200 * 1e-4, 2e-3);
  EXPECT_GT(distinct.size(), 1u);
}

// Each value rounds to one of its two neighbours, the expected result being the value:
// positive and negative, normal and subnormal, bf16 and f16.
TEST(MasterWeights, StochasticRoundingIsUnbiasedBetweenTheTwoNeighbours) {
  for (DType t : {DType::bf16, DType::f16}) {
    auto near = [t](float f) { return float_to_half(f, t); };
    auto value = [t](uint16_t h) { return half_to_float(h, t); };
    for (float x : {1.0f + 1e-3f, -3.14159f, 1e-6f, -2.5e-7f, 65000.0f, 0.1f}) {
      if (t == DType::bf16 && std::fabs(x) < 1e-5f) x *= 1e-33f;  // bf16 subnormals (as f32 ones)
      const uint16_t n = near(x);
      double mean = 0;
      std::set<uint16_t> seen;
      constexpr int kDraws = 20000;
      for (int k = 0; k < kDraws; ++k) {
        const uint16_t r = round_stochastic(x, n, value, (static_cast<float>(k) + 0.5f) / kDraws);
        seen.insert(r);
        mean += static_cast<double>(value(r)) / kDraws;
      }
      EXPECT_LE(seen.size(), 2u) << dtype_name(t) << " " << x;
      // The other result is the neighbour on x's other side, one unit from the nearest.
      double spread = 0;
      for (uint16_t r : seen) {
        if (r == n) continue;
        EXPECT_EQ(std::abs((r & 0x7FFF) - (n & 0x7FFF)), 1) << dtype_name(t) << " " << x;
        EXPECT_LT((static_cast<double>(value(r)) - x) * (static_cast<double>(value(n)) - x), 0.0) << dtype_name(t) << " " << x;
        spread = std::fabs(static_cast<double>(value(r)) - value(n));
      }
      // Evenly spaced draws: the mean is x within one draw's share of the gap.
      EXPECT_NEAR(mean, x, 2 * spread / kDraws + 1e-7 * std::fabs(x)) << dtype_name(t) << " " << x;
    }
    EXPECT_EQ(round_stochastic(1.0f, near(1.0f), value, 0.99f), near(1.0f)) << "exact values stay";
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(round_stochastic(inf, near(inf), value, 0.5f), near(inf));
  }
}

TEST(MasterWeights, WithoutMastersNeedsA16BitPolicy) {
  Graph g;
  scoped_mlp(g, 4, 6, {8}, 3);
  const std::string e = error_of([&] { Model m(g, {.precision = Precision::tf32, .master_weights = false}); });
  EXPECT_NE(e.find("master_weights = false stores the parameters in 16 bits: it needs precision bf16 or f16, got tf32"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace seam::testing
