// attention and its gradient on the GPU (src/backend/cuda/attention.cu) against the CPU
// reference: lengths from 1 to 300 (not multiples of 64 among them), head sizes 64 and
// 128 and odd ones, causal and not, f32 and through the bf16 policy; and a whole tiny GPT.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_check.h"
#include "seam/nn.h"

namespace seam::gpu_testing {
namespace {

struct Case {
  int64_t b, h, tq, tk, d, dv;
  bool causal;
  std::string str() const {
    return "B " + std::to_string(b) + " H " + std::to_string(h) + " Tq " + std::to_string(tq) + " Tk " +
           std::to_string(tk) + " D " + std::to_string(d) + " Dv " + std::to_string(dv) + (causal ? " causal" : "");
  }
};

std::vector<Case> cases() {
  return {
      {1, 1, 1, 1, 64, 64, true},      // one token
      {2, 3, 37, 37, 64, 64, true},    // a length no tile divides
      {1, 2, 130, 130, 128, 128, true},
      {2, 2, 65, 300, 64, 64, false},  // more keys than queries
      {1, 1, 300, 7, 40, 24, false},   // few keys, odd head sizes
      {1, 2, 257, 257, 256, 256, false},
  };
}

Var build(GpuCase& c, const Case& k) {
  return attention(c.param("q", {k.b, k.h, k.tq, k.d}, -2, 2), c.param("k", {k.b, k.h, k.tk, k.d}, -2, 2),
                   c.param("v", {k.b, k.h, k.tk, k.dv}), k.causal);
}

// f32 sums of up to 300 products of O(1) terms (the CPU sums in double): an element whose
// terms cancel carries their rounding, about sqrt(300) * 6e-8 of their size, above
// f32()'s atol of 1e-6.
TEST(GpuAttention, MatchesTheCpuInF32) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.str());
    compare_with_cpu([&](GpuCase& c) { return build(c, k); }, CompareOptions(Precision::f32, {1e-5, 1e-4, 1e-5}));
  }
}

TEST(GpuAttention, MatchesTheCpuInBf16) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.str());
    compare_with_cpu([&](GpuCase& c) { return build(c, k); }, gpu_testing::bf16());
  }
}

TEST(GpuAttention, HeadsBeyondTheKernelsAreRefusedByName) {
  GpuCase c(1);
  Var o = attention(c.param("q", {1, 1, 4, 320}), c.param("k", {1, 1, 4, 320}), c.param("v", {1, 1, 4, 8}));
  Model m(c.g, {.seed = 1, .device = Device::cuda});
  try {
    Program p = m.compile({.mode = Mode::eval, .outputs = {o.id()}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head sizes up to 256 on the GPU, got D = 320"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace seam::gpu_testing

namespace seam::gpu_testing {
namespace {

// A whole GPT (nn::gpt: embeddings, layer norms, attention, GELU MLPs, the tied output
// projection over a padded vocabulary) forward and backward on the GPU against the CPU:
// the logits and every parameter's gradient.
Var tiny_gpt(GpuCase& c) {
  nn::GptConfig cfg;
  cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 64, cfg.vocab = 100, cfg.padded_vocab = 128, cfg.block_size = 40;
  return nn::gpt(c.labels("tokens", {3, 37}, 100), cfg);
}

// As the other whole-network tests, by each tensor's relative L2 error: through two
// blocks of layer norms and 111-row sums an element of bf16 gradient whose terms cancel
// can be off by much of itself (measured on the H200: wpe's element 122, 0.031 on the
// CPU, -0.109 on the GPU, inside a tensor within 1e-2), and in f32 an element of wte's
// gradient came out 4e-3 of itself (1.4e-5) off.
TEST(GpuGpt, OneStepMatchesTheCpuInF32) {
  compare_with_cpu(tiny_gpt, CompareOptions(Precision::f32, {1e-4, 1e-2, 1e-4}));
}

TEST(GpuGpt, OneStepMatchesTheCpuInBf16) {
  compare_with_cpu(tiny_gpt, CompareOptions(Precision::bf16, {1e-2, 1e9, 1e9}));
}

}  // namespace
}  // namespace seam::gpu_testing
