// GEMM through CBLAS, or a blocked fallback accumulating in double.
#include "backend/cpu/gemm.h"
#include "backend/cpu/parallel.h"

#include <cstddef>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#ifdef SEAM_HAS_BLAS
#include <cblas.h>
#endif

namespace seam::cpu {

namespace {

#ifndef SEAM_HAS_BLAS
// i-l-j order walks b and c rows contiguously; transposed operands are first packed so
// the inner loop always reads memory in order.
template <class T>
void gemm_loops(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, const T* b, T beta, T* c) {
  std::vector<double> acc(static_cast<size_t>(n));
  std::vector<T> bt;
  if (tb) {
    bt.resize(static_cast<size_t>(k * n));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < k; ++l) bt[static_cast<size_t>(l * n + j)] = b[j * k + l];
    b = bt.data();
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) acc[static_cast<size_t>(j)] = beta == T(0) ? 0.0 : static_cast<double>(beta * c[i * n + j]);
    for (int64_t l = 0; l < k; ++l) {
      const double av = ta ? a[l * m + i] : a[i * k + l];
      const T* brow = b + l * n;
      for (int64_t j = 0; j < n; ++j) acc[static_cast<size_t>(j)] += av * static_cast<double>(brow[j]);
    }
    for (int64_t j = 0; j < n; ++j) c[i * n + j] = static_cast<T>(acc[static_cast<size_t>(j)]);
  }
}
#endif

// OpenBLAS's own threads spin on sched_yield between GEMMs (a fifth of a training run's
// CPU time on 2 cores, measured with perf), taking the core the kernels' loops around the
// GEMMs need; the CPU kernels cut their work over the cores themselves
// (src/backend/cpu/parallel.h), GEMMs included, so OpenBLAS runs each call on one.
[[maybe_unused]] void blas_single_threaded() {
#ifdef SEAM_HAS_OPENBLAS
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
#endif
}

}  // namespace

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float beta, float* c) {
#ifdef SEAM_HAS_BLAS
  blas_single_threaded();
  // Large products in blocks of kRows rows of c, spread over the cores: each block is one
  // single-threaded GEMM over all of k, and the blocks are the same for any number of
  // cores, so the results are too. Inside another parallel loop (a convolution's images)
  // the blocks run on their caller.
  constexpr int64_t kRows = 64;
  const int64_t rows = m * n * k >= (int64_t{1} << 21) ? kRows : m;
  const int64_t blocks = (m + rows - 1) / rows;
  parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t m0 = blk * rows, m1 = std::min(m, m0 + rows);
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                  static_cast<int>(m1 - m0), static_cast<int>(n), static_cast<int>(k), 1.0f,
                  ta ? a + m0 : a + m0 * k, static_cast<int>(ta ? m : k), b, static_cast<int>(tb ? k : n), beta,
                  c + m0 * n, static_cast<int>(n));
    }
  });
#else
  gemm_loops(ta, tb, m, n, k, a, b, beta, c);
#endif
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, const double* b, double beta, double* c) {
#ifdef SEAM_HAS_BLAS
  blas_single_threaded();
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), 1.0, a, static_cast<int>(ta ? m : k), b,
              static_cast<int>(tb ? k : n), beta, c, static_cast<int>(n));
#else
  gemm_loops(ta, tb, m, n, k, a, b, beta, c);
#endif
}

std::string gemm_library() {
#ifdef SEAM_HAS_OPENBLAS
  std::string config = openblas_get_config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY ..."
  const size_t version_end = config.find(' ', config.find(' ') + 1);
  blas_single_threaded();
  return config.substr(0, version_end) + ", " + openblas_get_corename() + " kernels, one thread a call, " +
         std::to_string(std::max(1u, std::thread::hardware_concurrency())) + " cores";
#elif defined(SEAM_HAS_BLAS)
  return "CBLAS";
#else
  return "plain loops (built without BLAS)";
#endif
}

const char* blas_core_override() {
#if defined(SEAM_HAS_OPENBLAS) && (defined(__x86_64__) || defined(__i386__))
  if (std::getenv("OPENBLAS_CORETYPE")) return nullptr;
  if (std::strcmp(openblas_get_corename(), "Prescott") != 0) return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

}  // namespace seam::cpu
