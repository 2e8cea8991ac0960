// The CPU backend: host memory and a straight walk over the plan's steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/optim.h"
#include "common/half.h"
#include "dist/comm.h"
#include "ops/layout.h"

namespace seam {

std::byte* Regions::base(Region r) const {
  switch (r) {
    case Region::arena: return arena;
    case Region::params: return params;
    case Region::grads: return grads;
    case Region::state: return state;
    case Region::working: return working;
  }
  return nullptr;
}

namespace cpu {

namespace {

class CpuExecutable : public Executable {
 public:
  CpuExecutable(const Plan& plan, const Regions& r) : plan_(plan), regions_(r) {
    if (!plan.buckets.empty() && (!r.comm || r.comm->size() != plan.ranks))
      fail("the plan sums its gradients over ", plan.ranks, " ranks, but runs in a group of ", r.comm ? r.comm->size() : 1);
    for (const GradBucket& b : plan.buckets)
      for (const BufferRef& p : b.parts)
        if (p.type.dtype != DType::f32 && p.type.dtype != DType::f64)
          fail("data parallelism on the CPU sums f32 or f64 gradients, not ", dtype_name(p.type.dtype),
               " (16-bit parameters without f32 masters)");
    size_t scratch = 0, permuted = 0;
    for (auto& s : plan.steps) {
      Prepared p{kernel_for(s.op), {}, {}, {}, {}, {}, {}, {}, {}, {}};
      for (auto& b : s.in) p.in.push_back({r.base(b.region) + b.offset, b.type});
      for (auto& b : s.out) p.out.push_back({r.base(b.region) + b.offset, b.type});
      // 16-bit operands: the kernel runs on f32 copies, and each 16-bit output is rounded
      // to nearest even when it is stored, as the GPU stores it. A cast rounds once, from
      // its own source, so it reads and writes 16 bits itself.
      p.in_f32 = p.in;
      p.out_f32 = p.out;
      size_t used = 0;
      for (auto* list : {&p.in_f32, &p.out_f32})
        for (size_t k = 0; k < list->size(); ++k) {
          TensorView& v = (*list)[k];
          if (!is_half(v.dtype()) || s.op == Op::cast) continue;
          p.widen.push_back({list == &p.out_f32, k, used});
          v.type.dtype = DType::f32;
          used += static_cast<size_t>(v.numel());
        }
      scratch = std::max(scratch, used);
      if (is_nhwc(s.attrs)) permuted = std::max(permuted, plan_nchw(s, p));
      steps_.push_back(std::move(p));
    }
    scratch_.resize(scratch);
    nchw_scratch_.resize(permuted);
    for (Prepared& p : steps_) {
      for (const Widen& w : p.widen) (w.out ? p.out_f32 : p.in_f32)[w.index].data = reinterpret_cast<std::byte*>(scratch_.data() + w.offset);
      // The kernel reads the NCHW copies; the permutes read and write the views above.
      p.in_k = p.in_f32, p.out_k = p.out_f32;
      for (const Permute& m : p.permute) (m.out ? p.out_k : p.in_k)[m.index] = {nchw_scratch_.data() + m.offset, m.nchw};
    }
    StepState none;
    for (auto& s : plan.init) {
      std::vector<TensorView> out;
      for (auto& b : s.out) out.push_back({r.base(b.region) + b.offset, b.type});
      const std::vector<TensorView> no_inputs;
      kernel_for(s.op)(KernelArgs{s, no_inputs, out, none});
    }
  }

  // Inputs wait here and are copied into the arena as a run begins: their arena place
  // may be reused after their last reader (lower.cpp).
  void set_input(size_t index, std::span<const std::byte> data) override {
    if (staged_.size() < plan_.inputs.size()) staged_.resize(plan_.inputs.size());
    staged_.at(index).assign(data.begin(), data.end());
  }

  std::vector<double> time_steps(int reps) override {
    copy_inputs();
    std::vector<double> ms;
    StepState state;
    for (size_t i = 0; i < steps_.size(); ++i) {
      std::vector<double> t;
      for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        run_step(i, state);
        t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
      ms.push_back(t[t.size() / 2]);
    }
    return ms;
  }

