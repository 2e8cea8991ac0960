// Data parallelism on the CPU (Plan::buckets): run alone it is one rank; CTest also runs
// it under mpiexec at 2 and 4 ranks. Each rank trains on its share of one global batch,
// and the step must be what one process computes from those shares: the gradients the
// rank-order mean of the shares' gradients to the bit, the same parameters on every rank,
// and a run that follows one process training on the whole batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "dist/comm.h"
#include "seam/model.h"
#include "seam/nn.h"
#include "seam/ops.h"

namespace seam {
namespace {

constexpr int64_t kShare = 4, kFeatures = 6, kClasses = 5;

struct Net {
  Graph g;
  ValueId loss = -1;
};

// A small classifier of `rows` rows: two linear layers and a layer norm between them.
Net make_net(int64_t rows) {
  Net n;
  Var x = n.g.input("x", {rows, kFeatures});
  Var y = n.g.input("y", {rows}, DType::i32);
  Var h = relu(nn::layer_norm(nn::linear(x, 16, "fc1"), "ln"));
  n.loss = cross_entropy(nn::linear(h, kClasses, "fc2"), y).id();
  return n;
}

// The global batch of step `step`, the same on every rank: rows [r kShare, (r+1) kShare) are rank r's.
struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};
Batch global_batch(int ranks, int step) {
  std::mt19937 rng(1234u + static_cast<uint32_t>(step));
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int32_t> label(0, kClasses - 1);
  Batch b;
  for (int64_t i = 0; i < ranks * kShare * kFeatures; ++i) b.x.push_back(nd(rng));
  for (int64_t i = 0; i < ranks * kShare; ++i) b.y.push_back(label(rng));
  return b;
}
void feed(Program& p, const Batch& b, int64_t first, int64_t rows) {
  p.set_input("x", std::span<const float>(b.x.data() + first * kFeatures, static_cast<size_t>(rows * kFeatures)));
  p.set_input("y", std::span<const int32_t>(b.y.data() + first, static_cast<size_t>(rows)));
}

std::shared_ptr<dist::Comm> world() {
  return dist::have_mpi() ? std::shared_ptr<dist::Comm>(dist::mpi_world()) : std::shared_ptr<dist::Comm>(dist::single_process());
}

TEST(DataParallel, GradientsAreTheRankOrderMeanOfTheSharesGradientsBitwise) {
  auto comm = world();
  const int ranks = comm->size();
  Net net = make_net(kShare);
  // Buckets of 256 bytes: several all-reduces a step, started as layers finish.
  Model dp(net.g, {.seed = 3, .comm = comm, .grad_bucket_bytes = 256});
  Program step = dp.compile({.loss = net.loss, .optimizer = OptimizerConfig::sgd(0.1, 0.9)});
  if (ranks > 1) {
    EXPECT_GT(step.plan().buckets.size(), 1u);
    std::set<std::string> seen;
    for (const GradBucket& b : step.plan().buckets)
      for (const std::string& p : b.params) EXPECT_TRUE(seen.insert(p).second) << p << " in two buckets";
    EXPECT_EQ(seen.size(), dp.layout().params.size());
    EXPECT_NE(step.plan().str().find("all-reduce bucket 0:"), std::string::npos);
  }
  const Batch b = global_batch(ranks, 0);
  feed(step, b, comm->rank() * kShare, kShare);
  step.run();

  // One process: each share's gradient alone, added in rank order, divided by the ranks.
  Model alone(net.g, {.seed = 3});
  Program grads = alone.compile({.loss = net.loss, .gradients = true});
  for (const Slot& s : dp.layout().params) {
    std::vector<float> want;
    for (int r = 0; r < ranks; ++r) {
      feed(grads, b, r * kShare, kShare);
      grads.run();
      const auto g = grads.grad_as<float>(s.name);
      if (r == 0) want = g;
      else
        for (size_t i = 0; i < g.size(); ++i) want[i] += g[i];
    }
    for (float& v : want) v *= 1.0f / static_cast<float>(ranks);
    const auto got = step.grad_as<float>(s.name);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << s.name << " on rank " << comm->rank() << " of " << ranks;
  }
}

TEST(DataParallel, EveryRankHoldsTheParametersOfOneProcessTrainingOnTheWholeBatch) {
  auto comm = world();
  const int ranks = comm->size(), rank = comm->rank();
  Net share = make_net(kShare), whole = make_net(ranks * kShare);
  Model dp(share.g, {.seed = 7, .comm = comm});
  Model alone(whole.g, {.seed = 7});
  const OptimizerConfig adam = OptimizerConfig::adamw(1e-2, 0.01);
  Program a = dp.compile({.loss = share.loss, .optimizer = adam});
  Program b = alone.compile({.loss = whole.loss, .optimizer = adam});
  for (int s = 0; s < 6; ++s) {
    const Batch batch = global_batch(ranks, s);
    feed(a, batch, rank * kShare, kShare);
    feed(b, batch, 0, ranks * kShare);
    a.run(), b.run();
  }
  for (const Slot& s : dp.layout().params) {
    auto mine = Program::cast_bytes<float>(dp.read_param(s.name));
    auto root = mine;
    comm->broadcast(root.data(), root.size() * sizeof(float), 0);
    EXPECT_EQ(std::memcmp(mine.data(), root.data(), mine.size() * sizeof(float)), 0)
        << s.name << ": rank " << rank << " differs from rank 0";
    // The whole batch sums its rows in another order: equal up to f32 rounding.
    const auto want = Program::cast_bytes<float>(alone.read_param(s.name));
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(mine[i], want[i], 2e-5) << s.name << "[" << i << "]";
  }
  EXPECT_EQ(dp.state().step, 6);
}

// ZeRO-1 (ModelOptions::zero): each rank keeps a shard of the moments and updates its
// shard of the parameters from the reduce-scattered gradients; the result is plain data
// parallelism's to the bit, parameters and moments, and its checkpoint tensors (gathered
// from every rank) load into a model of any world size. In bf16 the shards are of the f32
// masters, and every rank's working copies are the gathered masters rounded.
void expect_zero_one_is_plain_data_parallel(Precision precision) {
  auto comm = world();
  const int ranks = comm->size(), rank = comm->rank();
  const std::string where = std::string(precision_name(precision)) + ", rank " + std::to_string(rank) + " of " +
                            std::to_string(ranks);
  Net net = make_net(kShare);
  OptimizerConfig adamw = OptimizerConfig::adamw(1e-2, 0.01);
  adamw.clip_norm = 0.5;  // the norm of the ranks' shards together
  Model plain(net.g, {.seed = 5, .precision = precision, .comm = comm, .grad_bucket_bytes = 512});
  Model zero(net.g, {.seed = 5, .precision = precision, .comm = comm, .grad_bucket_bytes = 512, .zero = 1});
  Program a = plain.compile({.loss = net.loss, .optimizer = adamw});
  Program b = zero.compile({.loss = net.loss, .optimizer = adamw});
  EXPECT_TRUE(b.plan().zero);  // a group of one takes the same path
  std::vector<std::byte> loss[2];
  for (int s = 0; s < 5; ++s) {
    const Batch batch = global_batch(ranks, s);
    for (Program* p : {&a, &b}) feed(*p, batch, rank * kShare, kShare), p->run();
    // The forward pass reads the working copies: the same bits, so the same loss.
    loss[0] = a.read(plain.graph().value(net.loss).name), loss[1] = b.read(zero.graph().value(net.loss).name);
    EXPECT_EQ(loss[0], loss[1]) << "step " << s << ", " << where;
  }
  // Two moments a value: all of them in plain data parallelism, the shard's under ZeRO-1.
  const size_t values = plain.layout().param_bytes / sizeof(float);
  const auto [lo, hi] = zero_shard(values, rank, ranks);
  EXPECT_EQ(plain.device_bytes() - zero.device_bytes(), 2 * (values - (hi - lo)) * sizeof(float));
  const auto want = plain.save_tensors(), got = zero.save_tensors();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(want[i].data == got[i].data) << want[i].name << ", " << where;

  // The gathered tensors resume in a ZeRO-1 model and in one process alike.
  Model again(net.g, {.seed = 9, .precision = precision, .comm = comm, .zero = 1});
  again.load_tensors(got);
  again.state() = zero.state();
  Program c = again.compile({.loss = net.loss, .optimizer = adamw});
  const Batch next = global_batch(ranks, 5);
  for (Program* p : {&a, &c}) feed(*p, next, rank * kShare, kShare), p->run();
  const auto after = plain.save_tensors(), resumed = again.save_tensors();
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_TRUE(after[i].data == resumed[i].data) << after[i].name << " after resuming, " << where;
  Model alone(net.g, {.seed = 1});
  alone.load_tensors(got);
  EXPECT_TRUE(alone.save_tensors()[0].data == got[0].data);
}

TEST(DataParallel, ZeroOneUpdatesBitwiseAsPlainDataParallelWithAShardOfTheMoments) {
  expect_zero_one_is_plain_data_parallel(Precision::f32);
}

TEST(DataParallel, ZeroOneInBf16ShardsTheMastersAndGathersThemForTheWorkingCopies) {
  expect_zero_one_is_plain_data_parallel(Precision::bf16);
}

// What data parallelism refuses, and says so where the model is made or compiled:
// 16-bit gradients on the CPU (parameters without f32 masters), and ZeRO-1 over such
// parameters (its shards are of f32 masters).
TEST(DataParallel, SixteenBitGradientsAreRefusedByName) {
  auto comm = world();
  Net net = make_net(kShare);
  ModelOptions o{.seed = 1, .precision = Precision::bf16, .master_weights = false, .comm = comm};
  Model m(net.g, o);
  try {
    m.compile({.loss = net.loss, .optimizer = OptimizerConfig::sgd(0.1)});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data parallelism on the CPU sums f32 or f64 gradients, not bf16"),
              std::string::npos)
        << e.what();
  }
  o.zero = 1;
  try {
    Model sharded(net.g, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ZeRO-1 on the CPU shards f32 or f64 parameters"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace seam
