// ModelOptions::deterministic on the GPU: the embedding gradient without atomics against
// the CPU, and whole runs of the CNN and the GPT examples that repeat their bits: two runs
// with fresh caches (so that no pick carries over), one without the CUDA graph, and one
// whose gradients go through NCCL's mean over a group of one (the data-parallel path).
#include <gtest/gtest.h>

#include "dist/comm.h"
#include "gpu_check.h"

using namespace seam;
using namespace seam::gpu_testing;

namespace {

TEST(GpuDeterminism, TheSortedEmbeddingGradientMatchesTheCpu) {
  for (const CompareOptions& o : {f32().fixed(), bf16().fixed()}) {
    SCOPED_TRACE(precision_name(o.precision));
    compare_with_cpu([](GpuCase& c) { return embedding(c.labels("ids", {5, 7}, 11), c.param("w", {11, 33})); }, o);
    // Most rows named many times, some never (their gradient rows are zeros).
    compare_with_cpu([](GpuCase& c) { return embedding(c.labels("ids", {16, 256}, 40), c.param("w", {64, 96})); }, o);
    compare_with_cpu([](GpuCase& c) { return embedding(c.labels("ids", {3}, 1000), c.param("w", {1000, 8})); }, o);
  }
}

std::vector<HostTensor> train(const std::string& example, int64_t batch, int steps, bool graph,
                              std::shared_ptr<dist::Comm> ranks = nullptr) {
  return train_example(example, {.batch = batch, .steps = steps, .graph = graph, .ranks = std::move(ranks)});
}

void expect_same_bits(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].name, b[i].name) << what;
    EXPECT_TRUE(a[i].data == b[i].data) << what << ": " << a[i].name << " differs";
  }
}

TEST(GpuDeterminism, TwoRunsOfTheCnnGiveTheSameBits) {
  const auto first = train("fmnist_cnn", 64, 50, true);
  expect_same_bits(first, train("fmnist_cnn", 64, 50, true), "a second run");
  expect_same_bits(first, train("fmnist_cnn", 64, 50, false), "a run without the CUDA graph");
}

TEST(GpuDeterminism, TwoRunsOfTheGptGiveTheSameBits) {
  const auto first = train("gpt_fortunes", 8, 50, true);
  expect_same_bits(first, train("gpt_fortunes", 8, 50, true), "a second run");
  expect_same_bits(first, train("gpt_fortunes", 8, 50, false), "a run without the CUDA graph");
}

// One rank through NCCL (buckets summed on their own stream inside the captured step,
// the loss averaged) takes the plain step's path to the bit: the mean over one rank is
// the value itself.
TEST(GpuDeterminism, OneRankThroughNcclGivesThePlainStepsBits) {
  const std::shared_ptr<dist::Comm> one = dist::single_process();
  for (const char* example : {"fmnist_cnn", "gpt_fortunes"}) {
    const auto plain = train(example, 16, 12, true);
    expect_same_bits(plain, train(example, 16, 12, true, one), example);
    expect_same_bits(plain, train(example, 16, 12, false, one), example);
  }
}

}  // namespace