  ExecStats stats() override { return {static_cast<int>(steps_.size()), static_cast<int>(steps_.size()), false}; }

  void run(StepState& state) override {
    copy_inputs();
    all_reduce(-1);
    for (size_t i = 0; i < steps_.size(); ++i) {
      try {
        run_step(i, state);
      } catch (const Error& e) {
        fail("step ", i, " (", op_name(plan_.steps[i].op), " '", plan_.steps[i].name, "'): ", e.what());
      }
      all_reduce(static_cast<int>(i));
    }
    if (plan_.optimizer) {
      double loss = 0;  // the plan's loss, for the update's finiteness check
      if (const Binding* b = plan_.loss.empty() ? nullptr : plan_.output(plan_.loss)) {
        const std::byte* p = regions_.base(b->ref.region) + b->ref.offset;
        if (b->ref.type.dtype == DType::f64) std::memcpy(&loss, p, 8);
        else if (b->ref.type.dtype == DType::f32) loss = *reinterpret_cast<const float*>(p);
      }
      // Every rank decides on the same (mean) loss whether to skip the update.
      if (plan_.ranks > 1) regions_.comm->all_reduce_sum(&loss, 1), loss /= plan_.ranks;
      optimizer_update(*plan_.optimizer, plan_.layout, regions_, state, loss, plan_.working, plan_.zero);
      ++state.step;
    }
  }

 private:
  // The buckets whose last writer is step `after`: summed over the ranks, divided by
  // their number (in the gradients' own type, as every rank does it alike). Under ZeRO-1
  // each rank gets the sum of its shard's values only.
  void all_reduce(int after) {
    for (const GradBucket& b : plan_.buckets) {
      if (b.after != after) continue;
      for (const BufferRef& p : b.parts) {
        std::byte* d = regions_.grads + p.offset;
        if (p.type.dtype == DType::f32) scale_sum(reinterpret_cast<float*>(d), p);
        else scale_sum(reinterpret_cast<double*>(d), p);
      }
    }
  }
  template <class T>
  void scale_sum(T* d, const BufferRef& part) {
    const auto n = static_cast<size_t>(part.type.numel());
    size_t lo = 0, hi = n;
    if (plan_.zero) {
      // The shards' boundaries within this part.
      const size_t first = part.offset / sizeof(T);
      std::vector<size_t> split = zero_split(plan_.layout.param_bytes / sizeof(T), plan_.ranks);
      for (size_t& s : split) s = std::clamp(s, first, first + n) - first;
      regions_.comm->reduce_scatter_sum(d, split);
      lo = split[static_cast<size_t>(regions_.comm->rank())], hi = split[static_cast<size_t>(regions_.comm->rank()) + 1];
    } else {
      regions_.comm->all_reduce_sum(d, n);
    }
    const T inv = T(1) / static_cast<T>(plan_.ranks);
    for (size_t k = lo; k < hi; ++k) d[k] *= inv;
  }

  void copy_inputs() {
    for (size_t k = 0; k < staged_.size(); ++k) {
      const BufferRef& b = plan_.inputs[k].ref;
      if (!staged_[k].empty()) std::memcpy(regions_.arena + b.offset, staged_[k].data(), staged_[k].size());
    }
  }

  struct Widen {
    bool out;
    size_t index;
    size_t offset;  // in scratch_, in floats
  };
  // A 4-d operand of an nhwc step, run through the step's NCHW kernel on a copy.
  struct Permute {
    bool out;
    size_t index;
    size_t offset;  // in nchw_scratch_, in bytes
    TensorType nchw;
  };
  struct Prepared {
    Kernel kernel;
    std::vector<TensorView> in, out;
    std::vector<TensorView> in_f32, out_f32;  // 16-bit operands on f32 scratch
    std::vector<Widen> widen;
    std::vector<Permute> permute;
    std::vector<TensorView> in_k, out_k;  // the kernel's views: 4-d operands of nhwc steps in NCHW order
    std::unique_ptr<PlanStep> nchw;  // an nhwc step as its NCHW kernel sees it
  };

