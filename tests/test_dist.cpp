// The communicator of data-parallel runs (src/dist/comm.h). Run alone it is one rank;
// CTest also runs it under mpiexec at 2 and 4 ranks, where every collective is checked
// against what the ranks' data must give: the same bits on every rank, summed in rank
// order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "dist/comm.h"
#include "seam/error.h"

namespace seam::dist {
namespace {

// Rank r's values: magnitudes spread over 2^-20 .. 2^20, so that another order of
// addition would change low bits.
template <class T>
std::vector<T> values_of(int rank, size_t n, uint32_t salt) {
  std::mt19937 rng(static_cast<uint32_t>(rank) * 7919u + salt);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> expo(-20, 20);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(std::ldexp(mant(rng), expo(rng)));
  return v;
}

TEST(Dist, OneProcessIsRankZeroOfOne) {
  auto c = single_process();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  std::vector<float> v{1.5f, -2.f};
  c->all_reduce_sum(v.data(), v.size());
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.f}));
  EXPECT_THROW(c->broadcast(v.data(), 8, 1), Error);
}

template <class T>
void expect_rank_order_sums(Comm& c) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}, size_t{4099}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<T> got = values_of<T>(c.rank(), n, static_cast<uint32_t>(n));
    c.all_reduce_sum(got.data(), n);
    std::vector<T> want = values_of<T>(0, n, static_cast<uint32_t>(n));
    for (int r = 1; r < c.size(); ++r) {
      const std::vector<T> part = values_of<T>(r, n, static_cast<uint32_t>(n));
      for (size_t i = 0; i < n; ++i) want[i] += part[i];
    }
    size_t differ = 0;
    for (size_t i = 0; i < n; ++i) differ += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
    EXPECT_EQ(differ, 0u) << "on rank " << c.rank() << " of " << c.size();
  }
}

TEST(Dist, AllReduceSumsInRankOrderWithTheSameBitsOnEveryRank) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  auto c = mpi_world();
  expect_rank_order_sums<float>(*c);
  expect_rank_order_sums<double>(*c);
}

TEST(Dist, BroadcastGivesEveryRankTheRootsBytes) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  auto c = mpi_world();
  for (int root = 0; root < c->size(); ++root) {
    std::vector<double> v = values_of<double>(c->rank(), 77, 5);
    c->broadcast(v.data(), v.size() * sizeof(double), root);
    EXPECT_EQ(v, values_of<double>(root, 77, 5)) << "root " << root << ", rank " << c->rank();
  }
  EXPECT_THROW(c->broadcast(nullptr, 0, c->size()), Error);
  c->barrier();
}

}  // namespace
}  // namespace seam::dist
