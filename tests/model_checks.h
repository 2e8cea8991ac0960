// Checks of Model and Program that hold on every device: the CPU tests run them on the
// CPU (test_model.cpp), the GPU tests on the GPU (gpu/test_gpu_model.cpp).
#pragma once
#include <gtest/gtest.h>

#include <optional>

#include "seam/seam.h"
#include "test_util.h"

namespace seam::testing {

// Batch norm (running statistics), dropout (seeded by the step), a clipped AdamW
// (moments, the step counter) and parameters large enough (over 1 MB) that freed storage
// is given back to the system rather than kept readable.
struct CheckNet {
  Graph g;
  Var loss;
  OptimizerConfig opt = OptimizerConfig::adamw(1e-3, 0.01);
  CheckNet() {
    Var x = g.input("x", {16, 64});
    Var y = g.input("y", {16}, DType::i32);
    Var h = relu(nn::batch_norm(nn::linear(x, 512, "fc1"), "bn"));
    h = relu(nn::linear(dropout(h, 0.25), 512, "fc2"));
    loss = cross_entropy(nn::linear(h, 10, "fc3"), y);
    opt.clip_norm = 0.5;
  }
  void feed(Program& p, uint64_t step) const {
    const auto x = random_floats(16 * 64, 100 + step);
    const auto y = random_labels(16, 10, 200 + step);
    p.set_input("x", std::span<const float>(x));
    p.set_input("y", std::span<const int32_t>(y));
  }
};

inline void expect_same(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_TRUE(a[i].data == b[i].data) << "tensor " << a[i].name << " differs";
  }
}

// A program whose model is gone trains on, step for step as one whose model is alive.
inline void expect_a_program_outlives_its_model(Device d) {
  CheckNet net;
  std::optional<Program> orphan;
  {
    Model m(net.g, {.seed = 5, .device = d});
    orphan.emplace(m.compile({.loss = net.loss.id(), .optimizer = net.opt}));
  }
  Model ref(net.g, {.seed = 5, .device = d});
  Program kept = ref.compile({.loss = net.loss.id(), .optimizer = net.opt});
  for (uint64_t s = 0; s < 3; ++s) {
    net.feed(*orphan, s);
    net.feed(kept, s);
    orphan->run();
    kept.run();
    EXPECT_EQ(orphan->read(net.loss.name()), kept.read(net.loss.name())) << "step " << s;
    EXPECT_EQ(orphan->read_grad("fc1.weight"), kept.read_grad("fc1.weight")) << "step " << s;
  }
  // Moving a program keeps its share of the storage.
  Program moved = std::move(*orphan);
  orphan.reset();
  net.feed(moved, 3);
  net.feed(kept, 3);
  moved.run();
  kept.run();
  EXPECT_EQ(moved.read(net.loss.name()), kept.read(net.loss.name()));
}

// Timing each step alone replays the optimizer, batch norm's statistics and dropout's
// draws; afterwards the model (and the backend's own step counter) is bitwise as before:
// the next steps match a model that was never timed.
// At a mixed precision the parameters' working copies are kept as they were too.
inline void expect_timing_leaves_the_model_as_it_was(Device d, Precision p = Precision::f32) {
  CheckNet net;
  const ModelOptions o{.seed = 4, .device = d, .precision = p};
  Model timed(net.g, o), untimed(net.g, o);
  Program pt = timed.compile({.loss = net.loss.id(), .optimizer = net.opt});
  Program pu = untimed.compile({.loss = net.loss.id(), .optimizer = net.opt});
  for (uint64_t s = 0; s < 3; ++s) {
    net.feed(pt, s);
    net.feed(pu, s);
    pt.run();
    pu.run();
  }
  const auto saved = timed.save_tensors();
  const StepState state = timed.state();
  const auto ms = pt.time_steps(3);
  EXPECT_GE(ms.size(), pt.plan().steps.size());
  expect_same(timed.save_tensors(), saved);
  EXPECT_EQ(timed.state().step, state.step);
  EXPECT_EQ(timed.state().lr, state.lr);
  EXPECT_EQ(timed.state().grad_norm, state.grad_norm);
  EXPECT_EQ(pt.read_grad("fc2.weight"), pu.read_grad("fc2.weight"));
  // The inputs are in place: a step without new ones matches the untimed model's, and so
  // do the steps after.
  pt.run();
  pu.run();
  EXPECT_EQ(pt.read(net.loss.name()), pu.read(net.loss.name()));
  for (uint64_t s = 3; s < 5; ++s) {
    net.feed(pt, s);
    net.feed(pu, s);
    pt.run();
    pu.run();
  }
  EXPECT_EQ(pt.read(net.loss.name()), pu.read(net.loss.name()));
  expect_same(timed.save_tensors(), untimed.save_tensors());
}

}  // namespace seam::testing