  // An nhwc step runs as its NCHW kernel on permuted copies of its 4-d operands (the
  // filter's [C_out, kh, kw, C_in] order permutes the same way), with its `shape`
  // attribute in NCHW order: one implementation, the reference for both layouts.
  // Returns the scratch bytes the copies take (steps run one at a time and share them).
  static size_t plan_nchw(const PlanStep& s, Prepared& p) {
    size_t used = 0;
    p.nchw = std::make_unique<PlanStep>(s);
    p.nchw->attrs.set("layout", std::string("nchw"));
    if (s.attrs.has("shape")) p.nchw->attrs.set("shape", nchw_order(s.attrs.ints("shape")));
    for (const auto* list : {&p.in_f32, &p.out_f32})
      for (size_t k = 0; k < list->size(); ++k) {
        const TensorType& t = (*list)[k].type;
        if (t.shape.size() != 4) continue;
        p.permute.push_back({list == &p.out_f32, k, used, {t.dtype, nchw_order(t.shape)}});
        used += (t.bytes() + 63) / 64 * 64;
      }
    return used;
  }

  static void convert(const TensorView& half, float* f, bool to_float) {
    auto* h = half.as<uint16_t>();
    const int64_t n = half.numel();
    const DType t = half.dtype();
    if (to_float)
      for (int64_t i = 0; i < n; ++i) f[i] = half_to_float(h[i], t);
    else
      for (int64_t i = 0; i < n; ++i) h[i] = float_to_half(f[i], t);
  }

  void run_step(size_t i, StepState& state) {
    Prepared& p = steps_[i];
    // Outputs are widened too: a kernel may accumulate into its output.
    for (const Widen& w : p.widen)
      convert((w.out ? p.out : p.in)[w.index], scratch_.data() + w.offset, true);
    for (const Permute& m : p.permute) {
      const TensorView& v = (m.out ? p.out_f32 : p.in_f32)[m.index];
      reorder_nhwc(v.data, nchw_scratch_.data() + m.offset, v.shape(), dtype_size(v.dtype()), true);
    }
    p.kernel(KernelArgs{p.nchw ? *p.nchw : plan_.steps[i], p.in_k, p.out_k, state});
    for (const Permute& m : p.permute)
      if (m.out) {
        const TensorView& v = p.out_f32[m.index];
        reorder_nhwc(nchw_scratch_.data() + m.offset, v.data, v.shape(), dtype_size(v.dtype()), false);
      }
    for (const Widen& w : p.widen)
      if (w.out) convert(p.out[w.index], scratch_.data() + w.offset, false);
  }
  const Plan& plan_;
  Regions regions_;
  std::vector<Prepared> steps_;
  std::vector<float> scratch_;
  std::vector<std::byte> nchw_scratch_;
  std::vector<std::vector<std::byte>> staged_;  // by Plan::inputs index
};

// ", with N bytes available" from /proc/meminfo's MemAvailable, or nothing where unknown.
std::string available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  long long kib = 0;
  while (std::getline(f, line))
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1)
      return ", with " + std::to_string(kib * 1024) + " bytes available";
  return {};
}

class CpuBackend : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  std::byte* alloc(size_t bytes) override {
    size_t size = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    auto* p = static_cast<std::byte*>(std::aligned_alloc(64, size));
    if (!p) fail("out of host memory allocating ", bytes, " bytes", available_memory());
    std::memset(p, 0, size);
    return p;
  }
  void release(std::byte* p) override { std::free(p); }
  void upload(std::byte* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const std::byte* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void fill_zero(std::byte* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  void round_f32(std::byte* dst, DType to, const std::byte* src, size_t n) override {
    auto* h = reinterpret_cast<uint16_t*>(dst);
    const auto* f = reinterpret_cast<const float*>(src);
    for (size_t i = 0; i < n; ++i) h[i] = float_to_half(f[i], to);
  }
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
std::optional<size_t> cuda_device_used_bytes() { return std::nullopt; }
std::optional<std::string> cuda_pci_bus_id() { return std::nullopt; }
std::optional<GeneratedKernelReport> generated_kernel_report(const PlanStep&) { return std::nullopt; }
#endif

}  // namespace seam
