// Fused plans against unfused ones: the same bits (values and gradients) on random
// inputs, and generated kernels that compile. For the fusion tests.
#pragma once
#include <string>
#include <vector>

#include "seam/seam.h"

namespace seam::testing {

// Runs `loss` (and reads `outputs` and every parameter's gradient) with fusion on and
// off (at a precision policy); returns the fused plan. Inputs of any float dtype get
// random values of theirs. A tolerance for plans whose other passes change bits (a cast
// of a GEMM's result folded into the GEMM skips a rounding).
Plan expect_same_bits(const Graph& g, Var loss, const std::vector<Var>& outputs, const std::string& what,
                      Precision policy = Precision::f32, double tol = 0);

// With CUDA in the build: every fused step's generated kernel compiles (NVRTC needs no GPU).
void expect_kernels_compile(const Plan& plan);

}  // namespace seam::testing
