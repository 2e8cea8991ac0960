// The communicator of data-parallel runs (src/dist/comm.h). Run alone it is one rank;
// CTest also runs it under mpiexec at 2 and 4 ranks, where every collective is checked
// against what the ranks' data must give: the same bits on every rank, summed in rank
// order.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
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

// reduce_scatter_sum gives each rank its piece of the rank-order sums (uneven pieces,
// an empty one too), all_gather every rank's piece to all.
void expect_pieces(Comm& c) {
  const size_t n = 1001;
  std::vector<size_t> split{0};
  for (int r = 1; r < c.size(); ++r) split.push_back(r == 1 ? 0 : n * static_cast<size_t>(r) / static_cast<size_t>(c.size()) + 3);
  split.push_back(n);
  std::vector<float> got = values_of<float>(c.rank(), n, 11), want = values_of<float>(0, n, 11);
  for (int r = 1; r < c.size(); ++r) {
    const auto part = values_of<float>(r, n, 11);
    for (size_t i = 0; i < n; ++i) want[i] += part[i];
  }
  c.reduce_scatter_sum(got.data(), split);
  const auto me = static_cast<size_t>(c.rank());
  for (size_t i = split[me]; i < split[me + 1]; ++i) ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << i;
  std::vector<size_t> bytes = split;
  for (size_t& b : bytes) b *= sizeof(float);
  c.all_gather(got.data(), bytes);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0) << "rank " << c.rank();
}

TEST(Dist, ReduceScatterAndAllGatherGiveEachRankItsPiece) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  auto c = mpi_world();
  expect_pieces(*c);
}

// Ranks without MPI (file_world): three processes forked here meet in a folder and must
// give the bits MPI gives. A rank that aborts stops the others with a message; one that
// never comes makes them fail after the timeout, naming it.
class FileRanks : public ::testing::Test {
 protected:
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("seam_rdv_" + std::to_string(::getpid()));
  void SetUp() override {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  // Runs body(comm) in `ranks` forked processes; returns each one's exit status (0: no
  // failure recorded there).
  template <class F>
  std::vector<int> run(int ranks, F body, int present = -1, const char* timeout_s = "120") {
    std::vector<pid_t> pids;
    for (int r = 0; r < (present < 0 ? ranks : present); ++r) {
      const pid_t pid = fork();
      if (pid == 0) {
        setenv("SEAM_RANK", std::to_string(r).c_str(), 1);
        setenv("SEAM_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
        setenv("SEAM_RENDEZVOUS", dir.c_str(), 1);
        setenv("SEAM_RENDEZVOUS_TIMEOUT", timeout_s, 1);
        int code = 0;
        try {
          auto c = launched_world();
          body(*c);
          code = ::testing::Test::HasFailure() ? 1 : 0;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d: %s\n", r, e.what());
          code = std::strstr(e.what(), "a rank stopped") ? 3 : std::strstr(e.what(), "did not reach") ? 4 : 2;
        }
        std::_Exit(code);
      }
      pids.push_back(pid);
    }
    std::vector<int> codes;
    for (pid_t p : pids) {
      int status = 0;
      waitpid(p, &status, 0);
      codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status));
    }
    return codes;
  }
};

TEST_F(FileRanks, SumInRankOrderAndShareBytesAsMpiDoes) {
  const auto codes = run(3, [](Comm& c) {
    expect_rank_order_sums<float>(c);
    expect_rank_order_sums<double>(c);
    expect_pieces(c);
    for (int root = 0; root < c.size(); ++root) {
      std::vector<double> v = values_of<double>(c.rank(), 77, 5);
      c.broadcast(v.data(), v.size() * sizeof(double), root);
      EXPECT_EQ(v, values_of<double>(root, 77, 5));
    }
    c.barrier();
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

TEST_F(FileRanks, ARankThatAbortsOrNeverComesStopsTheOthers) {
  const auto aborted = run(3, [](Comm& c) {
    if (c.rank() == 1) c.abort(7);
    c.barrier();
  });
  EXPECT_EQ(aborted, (std::vector<int>{3, 7, 3}));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto missing = run(3, [](Comm& c) { c.barrier(); }, 2, "1");
  EXPECT_EQ(missing, (std::vector<int>{4, 4}));
}

}  // namespace
}  // namespace seam::dist
