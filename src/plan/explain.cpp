// `seam plan`'s account of a step: what each kernel covers, what it moves and computes,
// a roofline estimate, and why it was fused or not; then the totals against the plan
// compiled without fusion.
#include "plan/explain.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "backend/backend.h"
#include "ops/registry.h"
#include "ops/elementwise.h"
#include "ops/fused_ew.h"

namespace seam {

namespace {

bool is_library(Op op) {
  switch (op) {
    case Op::conv2d: case Op::conv2d_grad_input: case Op::conv2d_grad_weight: case Op::conv2d_bn:
    case Op::batch_norm: case Op::batch_norm_grad:
      return true;
    default:
      return is_gemm(op);
  }
}

bool on_tensor_cores(Op op) { return is_library(op) && op != Op::batch_norm && op != Op::batch_norm_grad; }

double step_bytes(const PlanStep& s) {
  double b = 0;
  for (auto& r : s.in) b += static_cast<double>(r.bytes());
  for (auto& r : s.out) b += static_cast<double>(r.bytes());
  return b;
}

std::string covers(const PlanStep& s) {
  const std::string act = s.attrs.has("act") ? s.attrs.s("act") : "";
  switch (s.op) {
    case Op::fused_elementwise: {
      const EwProgram p = EwProgram::parse(s.attrs.s("program"));
      std::string c;
      for (auto& in : p.code) c += (c.empty() ? "" : "+") + std::string(op_name(in.op));
      for (EwReduce r : p.reduce)
        if (summed(r) || r == EwReduce::ln_y)
          c += r == EwReduce::sum ? "+sum" : r == EwReduce::mean ? "+mean" : "+layer_norm";
      return c;
    }
    case Op::linear_act: case Op::linear_act_aux: return "linear+" + act;
    case Op::linear_add: return "linear+add";
    case Op::matmul_act_grad: return "matmul+" + act + "_grad" + (s.out.size() > 1 ? "+bias_grad" : "");
    case Op::linear_grad_weight_bias: return "weight_grad+bias_grad";
    case Op::linear_grad_input_bias: return "matmul+bias_grad";
    case Op::cross_entropy_with_grad: return "cross_entropy+cross_entropy_grad";
    case Op::embedding_grad: return s.in.size() > 2 ? "embedding_grad+add" : "embedding_grad";
    default: return op_name(s.op);
  }
}

std::string why(const PlanStep& s) {
  switch (s.op) {
    case Op::fused_elementwise: {
      const EwProgram p = EwProgram::parse(s.attrs.s("program"));
      std::ostringstream o;
      const auto sums = std::count_if(p.reduce.begin(), p.reduce.end(), summed);
      const auto stored = std::count(p.reduce.begin(), p.reduce.end(), EwReduce::none);
      o << "fused: " << p.code.size() << " elementwise ops in one pass; " << static_cast<long>(p.code.size()) - stored
        << " of their values stay in registers, " << stored << " written (read elsewhere)";
      if (sums) {
        const auto& axes = s.attrs.ints("axes");
        o << ", " << sums << " summed over " << (axes.empty() ? std::string("every axis") : "axes " + shape_str(axes))
          << " on the way";
      }
      if (p.normalizes()) o << ", the last normalized row by row (layer norm) before it is stored";
      std::vector<TensorType> in;
      for (auto& b : s.in) in.push_back(b.type);
      std::vector<DType> out;  // each output at its own size
      for (auto& b : s.out) out.push_back(b.type.dtype);
      const EwTraffic t = ew_traffic(p, in, s.attrs.ints("axes"), out);
      o << (fused_clearly_faster(t) ? "; kept over one kernel per op by the model: " : "; timed against one kernel per op: ")
        << t.str();
      return o.str();
    }
    case Op::linear_act: case Op::linear_act_aux:
      return "fused: bias and activation on the GEMM's output before it is stored (epilogue, or split if faster)";
    case Op::linear_add:
      return "fused: the residual read by the GEMM (beta = 1) and added to its output before it is stored";
    case Op::matmul_act_grad:
      return s.out.size() > 1 ? "fused: the activation's derivative applied to the GEMM's output before it is stored; "
                                "its column sums (the bias gradient of the linear layer before the activation) "
                                "from it, not from a second pass of that layer's weight-gradient GEMM"
                              : "fused: the activation's derivative applied to the GEMM's output before it is stored";
    case Op::linear_grad_weight_bias: return "fused: the bias gradient from the weight gradient's GEMM (or split if faster)";
    case Op::linear_grad_input_bias:
      return "fused: the bias gradient as the column sums of dy, taken by the data gradient's GEMM as it reads dy "
             "(not a second read beside the weight gradient)";
    case Op::cross_entropy_with_grad: return "fused: loss and gradient from one read of the logits";
    case Op::embedding_grad:
      if (s.in.size() > 2) return "fused: the rows added into the tied weight's other gradient where it lies (no add pass)";
      break;
    case Op::conv2d_bn:
      return s.in.size() > 6 ? "fused: batch norm (running statistics), residual add and relu applied to the "
                               "convolution's result before it is stored"
                             : std::string("fused: batch norm (running statistics)") +
                                   (s.attrs.s("activation") == "relu" ? " and relu" : "") +
                                   " applied to the convolution's result before it is stored";
    case Op::conv2d: case Op::conv2d_grad_input:
      if (s.op == Op::conv2d_grad_input && s.attrs.has("residual") && s.attrs.i("residual") == 1)
        return "fused: the value's other gradient added to the input gradient before it is stored";
      if (s.attrs.s("activation") == "relu")
        return s.op == Op::conv2d ? "fused: relu applied to the convolution's result before it is stored"
                                  : "fused: relu's derivative applied to the input gradient before it is stored";
      break;
    case Op::batch_norm: case Op::batch_norm_grad:
      if (s.attrs.has("activation") && s.attrs.s("activation") == "relu")
        return s.op == Op::batch_norm ? (s.in.size() > 5
                                             ? "fused: residual add and relu applied before the normalized value is stored"
                                             : "fused: relu applied before the normalized value is stored")
                                      : (s.out.size() > 3 ? "fused: relu's derivative applied to dy, written as the "
                                                              "residual's gradient and read by the batch norm's gradient"
                                                            : "fused: relu's derivative applied to dy before the batch "
                                                              "norm's gradient");
      break;
    default: break;
  }
  if (ew_arity(s.op) > 0) return "alone: no elementwise neighbour of its shape to fuse with";
  if (is_library(s.op)) return "boundary: a library call (cuBLASLt, cuDNN)";
  return "own kernel";
}

struct Totals {
  int kernels = 0;
  double bytes = 0, flops = 0, us = 0;
};

double estimate_us(const PlanStep& s, const DeviceModel& d) {
  const bool half = !s.in.empty() && is_half(s.in[0].type.dtype);
  const double peak = on_tensor_cores(s.op) ? (half ? d.half_tflops : d.tensor_tflops) : d.simt_tflops;
  return std::max(step_bytes(s) / (d.bandwidth_gbps * 1e3), s.flops / (peak * 1e6));
}

Totals totals(const Plan& p, const DeviceModel& d) {
  Totals t;
  for (auto& s : p.steps) {
    ++t.kernels;
    t.bytes += step_bytes(s);
    t.flops += s.flops;
    t.us += estimate_us(s, d);
  }
  return t;
}

}  // namespace

std::string explain_plan(const Plan& fused, const Plan& unfused, const DeviceModel& d, bool compile_kernels,
                         const std::vector<double>& measured_ms) {
  const bool measured = measured_ms.size() >= fused.steps.size();
  std::ostringstream o;
  char line[512];
  std::snprintf(line, sizeof line,
                "kernels of the step (estimates for %s: %.0f GB/s, tensor cores %.0f TFLOP/s in TF32 and %.0f in bf16/f16, "
                "%.0f TFLOP/s SIMT)\n",
                d.name.c_str(), d.bandwidth_gbps, d.tensor_tflops, d.half_tflops, d.simt_tflops);
  o << line;
  std::snprintf(line, sizeof line, "%4s  %-24s %-34s %10s %9s %9s %9s %5s %10s  %s\n", "#", "op", "covers", "bytes",
                "GFLOP", "est. us", measured ? "meas. us" : "", "regs", "spill/smem", "why");
  o << line;
  for (size_t i = 0; i < fused.steps.size(); ++i) {
    const PlanStep& s = fused.steps[i];
    std::string regs = "-", spill = "-";
    if (compile_kernels && s.op == Op::fused_elementwise)
      if (auto r = generated_kernel_report(s)) {  // -1: the compiler did not say
        regs = r->registers < 0 ? "?" : std::to_string(r->registers);
        spill = r->spill_bytes < 0 ? "?" : std::to_string(r->spill_bytes);
        if (r->shared_bytes > 0) spill += "/" + std::to_string(r->shared_bytes);
      }
    std::string c = covers(s);
    if (c.size() > 34) c = c.substr(0, 31) + "...";
    char meas[32] = "";
    if (measured) std::snprintf(meas, sizeof meas, "%.2f", measured_ms[i] * 1e3);
    std::snprintf(line, sizeof line, "%4zu  %-24s %-34s %10.0f %9.4f %9.2f %9s %5s %10s  %s\n", i, op_name(s.op), c.c_str(),
                  step_bytes(s), s.flops / 1e9, estimate_us(s, d), meas, regs.c_str(), spill.c_str(), why(s).c_str());
    o << line;
  }
  const Totals a = totals(unfused, d), b = totals(fused, d);
  std::snprintf(line, sizeof line,
                "fusion: %d -> %d kernels, %.2f -> %.2f MB moved, roofline estimate %.1f -> %.1f us per step "
                "(optimizer update not counted)\n",
                a.kernels, b.kernels, a.bytes / 1e6, b.bytes / 1e6, a.us, b.us);
  o << line;
  if (measured) {
    double sum = 0;
    for (size_t i = 0; i < fused.steps.size(); ++i) sum += measured_ms[i];
    std::snprintf(line, sizeof line, "measured: %.1f us for the steps each launched alone (median of 20)\n", sum * 1e3);
    o << line;
  }
  return o.str();
}

}  // namespace seam
