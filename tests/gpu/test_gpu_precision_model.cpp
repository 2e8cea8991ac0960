// Whole networks at bf16 and f16 on the GPU against the CPU plan at the same policy: the
// shapes of the bench workloads (GELU MLP, gated residual MLP, post-norm residual MLP),
// small, forward and every parameter's gradient through the loss.
#include <gtest/gtest.h>

#include "gpu_check.h"

using namespace seam;
using namespace seam::gpu_testing;

namespace {

CompareOptions loss_at(Precision p) {
  CompareOptions o = p == Precision::bf16 ? bf16() : f16();
  o.output_is_loss = true;
  return o;
}

Var gelu_mlp(GpuCase& c) {
  Var x = c.data("x", {96, 64});
  Var y = c.labels("y", {96}, 24);
  Var h = gelu(nn::linear(x, 128, "fc1"), true);
  h = gelu(nn::linear(h, 128, "fc2"), true);
  return cross_entropy(nn::linear(h, 24, "fc3"), y);
}

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
