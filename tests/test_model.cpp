// Model and Program on the CPU: a program that outlives its model, and steps timed alone
// leaving the model bitwise as it was (model_checks.h; the GPU tests run the same).
#include "model_checks.h"

TEST(Program, OutlivesItsModel) { seam::testing::expect_a_program_outlives_its_model(seam::Device::cpu); }

TEST(Program, TimingStepsLeavesTheModelBitwiseAsItWas) {
  seam::testing::expect_timing_leaves_the_model_as_it_was(seam::Device::cpu);
  seam::testing::expect_timing_leaves_the_model_as_it_was(seam::Device::cpu, seam::Precision::bf16);
}

TEST(Program, AFailedMeasurementLeavesTheModelAsItWas) {
  // Batch norm's statistics are replayed before the embedding meets an id out of range
  // and throws: the model must come back as it was all the same.
  using namespace seam;
  Graph g;
  Var x = g.input("x", {8, 4});
  Var ids = g.input("ids", {8}, DType::i32);
  Var h = nn::batch_norm(x, "bn");
  Var e = nn::embedding(ids, 5, 4, "emb");
  Var loss = sum(mul(h, e));
  Model m(g, {.seed = 2});
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
  const auto xs = seam::testing::random_floats(8 * 4, 3);
  std::vector<int32_t> good{0, 1, 2, 3, 4, 0, 1, 2}, bad{0, 1, 2, 3, 4, 0, 1, 9};
  p.set_input("x", std::span<const float>(xs));
  p.set_input("ids", std::span<const int32_t>(good));
  p.run();
  p.set_input("ids", std::span<const int32_t>(bad));
  const auto saved = m.save_tensors();
  EXPECT_THROW(p.time_steps(2), Error);
  seam::testing::expect_same(m.save_tensors(), saved);
}
