// CUDA kernels of the shape family (being written).
#include "backend/cuda/cuda.h"

namespace seam::cuda {

void register_shape(PreparerTable&) {}

}  // namespace seam::cuda
