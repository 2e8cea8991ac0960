// The backend interface: memory for the regions of a model, and executables prepared
// from plans. Backends implement kernels and nothing else; they never change a plan.
#pragma once
#include <cstddef>
#include <memory>

#include "seam/model.h"
#include "seam/plan.h"

namespace seam {

struct Regions {
  std::byte* arena = nullptr;
  std::byte* params = nullptr;
  std::byte* grads = nullptr;
  std::byte* state = nullptr;
  std::byte* opt = nullptr;  // optimizer moments: slot s at s * layout.param_bytes
  std::byte* base(Region r) const;
};

class Executable {
 public:
  virtual ~Executable() = default;
  // Runs every step, then the optimizer update if the plan has one.
  virtual void run(StepState& state) = 0;
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
  virtual std::unique_ptr<Executable> prepare(const Plan& plan, const Regions& regions) = 0;
};

std::shared_ptr<Backend> make_cpu_backend();

}  // namespace seam
