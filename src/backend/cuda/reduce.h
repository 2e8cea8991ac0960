// Column sums by the reduction kernels of `sum`, for GEMM preparers: bias gradients, and
// partial sums whose place is known only when the launch runs (a workspace's: its address
// changes while the plan is prepared).
#pragma once
#include <functional>

#include "backend/cuda/cuda.h"

namespace seam::cuda {

// out [cols] = the column sums of x_type [rows, cols] (f32, bf16 or f16; out the same or
// another of them), x read at x() when the launch runs, 16-byte aligned there.
Launch column_sums_at(const StepArgs& a, std::function<const void*()> x, const TensorType& x_type,
                      const DeviceTensor& out);

}  // namespace seam::cuda
