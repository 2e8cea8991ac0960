// attention and its gradient on the GPU (src/backend/cuda/attention.h) against the CPU
// reference: lengths from 1 to 2048 (not multiples of 64 among them), head sizes 64 and
// 128 and odd ones, causal and not, f32 and through the bf16 and f16 policies, each of
// the four variants alone and paired across forward and backward; and a whole tiny GPT.
#include <gtest/gtest.h>

#include <cstdlib>
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

// Sets SEAM_ATTENTION (attention.cu) for the lifetime of the object.
class ForcedVariant {
 public:
  explicit ForcedVariant(const std::string& v) { setenv("SEAM_ATTENTION", v.c_str(), 1); }
  ~ForcedVariant() { unsetenv("SEAM_ATTENTION"); }
};

// Compiling attention output o on the GPU (eval) fails with a message holding `want`.
void expect_compile_error(GpuCase& c, Var o, Precision precision, const std::string& want) {
  Model m(c.g, {.seed = 1, .device = Device::cuda, .precision = precision});
  try {
    Program p = m.compile({.mode = Mode::eval, .outputs = {o.id()}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

// The fast paths' shapes: lengths from 1 to 2048 (tiles of 64 and 32, one partial), head
// sizes 64 and 128, causal and not, more keys than queries and fewer.
std::vector<Case> fast_cases() {
  return {
      {1, 1, 1, 1, 64, 64, true},         {2, 3, 37, 37, 64, 64, true},       {1, 2, 64, 64, 128, 128, true},
      {2, 2, 130, 130, 64, 64, false},    {1, 2, 65, 300, 128, 128, false},  {1, 3, 200, 40, 64, 64, false},
      {1, 2, 257, 257, 128, 128, true},   {2, 2, 1024, 1024, 64, 64, true},  {1, 1, 2048, 2048, 64, 64, true},
      {1, 1, 2048, 2048, 128, 128, true}, {1, 1, 1000, 1000, 128, 128, false},
  };
}

// Each variant alone, forward and backward, in bf16 and f16 (the CPU rounds the same
// operands; the tensor-core kernels also round P and dS to 16 bits before their products,
// which the CPU does not, within the precisions' tolerances).
// cuDNN 9.14 refuses one query with one key ("s_q = s_kv = 1 is not supported"): there the
// choice falls back to another variant (MatchesTheCpuInBf16's first case). The fused
// variants' backwards add dq with atomics unless the plan is deterministic: both ways.
void expect_variant_matches(const std::string& variant) {
  ForcedVariant force(variant);
  for (const Case& k : fast_cases())
    if (variant != "cudnn" || k.tq > 1 || k.tk > 1)
      for (const CompareOptions& o : {gpu_testing::bf16(), gpu_testing::f16(), gpu_testing::bf16().fixed()}) {
        SCOPED_TRACE(variant + " " + k.str() + (o.precision == Precision::bf16 ? " bf16" : " f16") +
                     (o.deterministic ? " deterministic" : ""));
        compare_with_cpu([&](GpuCase& c) { return build(c, k); }, o);
      }
}

TEST(GpuAttention, TiledKernelsMatchTheCpu) { expect_variant_matches("flash"); }
TEST(GpuAttention, GemmVariantMatchesTheCpuIn16Bits) { expect_variant_matches("gemm"); }

// The gemm variant where it is the fast one: f32 storage, exact and TF32, every head size
// up to the plain kernels' 256; and heads in chunks (9 heads of 1500 x 1500 scores take
// 81 MiB, a chunk 64: seven heads, then two).
TEST(GpuAttention, GemmVariantMatchesTheCpuInF32AndTf32) {
  ForcedVariant force("gemm");
  std::vector<Case> all = cases();
  all.push_back({1, 9, 1500, 1500, 64, 64, true});
  for (const Case& k : all)
    for (const CompareOptions& o : {CompareOptions(Precision::f32, {1e-5, 1e-4, 1e-5}), gpu_testing::tf32()}) {
      SCOPED_TRACE(k.str() + (o.precision == Precision::f32 ? " f32" : " tf32"));
      compare_with_cpu([&](GpuCase& c) { return build(c, k); }, o);
    }
}
TEST(GpuAttention, CudnnMatchesTheCpu) { expect_variant_matches("cudnn"); }

// A forward of one variant with the backward of another: they share lse.
TEST(GpuAttention, VariantsPairAcrossForwardAndBackward) {
  for (const char* pair : {"cudnn,flash", "flash,cudnn", "plain,flash", "flash,plain", "gemm,cudnn", "flash,gemm"}) {
    ForcedVariant force(pair);
    for (const Case& k : {Case{2, 2, 130, 130, 64, 64, true}, Case{1, 2, 65, 300, 128, 128, false}}) {
      SCOPED_TRACE(std::string(pair) + " " + k.str());
      compare_with_cpu([&](GpuCase& c) { return build(c, k); }, gpu_testing::bf16());
    }
  }
}

TEST(GpuAttention, AForcedVariantThatCannotRunIsAnError) {
  ForcedVariant force("flash");
  GpuCase c(1);
  Var o = attention(c.param("q", {1, 1, 8, 40}), c.param("k", {1, 1, 8, 40}), c.param("v", {1, 1, 8, 40}));
  expect_compile_error(c, o, Precision::bf16,
                       "SEAM_ATTENTION asks for flash, which cannot run it: the tiled kernels take D = Dv = 64 or 128");
}

// The gemm variant stores one head's scores at most 256 MiB large: beyond, it says so.
TEST(GpuAttention, TheGemmVariantRefusesScoresBeyondItsLimitByName) {
  ForcedVariant force("gemm");
  GpuCase c(1);
  const Shape s{1, 1, 9000, 8};
  Var o = attention(c.param("q", s), c.param("k", s), c.param("v", s));
  expect_compile_error(c, o, Precision::f32,
                       "SEAM_ATTENTION asks for gemm, which cannot run it: one head's scores take 308 MiB, over the "
                       "256 MiB the gemm variant allows");
}

// Dropout of the probabilities: the plain and the tiled kernels draw the CPU's masks
// (cuDNN's generator could not, and declines), alone and paired across forward and
// backward, so both variants' masks are the same.
Var dropped_attention(GpuCase& c, const Case& k) {
  return attention(c.param("q", {k.b, k.h, k.tq, k.d}, -2, 2), c.param("k", {k.b, k.h, k.tk, k.d}, -2, 2),
                   c.param("v", {k.b, k.h, k.tk, k.dv}), k.causal, std::nullopt, 0.2);
}

TEST(GpuAttention, DropoutMatchesTheCpu) {
  for (const Case& k : {Case{2, 3, 37, 37, 64, 64, true}, Case{2, 2, 65, 300, 64, 64, false},
                        Case{1, 1, 300, 7, 40, 24, false}})
    for (const CompareOptions& o : {CompareOptions(Precision::f32, {1e-5, 1e-4, 1e-5}), gpu_testing::bf16()}) {
      SCOPED_TRACE(k.str() + (o.precision == Precision::bf16 ? " bf16" : " f32"));
      compare_with_cpu([&](GpuCase& c) { return dropped_attention(c, k); }, o);
    }
  for (const char* variant : {"flash", "flash,plain", "plain,flash", "gemm", "gemm,flash", "flash,gemm"}) {
    ForcedVariant force(variant);
    for (const Case& k : {Case{2, 2, 130, 130, 64, 64, true}, Case{1, 2, 65, 300, 128, 128, false}})
      for (const CompareOptions& o : {gpu_testing::bf16(), gpu_testing::f16(), gpu_testing::bf16().fixed()}) {
        SCOPED_TRACE(std::string(variant) + " " + k.str() + (o.precision == Precision::bf16 ? " bf16" : " f16") +
                     (o.deterministic ? " deterministic" : ""));
        compare_with_cpu([&](GpuCase& c) { return dropped_attention(c, k); }, o);
      }
  }
}

// Every path of the tiled kernels on two small shapes, sized for compute-sanitizer's
// memcheck and racecheck: the forward with two row tiles a warp (D = 64, a partial block
// of 128 queries) and with one (D = 128; dropout), the backward with dq's atomic sums and
// the deterministic one, with and without dropout.
TEST(GpuAttention, TiledKernelsEveryPathOnSmallShapes) {
  ForcedVariant force("flash");
  for (const Case& k : {Case{2, 3, 130, 130, 64, 64, true}, Case{1, 2, 65, 70, 128, 128, false}})
    for (const CompareOptions& o : {gpu_testing::bf16(), gpu_testing::bf16().fixed()}) {
      SCOPED_TRACE(k.str() + (o.deterministic ? " deterministic" : ""));
      compare_with_cpu([&](GpuCase& c) { return build(c, k); }, o);
      compare_with_cpu([&](GpuCase& c) { return dropped_attention(c, k); }, o);
    }
}

// q, k and v packed token by token as one [B, T, 3, H, D] operand, o [B, T, H, D]: each
// variant reads and writes them through strides, causal or not, at both tiled head sizes.
TEST(GpuAttention, PackedMatchesTheCpu) {
  const struct {
    Shape qkv;
    bool causal;
  } cases[] = {{{2, 130, 3, 3, 64}, true}, {{1, 70, 3, 2, 128}, false}};
  for (const char* variant : {"", "cudnn", "flash", "gemm", "plain"}) {
    ForcedVariant force(variant);
    for (const auto& k : cases)
      for (const CompareOptions& o : {gpu_testing::bf16(), gpu_testing::f16()}) {
        SCOPED_TRACE(std::string(variant) + " " + shape_str(k.qkv) + (k.causal ? " causal" : " full") +
                     (o.precision == Precision::bf16 ? " bf16" : " f16"));
        compare_with_cpu([&](GpuCase& c) { return attention_qkv(c.param("qkv", k.qkv, -2, 2), k.causal); }, o);
      }
  }
}

TEST(GpuAttention, HeadsBeyondTheKernelsAreRefusedByName) {
  GpuCase c(1);
  Var o = attention(c.param("q", {1, 1, 4, 320}), c.param("k", {1, 1, 4, 320}), c.param("v", {1, 1, 4, 8}));
  expect_compile_error(c, o, Precision::f32, "head sizes up to 256 on the GPU, got D = 320");
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

// GELU and layer norm outputs recomputed in the backward (the GELU from the epilogue's
// record, the norms by their forward kernel again), on both sides.
TEST(GpuGpt, OneStepMatchesTheCpuRecomputingGelusAndLayerNorms) {
  CompareOptions f32(Precision::f32, {1e-4, 1e-2, 1e-4}), bf16(Precision::bf16, {1e-2, 1e9, 1e9});
  for (CompareOptions o : {f32, bf16}) {
    SCOPED_TRACE(precision_name(o.precision));
    o.recompute = {"gelu", "layer_norm"};
    compare_with_cpu(tiny_gpt, o);
  }
}

// A memory budget just under the step's need: the layer norms' gradients from their
// outputs (their inputs not kept), on both sides.
TEST(GpuGpt, OneStepMatchesTheCpuWithLayerNormGradientsFromTheirOutputs) {
  CompareOptions f32(Precision::f32, {1e-4, 1e-2, 1e-4}), bf16(Precision::bf16, {1e-2, 1e9, 1e9});
  for (CompareOptions o : {f32, bf16}) {
    SCOPED_TRACE(precision_name(o.precision));
    o.budget_just_under = true;
    compare_with_cpu(tiny_gpt, o);
  }
}

// Each forced epilogue policy: the GEMMs' fused or split variants (the residual
// projections' linear_add among them), and attention's kernels, which are no epilogue's
// and stay chosen by time.
TEST(GpuGpt, OneStepMatchesTheCpuUnderEachEpiloguePolicy) {
  for (EpiloguePolicy e : {EpiloguePolicy::fused, EpiloguePolicy::split, EpiloguePolicy::split_t}) {
    SCOPED_TRACE(epilogue_policy_name(e));
    CompareOptions o(Precision::bf16, {1e-2, 1e9, 1e9});
    o.epilogue = e;
    compare_with_cpu(tiny_gpt, o);
  }
}

}  // namespace
}  // namespace seam::gpu_testing
