// CUDA device discovery. The CUDA backend builds on this: it reports which GPUs the
// runtime sees, so the CLI can choose a device and say why it did.
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/device.h"

namespace seam::cuda {

std::vector<DeviceInfo> devices(std::string* why_none) {
  std::vector<DeviceInfo> out;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why_none) *why_none = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.major * 10 + p.minor, p.totalGlobalMem, p.multiProcessorCount});
  }
  if (out.empty() && why_none) *why_none = "no CUDA device found";
  return out;
}

int runtime_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return v;
}

}  // namespace seam::cuda
