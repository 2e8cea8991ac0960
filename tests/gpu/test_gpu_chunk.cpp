// The output layer in row chunks on the GPU (chunk_output_layer): against the CPU's
// chunks, and the chunks' loss and count against the whole layer's.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gpu_check.h"
#include "seam/seam.h"
#include "test_util.h"

namespace seam::gpu_testing {
namespace {

nn::GptConfig small_gpt() {
  nn::GptConfig cfg;
  cfg.n_layer = 1, cfg.n_head = 2, cfg.n_embd = 64, cfg.vocab = 100, cfg.padded_vocab = 128, cfg.block_size = 40;
  return cfg;
}

// The loss of a GPT with its tied projection, in chunks of its 111 rows: 37 each, and
// 27, 28, 28, 28.
TEST(GpuChunk, AGptsOutputLayerInChunksMatchesTheCpu) {
  CompareOptions f32(Precision::f32, {1e-4, 1e-2, 1e-4}), bf16(Precision::bf16, {1e-2, 1e9, 1e9});
  for (CompareOptions o : {f32, bf16})
    for (int chunks : {3, 4}) {
      SCOPED_TRACE(std::string(precision_name(o.precision)) + ", " + std::to_string(chunks) + " chunks");
      o.output_is_loss = true;
      o.output_chunks = chunks;
      compare_with_cpu([](GpuCase& c) {
        return cross_entropy(nn::gpt(c.labels("tokens", {3, 37}, 100), small_gpt()), c.labels("y", {3, 37}, 100));
      }, o);
    }
}

// matmul's addend, in f32 and bf16 (a GEMM with beta = 1), and its gradient.
TEST(GpuChunk, MatmulAddsItsAddend) {
  for (const CompareOptions& o : {gpu_testing::f32(), gpu_testing::bf16()}) {
    SCOPED_TRACE(precision_name(o.precision));
    compare_with_cpu([](GpuCase& c) {
      Var a = c.param("a", {37, 52}), b = c.param("b", {52, 29}), d = c.param("c", {37, 29});
      return c.g.var(c.g.add(Op::matmul, {a.id(), b.id(), d.id()})[0]);
    }, o);
  }
}

// The chunks' losses and counts add up on the device to the whole layer's, with ignored
// labels among the rows (every chunk divides by all the rows that count).
TEST(GpuChunk, ChunksAddTheirLossesAndCountsOnTheDevice) {
  Graph g;
  Var tokens = g.input("tokens", {3, 37}, DType::i32), y = g.input("y", {3, 37}, DType::i32);
  Var logits = nn::gpt(tokens, small_gpt());
  Var loss = cross_entropy(logits, y), correct = count_equal(argmax(logits), y);
  std::mt19937 rng(11);
  std::vector<int32_t> tv(111), yv(111);
  for (auto& t : tv) t = static_cast<int32_t>(rng() % 100);
  for (auto& t : yv) t = rng() % 5 == 0 ? -100 : static_cast<int32_t>(rng() % 100);
  for (Precision p : {Precision::f32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(p));
    struct Out {
      float loss;
      int32_t correct;
      std::vector<float> wte;
    };
    auto run = [&](Device d, int chunks) {
      Model m(g, {.seed = 4, .device = d, .precision = p});
      Program prog = m.compile({.loss = loss.id(), .gradients = true, .outputs = {loss.id(), correct.id()},
                                .output_chunks = chunks});
      EXPECT_EQ(testing::count(prog.plan(), Op::cross_entropy_with_grad), chunks);
      prog.set_input("tokens", std::span<const int32_t>(tv));
      prog.set_input("y", std::span<const int32_t>(yv));
      prog.run();
      return Out{prog.read_as<float>(loss.name())[0], prog.read_as<int32_t>(correct.name())[0],
                 prog.grad_as<float>("wte.weight")};
    };
    const Out cpu = run(Device::cpu, 1), whole = run(Device::cuda, 1), part = run(Device::cuda, 4);
    const double tol = p == Precision::f32 ? 1e-5 : 1e-2;
    EXPECT_NEAR(part.loss, whole.loss, tol * whole.loss);
    EXPECT_NEAR(part.loss, cpu.loss, tol * cpu.loss);
    // The chunks' GEMMs may round a logit otherwise than the whole one's: in bf16 a near tie
    // may then go the other way.
    if (p == Precision::f32) EXPECT_EQ(part.correct, whole.correct);
    else EXPECT_NEAR(part.correct, whole.correct, 3);
    double num = 0, den = 0;
    for (size_t i = 0; i < whole.wte.size(); ++i) {
      num += (part.wte[i] - whole.wte[i]) * static_cast<double>(part.wte[i] - whole.wte[i]);
      den += whole.wte[i] * static_cast<double>(whole.wte[i]);
    }
    EXPECT_LT(std::sqrt(num / den), p == Precision::f32 ? 1e-5 : 1e-2);
  }
}

}  // namespace
}  // namespace seam::gpu_testing
