// CUDA kernels of the pool family (being written).
#include "backend/cuda/cuda.h"

namespace seam::cuda {

void register_pool(PreparerTable&) {}

}  // namespace seam::cuda
