// CUDA kernels of the loss family (being written).
#include "backend/cuda/cuda.h"

namespace seam::cuda {

void register_loss(PreparerTable&) {}

}  // namespace seam::cuda
