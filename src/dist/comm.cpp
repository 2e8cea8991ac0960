#include "dist/comm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "seam/error.h"

#ifdef SEAM_HAS_MPI
#include <mpi.h>
#endif

namespace seam::dist {

namespace {

class Single final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, size_t) override {}
  void all_reduce_sum(double*, size_t) override {}
  void reduce_scatter_sum(float*, const std::vector<size_t>& split) override { check_split(split, 1); }
  void reduce_scatter_sum(double*, const std::vector<size_t>& split) override { check_split(split, 1); }
  void all_gather(void*, const std::vector<size_t>& split) override { check_split(split, 1); }
  void broadcast(void*, size_t, int root) override {
    if (root != 0) fail("broadcast: root ", root, " in a group of 1");
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

#ifdef SEAM_HAS_MPI

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail("MPI: ", what, ": ", std::string(text, static_cast<size_t>(len)));
}

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

class Mpi final : public Comm {
 public:
  Mpi() {
    int ready = 0;
    check(MPI_Initialized(&ready), "MPI_Initialized");
    if (!ready) {
      check(MPI_Init(nullptr, nullptr), "MPI_Init");
      std::atexit([] {
        int done = 0;
        MPI_Finalized(&done);
        if (!done) MPI_Finalize();
      });
    }
    // Errors come back as codes, turned into seam errors, instead of aborting the job.
    check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float* data, size_t n) override { sum(data, n); }
  void all_reduce_sum(double* data, size_t n) override { sum(data, n); }
  void reduce_scatter_sum(float* data, const std::vector<size_t>& split) override { scatter_sum(data, split); }
  void reduce_scatter_sum(double* data, const std::vector<size_t>& split) override { scatter_sum(data, split); }
  void all_gather(void* data, const std::vector<size_t>& split) override {
    check_split(split, size_);
    std::vector<int> counts, displs;
    int_counts(split, counts, displs);
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, data, counts.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD),
          "MPI_Allgatherv");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) fail("broadcast: root ", root, " in a group of ", size_);
    for (size_t at = 0; at < bytes;) {  // counts are ints
      const size_t part = std::min<size_t>(bytes - at, size_t{1} << 30);
      check(MPI_Bcast(static_cast<char*>(data) + at, static_cast<int>(part), MPI_BYTE, root, MPI_COMM_WORLD),
            "MPI_Bcast");
      at += part;
    }
  }
  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);  // MPI_Abort does not return; this satisfies [[noreturn]]
  }

 private:
  static void int_counts(const std::vector<size_t>& split, std::vector<int>& counts, std::vector<int>& displs) {
    if (split.back() > static_cast<size_t>(std::numeric_limits<int>::max()))
      fail("collective: ", split.back(), " values are more than one call takes (MPI counts are ints): split them");
    counts.clear(), displs.clear();
    for (size_t r = 0; r + 1 < split.size(); ++r) {
      counts.push_back(static_cast<int>(split[r + 1] - split[r]));
      displs.push_back(static_cast<int>(split[r]));
    }
  }

  // Rank r's piece [split[r], split[r + 1]) gets every rank's values there (an all-to-all)
  // and adds them in rank order: MPI_Reduce_scatter's order is the library's choice.
  template <class T>
  void scatter_sum(T* data, const std::vector<size_t>& split) {
    check_split(split, size_);
    if (size_ == 1) return;
    const auto p = static_cast<size_t>(size_), me = static_cast<size_t>(rank_);
    std::vector<int> counts, displs;
    int_counts(split, counts, displs);
    const int mine = counts[me];
    // parts[r * mine + i]: rank r's value i of my piece.
    std::vector<T> parts(p * static_cast<size_t>(mine));
    std::vector<int> recv_counts(p, mine), recv_displs(p);
    for (size_t r = 0; r < p; ++r) recv_displs[r] = static_cast<int>(r) * mine;
    check(MPI_Alltoallv(data, counts.data(), displs.data(), mpi_type<T>(), parts.data(), recv_counts.data(),
                        recv_displs.data(), mpi_type<T>(), MPI_COMM_WORLD),
          "MPI_Alltoallv");
    T* piece = data + displs[me];
    for (int i = 0; i < mine; ++i) {
      T s = parts[static_cast<size_t>(i)];
      for (size_t r = 1; r < p; ++r) s += parts[r * static_cast<size_t>(mine) + static_cast<size_t>(i)];
      piece[i] = s;
    }
  }

  // A reduce-scatter over even pieces, then an all-gather: 2 (size - 1) / size of the
  // data in and out of each rank, as a ring all-reduce moves.
  template <class T>
  void sum(T* data, size_t n) {
    if (size_ == 1 || n == 0) return;
    const auto p = static_cast<size_t>(size_);
    std::vector<size_t> split(p + 1);
    for (size_t r = 0; r <= p; ++r) split[r] = n * r / p;
    scatter_sum(data, split);
    for (size_t& s : split) s *= sizeof(T);
    all_gather(data, split);
  }

  int rank_ = 0, size_ = 1;
};

#endif

}  // namespace

void check_split(const std::vector<size_t>& split, int ranks) {
  if (split.size() != static_cast<size_t>(ranks) + 1 || split.front() != 0 || !std::is_sorted(split.begin(), split.end()))
    fail("collective: a split of ", split.size(), " ascending offsets from 0 for ", ranks, " ranks, expected ", ranks + 1);
}

std::unique_ptr<Comm> single_process() { return std::make_unique<Single>(); }

std::unique_ptr<Comm> mpi_world() {
#ifdef SEAM_HAS_MPI
  return std::make_unique<Mpi>();
#else
  fail("this seam was built without MPI (install libopenmpi-dev and rebuild): no ranks to launch");
#endif
}

uint64_t rank_seed(uint64_t seed, int rank) {
  if (rank == 0) return seed;
  // splitmix64's finalizer over (seed, rank): nearby ranks and seeds land far apart.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {
bool world_of_several(const char* var) {
  const char* s = std::getenv(var);
  return s && std::atoi(s) > 1;
}
}  // namespace

bool launched_as_rank() {
  return world_of_several("OMPI_COMM_WORLD_SIZE") || world_of_several("PMI_SIZE") ||
         world_of_several("SEAM_WORLD_SIZE");
}

std::unique_ptr<Comm> launched_world() {
  if (world_of_several("SEAM_WORLD_SIZE")) return file_world();
  return mpi_world();
}

int run_on_ranks(const std::function<int(const std::shared_ptr<Comm>&)>& body) {
  if (!launched_as_rank()) return body(nullptr);
  std::shared_ptr<Comm> comm = launched_world();
  try {
    return body(comm);
  } catch (const std::exception& e) {
    // The other ranks would wait for this one in the next collective: all of them stop.
    std::fprintf(stderr, "seam: error: rank %d of %d: %s\n", comm->rank(), comm->size(), e.what());
    std::fflush(stderr);
    comm->abort(1);
  }
  return 1;  // the compiler does not take abort's [[noreturn]] through the virtual call
}

bool have_mpi() {
#ifdef SEAM_HAS_MPI
  return true;
#else
  return false;
#endif
}

}  // namespace seam::dist
