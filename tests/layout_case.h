// A small residual CNN with every op the layout pass moves channels-last (conv2d with and
// without bias, batch norm, max and average pooling, a residual add, a per-channel scale
// broadcast from a [C, 1, 1] parameter, global average pooling) and a boundary it must
// convert back at (dropout, flatten): for the tests that the layout never changes results
// (test_layout.cpp on the CPU, gpu/test_gpu_train.cpp on the GPU).
#pragma once
#include <gtest/gtest.h>

#include <cmath>

#include "seam/seam.h"
#include "test_util.h"

namespace seam::testing {

struct LayoutNet {
  static constexpr int64_t kBatch = 4, kClasses = 10;
  Graph g;
  Var loss, logits, stem;
  LayoutNet() {
    Var x = g.input("x", {kBatch, 3, 16, 16});
    Var y = g.input("y", {kBatch}, DType::i32);
    stem = nn::conv2d(x, 8, 3, "stem", {.padding = {1, 1}}, false);
    Var h = relu(nn::batch_norm(stem, "stem_bn"));
    h = max_pool2d(h, {2, 2});  // 8x8
    Var scale = g.param("scale", {8, 1, 1}, Init::uniform(0.5, 1.5));
    Var r = relu(nn::batch_norm(nn::conv2d(h, 8, 3, "b1c1", {.padding = {1, 1}}, false), "b1bn1"));
    r = mul(nn::batch_norm(nn::conv2d(r, 8, 3, "b1c2", {.padding = {1, 1}}, false), "b1bn2"), scale);
    h = relu(add(r, h));
    // A downsampling block: 3x3 stride 2 and a 1x1 stride-2 shortcut with a bias.
    Var d = relu(nn::batch_norm(nn::conv2d(h, 16, 3, "b2c1", {.stride = {2, 2}, .padding = {1, 1}}, false), "b2bn1"));
    d = nn::batch_norm(nn::conv2d(d, 16, 3, "b2c2", {.padding = {1, 1}}, false), "b2bn2");
    Var s = nn::conv2d(h, 16, 1, "b2down", {.stride = {2, 2}});
    h = relu(add(d, s));  // 4x4
    Var pooled = avg_pool2d(h, {2, 2});  // 2x2
    Var a = global_avg_pool(pooled);
    Var f = flatten(dropout(pooled, 0.1));
    logits = add(nn::linear(f, kClasses, "fc"), nn::linear(a, kClasses, "fc_gap"));
    loss = cross_entropy(logits, y);
  }
  void feed(Program& p, uint64_t step) const {
    const auto x = random_floats(static_cast<size_t>(kBatch * 3 * 16 * 16), 300 + step);
    const auto y = random_labels(static_cast<size_t>(kBatch), static_cast<int32_t>(kClasses), 400 + step);
    p.set_input("x", std::span<const float>(x));
    p.set_input("y", std::span<const int32_t>(y));
  }
};

// Every parameter of a and b (the same graph) agrees within rel * (1 + |a|), element by
// element, in the parameters' dtype.
inline void expect_same_params(const Model& a, const Model& b, double rel) {
  for (const Slot& s : a.layout().params) {
    const auto wa = as_floats(a.read_param(s.name), s.type.dtype), wb = as_floats(b.read_param(s.name), s.type.dtype);
    ASSERT_EQ(wa.size(), wb.size()) << s.name;
    for (size_t i = 0; i < wa.size(); ++i)
      ASSERT_NEAR(wa[i], wb[i], rel * (1 + std::abs(wa[i]))) << s.name << " element " << i;
  }
}

// One net compiled twice from one seed, with and without fusion; train() runs three steps
// of both and expects the same losses, then the same parameters.
struct FusedAndPlain {
  Model a, b;
  Program fused, plain;
  // fuse_elementwise false: the fused plan's other fusions without elementwise groups,
  // so that what they leave can be counted.
  FusedAndPlain(const Graph& g, Var loss, uint64_t seed, LayoutPolicy layout, bool fuse_elementwise = true)
      : a(g, {.seed = seed, .layout = layout}),
        b(g, {.seed = seed, .layout = layout}),
        fused(a.compile({.loss = loss.id(), .optimizer = kSgd, .fuse_elementwise = fuse_elementwise})),
        plain(b.compile({.loss = loss.id(), .optimizer = kSgd, .fuse = false})) {}
  template <class Net>
  void train(const Net& net) {
    for (uint64_t step = 0; step < 3; ++step) {
      net.feed(fused, step);
      net.feed(plain, step);
      fused.run();
      plain.run();
      const float la = fused.read_as<float>(net.loss.name())[0], lb = plain.read_as<float>(net.loss.name())[0];
      EXPECT_NEAR(la, lb, 1e-5 * std::abs(lb)) << "step " << step;
    }
    expect_same_params(a, b, 1e-5);
  }
  static inline const OptimizerConfig kSgd = OptimizerConfig::sgd(0.05, 0.9, 5e-4);
};

}  // namespace seam::testing
