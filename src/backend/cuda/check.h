// Checked calls into CUDA, cuBLASLt, cuDNN and NVRTC: a failure throws seam::Error with
// the file, line, the call and the library's own status name.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "seam/error.h"

#define SEAM_CUDA_CHECK(call)                                                                    \
  do {                                                                                           \
    cudaError_t seam_e_ = (call);                                                                \
    if (seam_e_ != cudaSuccess)                                                                  \
      ::seam::fail(__FILE__, ":", __LINE__, ": ", #call, ": ", cudaGetErrorName(seam_e_), " (",  \
                   cudaGetErrorString(seam_e_), ")");                                            \
  } while (0)

#define SEAM_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                           \
    cublasStatus_t seam_s_ = (call);                                                             \
    if (seam_s_ != CUBLAS_STATUS_SUCCESS)                                                        \
      ::seam::fail(__FILE__, ":", __LINE__, ": ", #call, ": ", cublasLtGetStatusName(seam_s_));    \
  } while (0)

#define SEAM_CUDNN_CHECK(call)                                                                   \
  do {                                                                                           \
    cudnnStatus_t seam_s_ = (call);                                                              \
    if (seam_s_ != CUDNN_STATUS_SUCCESS)                                                         \
      ::seam::fail(__FILE__, ":", __LINE__, ": ", #call, ": ", cudnnGetErrorString(seam_s_));    \
  } while (0)

// After a kernel launch: launch configuration errors surface here, not later.
#define SEAM_CUDA_LAUNCH_CHECK() SEAM_CUDA_CHECK(cudaGetLastError())
