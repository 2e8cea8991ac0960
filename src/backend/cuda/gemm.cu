// cuBLASLt GEMMs (being written).
#include "backend/cuda/gemm.h"

namespace seam::cuda {

struct GemmCache::Impl {};
GemmCache::GemmCache() : impl_(new Impl) {}
GemmCache::~GemmCache() { delete impl_; }

}  // namespace seam::cuda
