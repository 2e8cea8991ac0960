// What every plan prepared by one CUDA backend shares: the streams, library handles and
// caches; and the factory of executables.
#pragma once
#include <cublasLt.h>
#include <cudnn.h>

#include <memory>

#include "backend/backend.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/nccl.h"

namespace seam::cuda {

struct Shared {
  bool tf32 = false;
  bool graph = true;
  EpiloguePolicy epilogue = EpiloguePolicy::fastest;
  bool deterministic = false;
  cudaStream_t stream = nullptr;       // compute
  std::vector<cudaStream_t> lanes;     // compute: lanes[0] = stream, then the side lanes
  cudaStream_t copy_stream = nullptr;  // input uploads (from the host or another library's memory)
  cublasLtHandle_t lt = nullptr;
  cudnnHandle_t dnn = nullptr;
  int sm_count = 0;
  int device = 0;  // the GPU's index
  std::unique_ptr<GemmCache> gemm_cache;
  // Data-parallel plans: the GPUs' communicator (made by the first such plan) and the
  // stream its gradient sums run on beside the backward pass.
  std::unique_ptr<Nccl> nccl;
  cudaStream_t comm_stream = nullptr;
  ~Shared() {
    nccl.reset();
    if (comm_stream) cudaStreamDestroy(comm_stream);
    if (dnn) cudnnDestroy(dnn);
    if (lt) cublasLtDestroy(lt);
    for (size_t i = 1; i < lanes.size(); ++i) cudaStreamDestroy(lanes[i]);
    if (copy_stream) cudaStreamDestroy(copy_stream);
    if (stream) cudaStreamDestroy(stream);
  }
};

std::unique_ptr<Executable> make_executable(std::shared_ptr<Shared> sh, const Plan& plan, const Regions& r);

}  // namespace seam::cuda
