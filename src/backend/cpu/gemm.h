// Row-major GEMM for the CPU kernels: c = op(a) op(b) + beta * c, with a [m, k] (or
// [k, m] transposed), b [k, n] (or [n, k]), all densely packed. OpenBLAS when the build
// has it; otherwise a plain blocked loop, so the reference backend builds anywhere.
#pragma once
#include <cstdint>

namespace seam::cpu {

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float beta, float* c);
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, const double* b, double beta, double* c);

}  // namespace seam::cpu
