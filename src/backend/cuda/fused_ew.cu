// fused_elementwise on the GPU: a kernel generated for the group's program (codegen.h),
// launched over the output's elements.
#include <string>

#include "backend/backend.h"
#include "backend/cuda/check.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/gemm.h"

namespace seam::cuda {

namespace {

int current_arch() {
  int dev = 0, major = 0, minor = 0;
  SEAM_CUDA_CHECK(cudaGetDevice(&dev));
  SEAM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  SEAM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major * 10 + minor;
}

// The split variant: each op of the program by its own kernel (the unfused ops' kernels),
// temps in scratch; `unused` frees them if the generated kernel is chosen.
Variant split_variant(const StepArgs& a, const std::string& program) {
  const EwProgram prog = EwProgram::parse(program);
  std::vector<DeviceTensor> temp(prog.code.size());
  std::vector<void*> scratch;
  for (size_t j = 0; j < prog.outputs.size(); ++j) temp[static_cast<size_t>(prog.outputs[j])] = a.out[j];
  for (auto& t : temp)
    if (!t.data) {
      t = {a.ctx.scratch(a.out[0].type.bytes()), a.out[0].type};
      scratch.push_back(t.data);
    }
  std::vector<Launch> parts;
  for (size_t c = 0; c < prog.code.size(); ++c) {
    const EwInstr& in = prog.code[c];
    std::vector<DeviceTensor> operands;
    for (int v : in.args) operands.push_back(v >= 0 ? a.in[static_cast<size_t>(v)] : temp[static_cast<size_t>(-v - 1)]);
    Attrs attrs;
    if (*ew_attr(in.op)) attrs.set(ew_attr(in.op), in.p);
    parts.push_back(prepare_as_step(a, in.op, attrs, operands, {temp[c]}));
  }
  Context* ctx = &a.ctx;
  return {"split", in_order(parts), [ctx, scratch] {
            for (void* p : scratch) ctx->release(p);
          }};
}

Launch prepare_fused_elementwise(const StepArgs& a) {
  expect_f32(a);
  const Shape& os = a.out[0].shape();
  const int64_t n = a.out[0].numel();
  if (n == 0) return [](cudaStream_t) {};
  // Past the generated kernel's limits, the group runs as one kernel per op.
  size_t wide_dims = 0;
  for (int64_t d : os) wide_dims += d != 1;
  if (a.in.size() > static_cast<size_t>(kEwMaxInputs) || a.out.size() > static_cast<size_t>(kEwMaxOutputs) ||
      wide_dims > static_cast<size_t>(kEwMaxDims)) {
    a.ctx.choices.emplace_back(a.index, "split: " + std::to_string(a.in.size()) + " inputs, " +
                                            std::to_string(a.out.size()) + " outputs, " + std::to_string(wide_dims) +
                                            " dims exceed a generated kernel's " + std::to_string(kEwMaxInputs) + ", " +
                                            std::to_string(kEwMaxOutputs) + ", " + std::to_string(kEwMaxDims));
    return split_variant(a, a.step.attrs.s("program")).launch;
  }
  EwSignature s;
  s.program = a.step.attrs.s("program");
  s.arch = current_arch();
  EwArgs args{};
  args.n = n;
  // The index space, innermost dim first, without size-1 dims; each broadcast input's
  // element strides over it (0 along the dims it is broadcast on).
  std::vector<int64_t> dims;
  for (size_t d = os.size(); d-- > 0;)
    if (os[d] != 1) dims.push_back(static_cast<int64_t>(d));
  args.rank = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) args.size[i] = os[static_cast<size_t>(dims[i])];
  bool aligned = true;
  for (size_t k = 0; k < a.in.size(); ++k) {
    const Shape& is = a.in[k].shape();
    const bool strided = is != os;
    s.strided.push_back(strided);
    args.in[k] = a.in[k].as<const float>();
    aligned = aligned && !strided && reinterpret_cast<uintptr_t>(args.in[k]) % 16 == 0;
    if (!strided) continue;
    const size_t lead = os.size() - is.size();
    int64_t stride = 1;
    std::vector<int64_t> own(os.size(), 0);
    for (size_t d = is.size(); d-- > 0;) {
      own[lead + d] = is[d] == 1 ? 0 : stride;
      stride *= is[d];
    }
    for (size_t i = 0; i < dims.size(); ++i) args.st[k][i] = own[static_cast<size_t>(dims[i])];
  }
  for (size_t j = 0; j < a.out.size(); ++j) {
    args.out[j] = a.out[j].as<float>();
    aligned = aligned && reinterpret_cast<uintptr_t>(args.out[j]) % 16 == 0;
  }
  s.vec = aligned && n >= 4 ? 4 : 1;
  args.nvec = s.vec == 4 ? n / 4 : 0;
  std::shared_ptr<const GeneratedKernel> k = ew_kernel(s);
  const unsigned blocks = blocks_for(s.vec == 4 ? std::max<int64_t>(args.nvec, 1) : n, 256, static_cast<int>(grid_cap(a.ctx)));
  Launch fused = [k, args, blocks](cudaStream_t st) {
    EwArgs copy = args;
    void* params[] = {&copy};
    SEAM_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k->kernel), dim3(blocks), dim3(256), params, 0, st));
  };

  Variant split = split_variant(a, s.program);

  // A kernel that spills, or whose registers leave room for fewer than a quarter of the
  // 2048 threads an SM holds (more than 128 a thread), is not kept; otherwise both
  // variants are timed once and the pick cached (choose_variant).
  const std::string stats = std::to_string(k->registers) + " registers, " + std::to_string(k->spill_bytes) +
                            " bytes spilled, vector width " + std::to_string(s.vec);
  if (k->spill_bytes > 0 || k->registers > 128) {
    a.ctx.choices.emplace_back(a.index, "split: the generated kernel was rejected (" + stats + ")");
    return split.launch;
  }
  Launch chosen = choose_variant(a.ctx, a.index, "fused_elementwise:" + s.hash(), {{"fused", fused}, split});
  a.ctx.choices.back().second += "; generated kernel: " + stats;
  return chosen;
}

}  // namespace

void register_fused_elementwise(PreparerTable& t) { set(t, Op::fused_elementwise, prepare_fused_elementwise); }

}  // namespace seam::cuda

namespace seam {

// The kernel as the GPU would get it, assuming operands that broadcast are read through
// strides and the others vectorized (alignment is known only when prepared); for the GPU
// present, or sm_90 when there is none. Compiling needs no GPU.
std::optional<GeneratedKernelReport> generated_kernel_report(const PlanStep& step) {
  if (step.op != Op::fused_elementwise) return std::nullopt;
  cuda::EwSignature s;
  s.program = step.attrs.s("program");
  bool all_full = true;
  for (auto& b : step.in) {
    s.strided.push_back(b.type.shape != step.out[0].type.shape);
    all_full = all_full && !s.strided.back();
  }
  s.vec = all_full ? 4 : 1;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess)
    s.arch = major * 10 + minor;
  else
    (void)cudaGetLastError();
  const cuda::GeneratedKernel k = cuda::compile_ew(s);
  return GeneratedKernelReport{k.registers, k.spill_bytes, k.compile_ms};
}

}  // namespace seam
