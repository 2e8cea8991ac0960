// Memset nodes of a captured CUDA Graph rewritten as kernel nodes.
#pragma once
#include <cuda_runtime.h>

namespace seam::cuda {

// Replaces every memset node of `g` with a kernel node that writes the same bytes, with
// the same dependencies. A memset node left the GPU idle for 3-4 us on each side of it in
// W5's replayed step (the device's own trace, `seam bench --trace`), where two dependent
// kernels follow each other within 0.5-1 us; cuDNN's persistent batch norm zeroes its
// workspace with one before every call (46 a step in W5).
void memsets_as_kernels(cudaGraph_t g);

}  // namespace seam::cuda
