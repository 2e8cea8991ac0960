// The plan's account of itself, for `seam plan`: per kernel, what it covers, bytes and
// FLOPs, a roofline estimate on a device model, the generated kernel's registers,
// spills and shared memory, and why it was fused or not; then kernels and bytes before and after fusion.
#pragma once
#include <string>
#include <vector>

#include "seam/plan.h"

namespace seam {

// The ceilings a roofline estimate uses. The H200 figures are measured (docs/perf.md):
// HBM bandwidth reached by a streaming kernel, and dense TF32 GEMM throughput.
struct DeviceModel {
  std::string name = "H200";
  double bandwidth_gbps = 4250;
  double tensor_tflops = 400;  // TF32 GEMMs and convolutions
  double half_tflops = 785;    // bf16 and f16 GEMMs and convolutions (fp32 accumulation)
  double simt_tflops = 60;     // everything else, f32 on the CUDA cores
};

// `unfused`: the same step compiled without fusion. `compile_kernels`: compile each
// generated kernel (NVRTC; no GPU needed) to report its registers and spills.
// `measured_ms`: each step's measured time (Executable::time_steps), shown next to the
// estimate when given.
std::string explain_plan(const Plan& fused, const Plan& unfused, const DeviceModel& d, bool compile_kernels,
                         const std::vector<double>& measured_ms = {});

}  // namespace seam
