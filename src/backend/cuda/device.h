// CUDA device discovery (compiled only with SEAM_CUDA).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace seam::cuda {

struct DeviceInfo {
  int index;
  std::string name;
  int compute_capability;  // 90 for sm_90
  size_t memory_bytes;
  int multiprocessors;
};

// The GPUs the CUDA runtime sees; when there are none, *why_none says why.
std::vector<DeviceInfo> devices(std::string* why_none = nullptr);
int runtime_version();  // e.g. 13000

}  // namespace seam::cuda
