// The optimizer update of the CPU backend.
#pragma once
#include "backend/backend.h"
#include "backend/cpu/cpu.h"

namespace seam::cpu {

// One update of every parameter from its gradient; sets st.lr and st.grad_norm. The
// caller advances st.step.
void optimizer_update(const OptimizerConfig& c, const Layout& layout, const Regions& r, StepState& st);

}  // namespace seam::cpu
