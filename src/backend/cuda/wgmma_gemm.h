// A GEMM of seam's own for Hopper (sm_90a): TMA copies, warpgroup MMAs, one persistent
// block an SM. It exists for the epilogues cuBLASLt runs slowly or not at all beside its
// main loop (W6's GELU record costs cuBLASLt ~45 us a layer over a plain GEMM): here an
// epilogue is code of ours that writes its outputs through shared memory and bulk tensor
// stores while the next tile's operands already load.
//
//   D[m, n] = epilogue(A[m, k] . B[n, k]^T), all row-major bf16, f32 accumulation
//
// which is a linear layer's forward, y = x W^T, with W stored [out, in]. A may be stored
// [k, m] instead (a_km) and B [k, n] (b_kn): D = A B with B [k, n] is a layer's data
// gradient dx = dy W, D = A^T B with both is its weight gradient dW = dy^T x. Epilogues:
//   none           D = A B^T
//   bias           D = A B^T + bias[n]
//   bias_gelu_aux  aux = A B^T + bias (the pre-activation, rounded to bf16: the record
//                  matmul_act_grad reads), D = gelu_tanh(A B^T + bias) from the f32 sum
//   dgelu          D = A B^T * gelu_tanh'(aux), aux the record above (read): matmul_act_grad;
//                  with col_sums, also the column sums of D (as stored, bf16) over each 16
//                  rows, f32 [wgmma_gemm_col_sum_rows(m), n]: summed over their rows, the
//                  bias gradient of the layer whose input gradient D is
//   bias_add       D = A B^T + bias + aux, aux [m, n] read (a residual stream; it may be D
//                  itself): linear_add; A [m, k] and B [n, k] only
//   sums_a         D = A B^T, and the column sums of A ([m, k], as read) over each 64
//                  rows, f32 [wgmma_gemm_a_sum_rows(m), k]: with A = dy, a linear layer's
//                  data gradient dx = dy W and its bias gradient's partials in one read of
//                  dy (linear_grad_input_bias)
//
// Offered as the variant `wgmma` of linear (bias or none), linear_add (with a bias),
// linear_act_aux (gelu with a bias), matmul_act_grad (gelu), matmul (2-D, plain) and
// linear_grad_input_bias, timed against cuBLASLt's like any variant (matmul.cu);
// seam_wgmma_bench (bench/wgmma_bench.cu) measures it alone.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "backend/cuda/cuda.h"

namespace seam::cuda {

enum class WgmmaEpilogue { none, bias, bias_gelu_aux, dgelu, sums_a, bias_add };

// Whether the current GPU is one the kernel is built for (compute capability 9.0).
bool wgmma_gemm_runs_here();

// Whether this GPU and these operands can take the kernel; if not, why (in *why). It needs
// compute capability 9.0 (the code is built for sm_90a only), k and n multiples of 8 (the
// tensor maps' row pitch a multiple of 16 bytes; m too with A stored [k, m]) and 16-byte
// aligned pointers.
bool wgmma_gemm_fits(int64_t m, int64_t n, int64_t k, const void* a, const void* b, const void* d,
                     const void* aux, std::string* why, bool a_km = false);

// What a launch takes beyond its operands.
struct WgmmaOptions {
  const void* bias = nullptr;  // n bf16 values (bias, bias_gelu_aux and bias_add)
  void* aux = nullptr;         // [m, n] bf16, written by bias_gelu_aux, read by dgelu and bias_add
  // 1, or 2 for pairs of blocks on tiles one above the other that load B's tile once
  // between them (each half, delivered to both), a third less traffic from L2. Single
  // blocks are what the steps run: offered beside them at W6's ten shapes, pairs lost each
  // by 0.1-5.5% (docs/perf.md, 2026-12-07).
  int cluster = 1;
  bool a_km = false, b_kn = false;  // A is stored [k, m], B [k, n] (row-major), not [m, k] and [n, k]
  // Where the column sums go, asked each time the launch runs (a workspace's address is
  // known only then): DGELU's of D over each 16 rows ([wgmma_gemm_col_sum_rows(m), n] f32,
  // 8-byte aligned), sums_a's of A over each 64 rows ([wgmma_gemm_a_sum_rows(m), k] f32,
  // 16-byte aligned).
  std::function<float*()> col_sums;
};

// The launch of one such GEMM on fixed buffers (the tensor maps are built here, once).
Launch wgmma_gemm(int sm_count, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* d,
                  WgmmaEpilogue epilogue, const WgmmaOptions& options = {});

// The rows of DGELU's column sums for an m-row product: one a 16 rows.
int64_t wgmma_gemm_col_sum_rows(int64_t m);
// The rows of sums_a's column sums of A for an m-row product: two a 128-row tile.
int64_t wgmma_gemm_a_sum_rows(int64_t m);

// The blocks such a launch runs at once (a persistent grid: one an SM, or as many pairs as
// fit), for reports.
int wgmma_gemm_grid(int sm_count, int64_t m, int64_t n, int cluster);

}  // namespace seam::cuda
