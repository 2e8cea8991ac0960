// NCCL for the gradient sums of data-parallel plans on GPUs (Plan::buckets), loaded with
// dlopen: seam neither links nor needs libnccl until a plan sums over ranks. The
// communicator spans the ranks of a host communicator (src/dist/comm.h), through which
// rank 0's unique id reaches the others.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <thread>
#include <vector>

#include "seam/dtype.h"

namespace seam::dist {
class Comm;
}

namespace seam::cuda {

class Nccl {
 public:
  // Collective over `host`'s ranks, each on its own GPU (the current device).
  explicit Nccl(dist::Comm& host);
  ~Nccl();
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;

  const dist::Comm& host() const { return host_; }
  // In place, on `stream`: the ranks' mean of n values of type t (NCCL's ncclAvg). May be
  // captured into a CUDA Graph.
  void all_reduce_mean(void* data, size_t n, DType t, cudaStream_t stream);
  // In place, on `stream`: the ranks' sum of n values of type t.
  void all_reduce_sum(void* data, size_t n, DType t, cudaStream_t stream);
  // ZeRO-1's reduce-scatter, in place: rank r's piece [split[r], split[r + 1]) of the
  // values (type t) becomes the ranks' mean there; elsewhere `data` is left as it is.
  // The pieces need not be equal (ncclReduceScatter's must), so each piece is one
  // ncclReduce to its owner, all of them in one NCCL group.
  void reduce_scatter_mean(void* data, const std::vector<size_t>& split, DType t, cudaStream_t stream);
  // In place: each rank's piece [split[r], split[r + 1]) of `data` (in bytes) to every
  // rank, as one group of ncclBroadcast from each owner (pieces of any size).
  void all_gather(void* data, const std::vector<size_t>& split, cudaStream_t stream);

 private:
  dist::Comm& host_;
  void* comm_ = nullptr;  // ncclComm_t
  // Polls NCCL's asynchronous errors (a rank gone, a transport failure): a kernel waiting
  // for a dead peer never returns, so the watchdog aborts the communicator and ends the
  // process with an error instead of leaving it hanging.
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

// This process's GPU in a run of several per host: the launcher's local rank
// (SEAM_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, LOCAL_RANK, SLURM_LOCALID),
// else 0.
// Fails, naming both, where the host has fewer GPUs than local ranks.
int local_device();

}  // namespace seam::cuda
