// The processes that train one model together (issue 20's data parallelism): one per GPU
// or per CPU process, launched by `mpirun -np N`. Collectives on host memory here; the GPU
// side (NCCL, inside the captured step) builds on the same ranks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace seam::dist {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums n values over the ranks. Every rank gets the same bits, added in rank order
  // ((r0 + r1) + r2 ...), whatever the transport does: a data-parallel run can then be
  // compared bit for bit with one process that adds the ranks' parts in that order.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  virtual void all_reduce_sum(double* data, size_t n) = 0;
  // The same sum, each rank getting only its piece: rank r's [split[r], split[r + 1]) of
  // the n values (split has size() + 1 ascending entries from 0 to n) ends up holding the
  // ranks' sum there, with the bits all_reduce_sum gives; the rest of `data` is left as is.
  virtual void reduce_scatter_sum(float* data, const std::vector<size_t>& split) = 0;
  virtual void reduce_scatter_sum(double* data, const std::vector<size_t>& split) = 0;
  // Each rank's piece [split[r], split[r + 1]) of `data` (in bytes) to every rank.
  virtual void all_gather(void* data, const std::vector<size_t>& split) = 0;
  // Rank `root`'s bytes to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Ends every rank's process with `code`: a rank that cannot go on must not leave the
  // others waiting in a collective forever.
  [[noreturn]] virtual void abort(int code) = 0;
};

// Fails unless `split` cuts values among `ranks` ranks: ranks + 1 ascending offsets from 0
// (Comm::reduce_scatter_sum, Comm::all_gather).
void check_split(const std::vector<size_t>& split, int ranks);

// One process alone: rank 0 of 1, every collective a no-op.
std::unique_ptr<Comm> single_process();

// MPI_COMM_WORLD (MPI initialized on first use, finalized at exit). Fails, saying so,
// where seam was built without MPI.
std::unique_ptr<Comm> mpi_world();

// Whether this binary can launch ranks through MPI.
bool have_mpi();

// The ranks of a `seam train --nproc N` started without MPI (src/dist/launch.h): they meet
// through files in the folder SEAM_RENDEZVOUS, as rank SEAM_RANK of SEAM_WORLD_SIZE.
// A collective that waits longer than SEAM_RENDEZVOUS_TIMEOUT seconds (default 600) for
// a rank fails, naming it.
std::unique_ptr<Comm> file_world();

// The world a launcher started this process in: MPI's (mpirun), or the rendezvous folder's
// (--nproc without MPI). Only where launched_as_rank().
std::unique_ptr<Comm> launched_world();

// `body` with the world a launcher started this process in (launched_world), or with null
// where none did. An error on a rank is printed, naming the rank, and ends every rank
// (Comm::abort): the others would wait for it in their next collective.
int run_on_ranks(const std::function<int(const std::shared_ptr<Comm>&)>& body);

// Rank r's seed in a run seeded `seed`, for what each rank draws alone (dropout masks of
// its rows): rank 0 keeps the run's seed, the others get well-mixed seeds of their own.
uint64_t rank_seed(uint64_t seed, int rank);

// Whether a launcher started this process as one of several ranks: its environment says
// so (OpenMPI's OMPI_COMM_WORLD_SIZE, MPICH's PMI_SIZE, seam's own SEAM_WORLD_SIZE).
bool launched_as_rank();

}  // namespace seam::dist
