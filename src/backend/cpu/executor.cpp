// The CPU backend: host memory and a straight walk over the plan's steps.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/optim.h"

namespace seam {

std::byte* Regions::base(Region r) const {
  switch (r) {
    case Region::arena: return arena;
    case Region::params: return params;
    case Region::grads: return grads;
    case Region::state: return state;
  }
  return nullptr;
}

namespace cpu {

namespace {

class CpuExecutable : public Executable {
 public:
  CpuExecutable(const Plan& plan, const Regions& r) : plan_(plan), regions_(r) {
    for (auto& s : plan.steps) {
      Prepared p{kernel_for(s.op), {}, {}};
      for (auto& b : s.in) p.in.push_back({r.base(b.region) + b.offset, b.type});
      for (auto& b : s.out) p.out.push_back({r.base(b.region) + b.offset, b.type});
      steps_.push_back(std::move(p));
    }
    StepState none;
    for (auto& s : plan.init) {
      std::vector<TensorView> out;
      for (auto& b : s.out) out.push_back({r.base(b.region) + b.offset, b.type});
      const std::vector<TensorView> no_inputs;
      kernel_for(s.op)(KernelArgs{s, no_inputs, out, none});
    }
  }

  void set_input(size_t index, std::span<const std::byte> data) override {
    const BufferRef& b = plan_.inputs.at(index).ref;
    std::memcpy(regions_.arena + b.offset, data.data(), data.size());
  }

  std::vector<double> time_steps(int reps) override {
    std::vector<double> ms;
    StepState state;
    for (size_t i = 0; i < steps_.size(); ++i) {
      KernelArgs args{plan_.steps[i], steps_[i].in, steps_[i].out, state};
      std::vector<double> t;
      for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        steps_[i].kernel(args);
        t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
      ms.push_back(t[t.size() / 2]);
    }
    return ms;
  }

  ExecStats stats() override { return {static_cast<int>(steps_.size()), static_cast<int>(steps_.size()), false}; }

  void run(StepState& state) override {
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Prepared& p = steps_[i];
      KernelArgs args{plan_.steps[i], p.in, p.out, state};
      try {
        p.kernel(args);
      } catch (const Error& e) {
        fail("step ", i, " (", op_name(plan_.steps[i].op), " '", plan_.steps[i].name, "'): ", e.what());
      }
    }
    if (plan_.optimizer) {
      optimizer_update(*plan_.optimizer, plan_.layout, regions_, state);
      ++state.step;
    }
  }

 private:
  struct Prepared {
    Kernel kernel;
    std::vector<TensorView> in, out;
  };
  const Plan& plan_;
  Regions regions_;
  std::vector<Prepared> steps_;
};

class CpuBackend : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  std::byte* alloc(size_t bytes) override {
    size_t size = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    auto* p = static_cast<std::byte*>(std::aligned_alloc(64, size));
    if (!p) fail("out of host memory allocating ", bytes, " bytes");
    std::memset(p, 0, size);
    return p;
  }
  void release(std::byte* p) override { std::free(p); }
  void upload(std::byte* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const std::byte* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void fill_zero(std::byte* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  std::unique_ptr<Executable> prepare(const Plan& plan, const Regions& r) override {
    return std::make_unique<CpuExecutable>(plan, r);
  }
};

}  // namespace
}  // namespace cpu

std::shared_ptr<Backend> make_cpu_backend() { return std::make_shared<cpu::CpuBackend>(); }

#ifndef SEAM_HAS_CUDA
bool cuda_available(std::string* why) {
  if (why) *why = "this build of seam has no CUDA backend (nvcc was not found)";
  return false;
}
std::shared_ptr<Backend> make_cuda_backend(CudaOptions) { fail("this build of seam has no CUDA backend (nvcc was not found)"); }
std::optional<GeneratedKernelReport> generated_kernel_report(const PlanStep&) { return std::nullopt; }
#endif

}  // namespace seam
