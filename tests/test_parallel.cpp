// The CPU kernels' pool (src/backend/cpu/parallel.h): chunks cover the range once, an
// exception thrown in any chunk reaches the caller, and the pool works on after it; the
// parameters it draws are the ones one core draws.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <vector>

#include "backend/cpu/parallel.h"
#include "seam/error.h"
#include "seam/seam.h"

namespace seam::cpu {
namespace {

// ctest runs each test in a process of its own and sets SEAM_CPU_THREADS=1 for all; this
// one asks for three before the pool is first made, so that chunks run on workers.
struct ThreePoolThreads {
  ThreePoolThreads() { setenv("SEAM_CPU_THREADS", "3", 1); }
};

TEST(CpuPool, AnExceptionInAWorkersChunkReachesTheCallerAndThePoolWorksOn) {
  ThreePoolThreads three;
  std::vector<std::atomic<int>> hits(300);
  parallel_for(300, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  // The last chunk (a worker's, not the caller's, with more than one thread) throws.
  try {
    parallel_for(300, 1, [&](int64_t, int64_t e) {
      if (e == 300) fail("chunk ending at ", e, " failed");
    });
    ADD_FAILURE() << "no exception";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("chunk ending at 300 failed"), std::string::npos) << err.what();
  }
  // Nested calls run on their caller; the pool takes the next loop as before.
  std::atomic<int64_t> sum{0};
  parallel_for(10, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) parallel_for(5, 1, [&](int64_t bb, int64_t ee) { sum += (ee - bb) * i; });
  });
  EXPECT_EQ(sum.load(), 5 * 45);
}

// A model's initial parameters, drawn in chunks on three threads, are bit for bit those
// drawn on one (a Model built inside a chunk: a nested call runs on its caller alone).
TEST(CpuPool, ParametersDrawnInChunksAreTheOnesOneThreadDraws) {
  ThreePoolThreads three;
  Graph g;
  g.param("w", {600, 500}, Init::normal(0, 0.02));
  g.param("u", {300001}, Init::uniform(-1, 1));
  const Model pooled(g, {.seed = 9});
  std::optional<Model> alone;
  parallel_for(3, 1, [&](int64_t b, int64_t) {
    if (b == 0) alone.emplace(g, ModelOptions{.seed = 9});
  });
  for (const char* name : {"w", "u"}) EXPECT_EQ(pooled.read_param(name), alone->read_param(name)) << name;
}

}  // namespace
}  // namespace seam::cpu
