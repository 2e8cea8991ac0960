// The optimizer update of the CPU backend.
#pragma once
#include "backend/backend.h"
#include "backend/cpu/cpu.h"

namespace seam::cpu {

// One update of every parameter from its gradient; sets st.lr and st.grad_norm, and skips
// the update (counting it) where `loss` or the gradient norm is not finite, with the loss
// scale's bookkeeping (OptimizerConfig::loss_scaling). The caller advances st.step.
// With `working`, the parameters' working copies (Regions::working) are written too.
// With Plan::zero: the update of this rank's shard only (its moments are all r.opt
// holds), the gradient norm summed over the ranks, and the parameters gathered after.
void optimizer_update(const OptimizerConfig& c, const Layout& layout, const Regions& r, StepState& st, double loss,
                      std::optional<DType> working, bool zero = false);

}  // namespace seam::cpu
