// seam's sm_90 GEMM (backend/cuda/wgmma_gemm.h) against cuBLASLt on W6's linear layers,
// side by side on the same buffers: the plain product, with a bias, and with the GELU
// record (cuBLASLt's GELU_AUX_BIAS); and the backward's plain products, whose operands are
// stored the other way. cuBLASLt runs every candidate its heuristic offers
// and keeps the fastest; each time is the mean of `reps` launches after one warm-up, two
// passes. The outputs are compared with cuBLASLt's (RMS of the difference over the RMS).
//
//   build-gpu/seam_wgmma_bench [reps]
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/wgmma_gemm.h"

namespace {

using seam::cuda::WgmmaEpilogue;

__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * scale);
  }
}

__global__ void squared_difference(const __nv_bfloat16* x, const __nv_bfloat16* y, size_t n, double* sums) {
  double d = 0, r = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const double a = __bfloat162float(x[i]), b = __bfloat162float(y[i]);
    d += (a - b) * (a - b);
    r += b * b;
  }
  atomicAdd(&sums[0], d);
  atomicAdd(&sums[1], r);
}

double relative_rms(const void* got, const void* want, size_t n, double* sums) {
  SEAM_CUDA_CHECK(cudaMemset(sums, 0, 2 * sizeof(double)));
  squared_difference<<<1024, 256>>>(static_cast<const __nv_bfloat16*>(got), static_cast<const __nv_bfloat16*>(want), n,
                                    sums);
  SEAM_CUDA_LAUNCH_CHECK();
  double h[2];
  SEAM_CUDA_CHECK(cudaMemcpy(h, sums, sizeof h, cudaMemcpyDeviceToHost));
  return std::sqrt(h[0] / (h[1] + 1e-300));
}

template <class F>
float mean_us(F&& launch, int reps) {
  cudaEvent_t e0, e1;
  SEAM_CUDA_CHECK(cudaEventCreate(&e0));
  SEAM_CUDA_CHECK(cudaEventCreate(&e1));
  launch();
  SEAM_CUDA_CHECK(cudaEventRecord(e0));
  for (int r = 0; r < reps; ++r) launch();
  SEAM_CUDA_CHECK(cudaEventRecord(e1));
  SEAM_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  SEAM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  SEAM_CUDA_CHECK(cudaEventDestroy(e0));
  SEAM_CUDA_CHECK(cudaEventDestroy(e1));
  return ms * 1e3f / reps;
}

// cuBLASLt's fastest candidate for D[m, n] = A[m, k] B[n, k]^T (+ epilogue), row-major:
// column-major D^T[n, m] = op_T(B as [k, n]) . A as [k, m]. With A stored [k, m] (a_km)
// it reads column-major as [m, k] (op T), with B stored [k, n] (b_kn) as [n, k] (op N).
float cublaslt_us(cublasLtHandle_t lt, void* ws, size_t ws_bytes, int m, int n, int k, bool a_km, bool b_kn,
                  const void* a, const void* b, void* d, WgmmaEpilogue e, const void* bias, void* aux, int reps) {
  cublasLtMatmulDesc_t desc;
  SEAM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_b = b_kn ? CUBLAS_OP_N : CUBLAS_OP_T, op_a = a_km ? CUBLAS_OP_T : CUBLAS_OP_N;
  SEAM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
  SEAM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a));
  if (e != WgmmaEpilogue::none) {
    const cublasLtEpilogue_t ep = e == WgmmaEpilogue::bias            ? CUBLASLT_EPILOGUE_BIAS
                                  : e == WgmmaEpilogue::bias_gelu_aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                      : CUBLASLT_EPILOGUE_DGELU;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    SEAM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    if (e != WgmmaEpilogue::dgelu) {
      SEAM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
      SEAM_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
    }
    if (aux) {
      const int64_t ld = n;
      SEAM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
      SEAM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
  }
  cublasLtMatrixLayout_t la, lb, ld;
  if (b_kn) SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, k, n));
  else SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k));
  if (a_km) SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, m, k, m));
  else SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));
  SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, m, n));
  cublasLtMatmulPreference_t pref;
  SEAM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  SEAM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                         sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t found[16];
  int count = 0;
  SEAM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 16, found, &count));
  const float one = 1, zero = 0;
  float best = INFINITY;
  int pick = -1;
  for (int i = 0; i < count; ++i) {
    auto run = [&] {
      return cublasLtMatmul(lt, desc, &one, b, la, a, lb, &zero, d, ld, d, ld, &found[i].algo, ws, ws_bytes, nullptr);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate that cannot run is skipped
    const float us = mean_us([&] { SEAM_CUBLAS_CHECK(run()); }, reps);
    if (us < best) best = us, pick = i;
  }
  if (pick < 0) seam::fail("cuBLASLt offered no candidate that runs");
  SEAM_CUBLAS_CHECK(
      cublasLtMatmul(lt, desc, &one, b, la, a, lb, &zero, d, ld, d, ld, &found[pick].algo, ws, ws_bytes, nullptr));
  SEAM_CUDA_CHECK(cudaDeviceSynchronize());
  SEAM_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
  SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
  SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
  SEAM_CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
  return best;
}

}  // namespace

