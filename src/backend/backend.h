// The backend interface: memory for the regions of a model, and executables prepared
// from plans. Backends implement kernels and nothing else; they never change a plan.
#pragma once
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <vector>

#include "seam/model.h"
#include "seam/plan.h"

namespace seam {

struct Regions {
  std::byte* arena = nullptr;
  std::byte* params = nullptr;
  std::byte* grads = nullptr;
  std::byte* state = nullptr;
  std::byte* opt = nullptr;  // optimizer moments: slot s at s * layout.moment_bytes()
  // Backends that keep the step counter and seed in their own memory (CUDA) keep them
  // here, and record in `synced` the host state they last received or produced.
  std::byte* counters = nullptr;
  StepState* synced = nullptr;
  std::byte* working = nullptr;  // the parameters' 16-bit working copies (Plan::working)
  dist::Comm* comm = nullptr;    // the ranks Plan::buckets are summed over
  std::byte* base(Region r) const;
};

// What a prepared plan launches per step, for benchmarks and `seam plan`.
struct ExecStats {
  int kernels = 0;  // kernel launches per step (library calls count their kernels)
  int nodes = 0;    // all operations per step (kernels, copies, memsets)
  bool graph = false;
  int streams = 1;  // streams the step's work is spread over
  size_t device_bytes = 0;  // memory held beyond the plan's arena (workspaces, steps' scratch)
  // Where a step had equivalent variants (a fused epilogue or separate kernels): the
  // plan step index and what was chosen, with the times that decided it.
  std::vector<std::pair<int, std::string>> choices;
};

class Executable {
 public:
  virtual ~Executable() = default;
  // Sets the plan's input `index` (Plan::inputs order) for the next run; on a GPU the
  // copy overlaps the step in flight.
  virtual void set_input(size_t index, std::span<const std::byte> data) = 0;
  // The same from this backend's own memory (Program::set_input_device); `owner` is held
  // until the copy has run. Backends whose memory is the host's have no such inputs.
  virtual void set_input_device(size_t index, const void* data, std::shared_ptr<const void> owner);
  // The stream set_input_device copies on (Program::input_stream); nullptr without one.
  virtual void* input_stream() { return nullptr; }
  // Runs every step, then the optimizer update if the plan has one. May return before
  // the work is done; reading results waits for it.
  virtual void run(StepState& state) = 0;
  // Throws the first bad-input error a kernel reported since the last check (after the
  // work is done); backends whose kernels throw directly have none.
  virtual void check() {}
  // Brings what the device keeps of the step state (StepState's comment) to `state`,
  // after the work queued so far; backends that update `state` directly have nothing to do.
  virtual void sync_state(StepState& /*state*/) {}
  // What the gradient buffers must be multiplied by to give the gradients the last update
  // used (unscaled and clipped), after the work queued so far: the CUDA update applies
  // that factor as it reads them and leaves them as the backward wrote them; 1 where the
  // update writes them back (the CPU) or no update ran since the step state was set.
  virtual float grad_read_scale() { return 1.0f; }
  virtual ExecStats stats() { return {}; }
  // Times each plan step alone (median of `reps` runs, milliseconds), for breakdowns.
  // The replays write what the steps write (parameters, running statistics, the step
  // counter): Program::time_steps saves and restores all of it around this call.
  virtual std::vector<double> time_steps(int reps) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual std::byte* alloc(size_t bytes) = 0;  // zero-filled
  virtual void release(std::byte* p) = 0;
  virtual void upload(std::byte* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const std::byte* src, size_t bytes) = 0;
  virtual void fill_zero(std::byte* dst, size_t bytes) = 0;
  // The GPU this backend runs on; -1 for the host.
  virtual int device_index() const { return -1; }
  // For Program::read_device: `bytes` of this backend's memory outside every arena, owned
  // by the pointer (freed once the device is done with it), and a copy into it of n
  // values from src (dtype `from`) to dtype `to`, each multiplied by `scale` in f32 on
  // the way (a gradient's grad_read_scale), reordered from channels-last to NCHW order
  // when `nhwc` (then `nchw_shape` is 4-d), finished before the call returns. Backends
  // whose memory is the host's have neither.
  virtual std::shared_ptr<std::byte> alloc_exported(size_t bytes);
  virtual void copy_converted(std::byte* dst, DType to, const std::byte* src, DType from, const Shape& nchw_shape,
                              bool nhwc, float scale = 1.0f);
  // dst[i] = src[i] rounded to nearest even in `to` (bf16 or f16), for n f32 values in
  // this backend's memory: the parameters' working copies.
  virtual void round_f32(std::byte* dst, DType to, const std::byte* src, size_t n) = 0;
  virtual std::unique_ptr<Executable> prepare(const Plan& plan, const Regions& regions) = 0;
};

std::shared_ptr<Backend> make_cpu_backend();
struct CudaOptions {
  bool tf32 = false;  // f32 GEMMs and convolutions may use TF32 tensor cores
  bool graph = true;  // replay each step as one captured CUDA Graph
  EpiloguePolicy epilogue = EpiloguePolicy::fastest;
  int streams = 4;    // streams a step may spread independent steps over
  bool deterministic = false;  // ModelOptions::deterministic
};
// What the compiler reports for the generated kernel of a fused_elementwise step (NVRTC,
// for the GPU present or sm_90 without one); nullopt in a build without CUDA.
struct GeneratedKernelReport {
  int registers = 0, spill_bytes = 0;  // -1: the compiler's report did not say
  int shared_bytes = 0;
  double compile_ms = 0;  // 0: it came from a cache
  std::string compiler_log;
};
std::optional<GeneratedKernelReport> generated_kernel_report(const PlanStep& step);

// Throws seam::Error if the build has no CUDA backend or no GPU is usable.
std::shared_ptr<Backend> make_cuda_backend(CudaOptions options = {});
// Whether make_cuda_backend would find a GPU (cheap: creates no context or handles).
bool cuda_available(std::string* why = nullptr);
// The current GPU's memory in use by every process, as the driver counts it
// (cudaMemGetInfo's total - free); nullopt without a CUDA build or GPU.
std::optional<size_t> cuda_device_used_bytes();
// The current CUDA device's PCI bus id ("0000:17:00.0", what NVML finds it by); nullopt
// without a CUDA build or a GPU.
std::optional<std::string> cuda_pci_bus_id();

}  // namespace seam
