// Row-major GEMM for the CPU kernels: c = op(a) op(b) + beta * c, with a [m, k] (or
// [k, m] transposed), b [k, n] (or [n, k]), all densely packed. OpenBLAS when the build
// has it; otherwise a plain blocked loop, so the reference backend builds anywhere.
#pragma once
#include <cstdint>
#include <string>

namespace seam::cpu {

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float beta, float* c);
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, const double* b, double beta, double* c);

// What runs the GEMMs, for `seam --version`: "OpenBLAS 0.3.21, SkylakeX kernels", or the
// plain loop.
std::string gemm_library();

// OpenBLAS picks its kernels from the CPU's model number when it is loaded. Under
// hypervisors that report a model it does not know it falls back to its generic SSE3
// kernels ("Prescott"), about 6x slower than its AVX-512 ones on the same machine
// (measured: 26 against 186 GFLOP/s for a 1024^3 SGEMM). When that happened and
// OPENBLAS_CORETYPE is unset, the value of OPENBLAS_CORETYPE that names the kernels the
// CPU's features do support ("SkylakeX" with AVX-512, "Haswell" with AVX2 and FMA);
// nullptr otherwise. The choice is made at load time only, so the caller sets the variable
// and runs the program again (tools/seam/main.cpp).
const char* blas_core_override();

}  // namespace seam::cpu
