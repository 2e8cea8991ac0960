// Model and Program on the CPU: a program that outlives its model, and steps timed alone
// leaving the model bitwise as it was (model_checks.h; the GPU tests run the same).
#include "model_checks.h"

TEST(Program, OutlivesItsModel) { seam::testing::expect_a_program_outlives_its_model(seam::Device::cpu); }

TEST(Program, TimingStepsLeavesTheModelBitwiseAsItWas) {
  seam::testing::expect_timing_leaves_the_model_as_it_was(seam::Device::cpu);
}
