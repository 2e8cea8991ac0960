// GEMMs on cuBLASLt for the CUDA backend (matmul.cu uses them): descriptors built once
// per shape, the algorithm chosen once per (shapes, dtypes, layouts, epilogue) and kept
// in a cache that is saved to disk and read back on the next run.
#pragma once
#include <string>

#include "backend/cuda/cuda.h"

namespace seam::cuda {

class GemmCache {
 public:
  GemmCache();   // reads the cache file of this GPU and cuBLASLt version, if any
  ~GemmCache();  // writes it back when it learned something
  GemmCache(const GemmCache&) = delete;
  GemmCache& operator=(const GemmCache&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  Impl* impl_;
};

}  // namespace seam::cuda
