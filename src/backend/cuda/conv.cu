// CUDA kernels of the conv family (being written).
#include "backend/cuda/cuda.h"

namespace seam::cuda {

void register_conv(PreparerTable&) {}

}  // namespace seam::cuda
