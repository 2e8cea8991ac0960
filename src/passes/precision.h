// The precision pass: a mixed policy (bf16, f16) as PyTorch's autocast, on the forward
// graph before autodiff, so that the backward follows the casts:
//   - GEMMs and convolutions (matmul, linear, conv2d) read 16-bit operands, casting the
//     ones that are not (parameters, f32 data), and write 16 bits; they accumulate in f32.
//   - Ops that compute in f32 (softmax, log_softmax, the losses, layer and batch norm,
//     sum, mean) read 16-bit values as they are; losses, statistics and sums are f32,
//     softmax and norm outputs keep their input's dtype (a GEMM reads them next).
//   - Every other op (elementwise, shape, dropout, embedding) computes in its operands'
//     widest dtype, parameters counting as 16-bit: they get one working copy each.
// Parameters stay f32 (the optimizer's masters); the gradient of a working copy's cast is
// a cast back, so parameter gradients reach the gradient buffer in f32. fold_casts then
// folds the casts into the kernels next to them.
#pragma once
#include <string>
#include <vector>

#include "passes/fuse.h"
#include "seam/model.h"

namespace seam {

// Throws seam::Error naming the override when it names no node or scope of g, or asks
// for a precision its ops do not have (tf32 is a policy for a whole model's f32 GEMMs).
void check_overrides(const Graph& g, const std::vector<PrecisionOverride>& overrides);

// Parameters stored in 16 bits (ModelOptions::master_weights = false): each parameter of
// g is made in `low` and read through a cast back to its dtype, so every node sees what
// it saw; apply_precision then reads the 16-bit value directly wherever a consumer wants
// it (an exact round trip), and the parameter's gradient arrives in `low`.
FuseResult params_in(const Graph& g, DType low);

// Rewrites g at `policy` with `overrides`; f32 and tf32 without overrides leave g as it is.
FuseResult apply_precision(const Graph& g, Precision policy, const std::vector<PrecisionOverride>& overrides);

// Folds a cast of a GEMM's, a convolution weight gradient's or a reduction's result into
// that op (its "dtype" attribute: a weight gradient written in f32 from 16-bit operands), when every float output of the
// op goes only to casts to one dtype and none is kept. Casts next to elementwise ops are
// fuse_elementwise's to absorb.
FuseResult fold_casts(const Graph& g, const std::vector<ValueId>& keep);

}  // namespace seam