int main(int argc, char** argv) try {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  int sms = 0;
  SEAM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cublasLtHandle_t lt;
  SEAM_CUBLAS_CHECK(cublasLtCreate(&lt));
  const size_t ws_bytes = size_t{32} << 20;
  void *ws, *sums;
  SEAM_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  SEAM_CUDA_CHECK(cudaMalloc(&sums, 2 * sizeof(double)));
  struct Shape {
    const char* name;
    int m, n, k;
    bool a_km = false, b_kn = false, gelu_grad = false;  // the backward's layouts
  };
  // The forward's products with every epilogue; the data gradients (B stored [k, n]) and
  // weight gradients (A stored [k, m] too) of the fc, its projection and qkv.
  const Shape shapes[] = {{"fc", 16384, 3072, 768},         {"qkv", 16384, 2304, 768},
                          {"fcproj", 16384, 768, 3072},     {"proj", 16384, 768, 768},
                          {"lm_head", 16384, 50304, 768},   {"dx fcproj", 16384, 3072, 768, false, true, true},
                          {"dx fc", 16384, 768, 3072, false, true}, {"dx qkv", 16384, 768, 2304, false, true},
                          {"dx proj", 16384, 768, 768, false, true}, {"dW fc", 3072, 768, 16384, true, true},
                          {"dW fcproj", 768, 3072, 16384, true, true}, {"dW qkv", 2304, 768, 16384, true, true}};
  for (const Shape& s : shapes) {
    void *a, *b, *bias, *d0, *d1, *x0, *x1, *col_sums;
    const size_t m = s.m, n = s.n, k = s.k, mn = m * n;
    SEAM_CUDA_CHECK(cudaMalloc(&a, m * k * 2));
    SEAM_CUDA_CHECK(cudaMalloc(&b, n * k * 2));
    SEAM_CUDA_CHECK(cudaMalloc(&bias, n * 2));
    for (void** p : {&d0, &d1, &x0, &x1}) SEAM_CUDA_CHECK(cudaMalloc(p, mn * 2));
    SEAM_CUDA_CHECK(cudaMalloc(&col_sums, std::max(seam::cuda::wgmma_gemm_col_sum_rows(s.m) * n,
                                                   seam::cuda::wgmma_gemm_a_sum_rows(s.m) * k) * 4));
    fill<<<1024, 256>>>(static_cast<__nv_bfloat16*>(a), m * k, 1, 0.2f);
    fill<<<1024, 256>>>(static_cast<__nv_bfloat16*>(b), n * k, 2, 0.2f);
    fill<<<64, 256>>>(static_cast<__nv_bfloat16*>(bias), n, 3, 1.0f);
    fill<<<1024, 256>>>(static_cast<__nv_bfloat16*>(x1), mn, 4, 6.0f);  // DGELU's record (read by both)
    SEAM_CUDA_LAUNCH_CHECK();
    const double flop = 2.0 * s.m * s.n * s.k;
    for (int pass = 0; pass < 2; ++pass)
      for (WgmmaEpilogue e :
           {WgmmaEpilogue::none, WgmmaEpilogue::bias, WgmmaEpilogue::bias_gelu_aux, WgmmaEpilogue::dgelu}) {
        // The forward's products with the forward's epilogues; the backward's plain, and the fc
        // projection's data gradient with DGELU.
        const bool backward = s.a_km || s.b_kn;
        const bool wanted = backward ? e == WgmmaEpilogue::none || (s.gelu_grad && e == WgmmaEpilogue::dgelu)
                                     : e != WgmmaEpilogue::dgelu;
        if (!wanted) continue;
        const bool gelu = e == WgmmaEpilogue::bias_gelu_aux;
        const bool dgelu = e == WgmmaEpilogue::dgelu;
        const char* what = e == WgmmaEpilogue::none ? "plain" : gelu ? "gelu+record" : dgelu ? "dgelu" : "bias";
        const float lt_us =
            cublaslt_us(lt, ws, ws_bytes, s.m, s.n, s.k, s.a_km, s.b_kn, a, b, d0, e, bias,
                        gelu ? x0 : dgelu ? x1 : nullptr, reps);
        // Single blocks, pairs, and the column sums too: DGELU's of D, a data gradient's of A
        // (which cuBLASLt leaves to a BGRADB pass of the weight gradient: ~40 us more there).
        const bool sums_a = e == WgmmaEpilogue::none && s.b_kn && !s.a_km;
        for (int run = 0; run < (dgelu || sums_a ? 3 : 2); ++run) {
          const int cluster = run == 1 ? 2 : 1;
          seam::cuda::WgmmaOptions o{.bias = bias, .aux = gelu || dgelu ? x1 : nullptr, .cluster = cluster,
                                     .a_km = s.a_km, .b_kn = s.b_kn};
          if (run == 2) o.col_sums = [col_sums] { return static_cast<float*>(col_sums); };
          const WgmmaEpilogue own_e = run == 2 && sums_a ? WgmmaEpilogue::sums_a : e;
          const seam::cuda::Launch own = seam::cuda::wgmma_gemm(sms, s.m, s.n, s.k, a, b, d1, own_e, o);
          const float own_us = mean_us([&] { own(nullptr); }, reps);
          SEAM_CUDA_CHECK(cudaDeviceSynchronize());
          std::printf("%-10s %5d x %5d x %4d %-12s cuBLASLt %8.1f us %4.0f TFLOP/s  "
                      "own (cluster %d, %3d blocks) %8.1f us "
                      "%4.0f TFLOP/s  %.2fx  diff %.1e%s\n",
                      s.name, s.m, s.n, s.k, run == 2 ? (dgelu ? "dgelu+sums" : "plain+sums_a") : what, lt_us,
                      flop / lt_us * 1e-6, cluster,
                      seam::cuda::wgmma_gemm_grid(sms, s.m, s.n, cluster), own_us, flop / own_us * 1e-6,
                      lt_us / own_us, relative_rms(d1, d0, mn, static_cast<double*>(sums)),
                      gelu ? (" record " + std::to_string(relative_rms(x1, x0, mn, static_cast<double*>(sums)))).c_str()
                           : "");
        }
      }
    for (void* p : {a, b, bias, d0, d1, x0, x1, col_sums}) SEAM_CUDA_CHECK(cudaFree(p));
  }
  SEAM_CUBLAS_CHECK(cublasLtDestroy(lt));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "seam_wgmma_bench: %s\n", e.what());
  return 1;
}
