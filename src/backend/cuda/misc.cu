// CUDA kernels of the misc family (being written).
#include "backend/cuda/cuda.h"

namespace seam::cuda {

void register_misc(PreparerTable&) {}

}  // namespace seam::cuda
