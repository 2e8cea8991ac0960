// Model and Program: the user-facing way to compile and run a graph.
//
//   Graph g; ... build ...; Var loss = cross_entropy(logits, labels);
//   Model m(std::move(g), {.seed = 1});
//   Program train = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-3)});
//   train.set_input("x", batch); train.set_input("y", labels); train.run();
//
// A Model owns the parameters, their gradients, the optimizer state and the running
// statistics; every Program compiled from it (training, evaluation) shares them.
#pragma once
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "seam/error.h"
#include "seam/graph.h"
#include "seam/plan.h"

namespace seam {

enum class Mode : uint8_t { train, eval };

// A named tensor on the host, as checkpoints store it.
struct HostTensor {
  std::string name;
  TensorType type;
  std::vector<std::byte> data;
};

// Everything the step reads that changes from step to step.
struct StepState {
  int64_t step = 0;      // optimizer updates done; also the dropout RNG offset
  uint64_t seed = 0;     // dropout and initialization seed
  double lr = 0.0;       // learning rate of the last update
  double grad_norm = 0;  // CPU: global gradient L2 norm of the last update (before clipping);
                         // the CUDA backend keeps it in device memory, unread
};

struct CompileOptions {
  Mode mode = Mode::train;
  ValueId loss = -1;                         // the scalar to differentiate (and to read)
  std::optional<OptimizerConfig> optimizer;  // train: update step after the gradients
  bool gradients = false;                    // gradients of the loss without an update
  std::vector<ValueId> outputs;              // values to read after a run
  bool reuse_memory = true;                  // false: no arena reuse (planner checks)
  // Fusion (src/passes/fuse.h): GEMM epilogues and the loss with its gradient, then, with
  // fuse_elementwise, chains of elementwise ops (ending in sums) as generated kernels.
  bool fuse = true;
  bool fuse_elementwise = true;
  // Steps between a buffer's last read and the reuse of its space (LowerRequest); -1:
  // the backend's choice (1 where it runs independent steps concurrently, else 0).
  int reuse_gap = -1;
};

enum class Device : uint8_t { cpu, cuda };

// What GEMMs and convolutions compute in: IEEE fp32 (f32), or fp32 values on TF32 tensor
// cores (tf32: 10-bit mantissa products, fp32 accumulation), as PyTorch's
// allow_tf32. The CPU reference computes in fp32 either way.
enum class Precision : uint8_t { f32, tf32 };
const char* precision_name(Precision p);
std::optional<Precision> parse_precision(std::string_view name);
// The names parse_precision knows, for error messages.
std::vector<std::string> precision_names();
const char* device_name(Device d);
// The GPU when this build has the CUDA backend and the runtime sees a GPU, else the CPU.
Device default_device();

// How a fused step runs on the GPU. A GEMM with a fused epilogue (bias, activation,
// activation derivative, bias gradient): as one library GEMM with the epilogue ("fused"),
// as the plain GEMM followed by separate kernels ("split"; for the weight gradient also
// "split_t": the GEMM reads a transposed copy of dy, which suits TF32 tensor cores). A
// fused elementwise group: its generated kernel ("fused") or one kernel per op
// ("split"). Or whichever is fastest for its shape, timed once and cached (CUDA).
// Forcing split_t gives split where a step has no such variant.
enum class EpiloguePolicy { fastest, fused, split, split_t };

struct ModelOptions {
  uint64_t seed = 0;
  Device device = Device::cpu;
  Precision precision = Precision::f32;
  bool cuda_graph = true;  // replay each step as one captured CUDA Graph (CUDA)
  EpiloguePolicy epilogue = EpiloguePolicy::fastest;
  // CUDA streams a step may spread independent steps over (step_dependencies): e.g. a
  // layer's weight gradient beside the input gradient of the layer below. 1: one stream.
  int cuda_streams = 4;
};

class Backend;
class Executable;

// A Model owns its storage through a shared core, and every Program compiled from it
// holds a share: a Program stays valid after its Model is gone (it keeps the parameters,
// gradients and optimizer state alive, and the Model's accessors are simply no longer
// reachable).
class Model {
 public:
  explicit Model(Graph graph, ModelOptions options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const Graph& graph() const;
  const Layout& layout() const;
  StepState& state();
  Device device() const;

  class Program compile(const CompileOptions& options);

  // Host copies of parameters and state tensors, by name, in their dtype.
  std::vector<std::byte> read_param(const std::string& name) const;
  void write_param(const std::string& name, std::span<const std::byte> data);
  std::vector<std::byte> read_state(const std::string& name) const;
  void write_state(const std::string& name, std::span<const std::byte> data);
  // Re-initializes every parameter and state from the seed, clears optimizer state.
  void reset();

  // The model's whole training state as named tensors: parameters and state tensors
  // under their names, optimizer moments as "optimizer.m/<param>", "optimizer.v/<param>".
  std::vector<HostTensor> save_tensors() const;
  // Restores what save_tensors wrote. Every parameter and state tensor must be present
  // with its exact dtype and shape (moments are optional); everything is checked before
  // anything is written, so a failed load changes nothing.
  void load_tensors(const std::vector<HostTensor>& tensors);

 private:
  friend class Program;
  struct Core;  // graph, layout, step state, backend and storage (src/model.cpp)
  std::shared_ptr<Core> core_;
};

class Program {
 public:
  Program(Program&&) noexcept;
  Program& operator=(Program&&) noexcept;
  ~Program();

  const Plan& plan() const { return *plan_; }
  Executable& executable() { return *exe_; }
  void set_input(const std::string& name, std::span<const std::byte> data);
  template <class T>
  void set_input(const std::string& name, std::span<const T> data) {
    set_input(name, std::as_bytes(data));
  }
  // Runs the step once; a plan with an optimizer advances the step counter. On a GPU it
  // returns as soon as the work is queued.
  void run();
  // Waits for the work queued so far and throws the first bad-input error a kernel
  // reported (reads do this too).
  void check();
  // Times each plan step alone (median of `reps` runs, milliseconds), for `seam plan
  // --measure` and `seam bench --breakdown`. Replaying steps alone would update the
  // parameters, optimizer moments, running statistics and step counter, so everything
  // the model keeps (and the plan's inputs) is saved first and restored after: the model
  // is bitwise as it was.
  std::vector<double> time_steps(int reps);
  std::vector<std::byte> read(const std::string& output) const;
  std::vector<std::byte> read_grad(const std::string& param) const;
  template <class T>
  std::vector<T> read_as(const std::string& output) const {
    return cast_bytes<T>(read(output));
  }
  template <class T>
  std::vector<T> grad_as(const std::string& param) const {
    return cast_bytes<T>(read_grad(param));
  }

  template <class T>
  static std::vector<T> cast_bytes(const std::vector<std::byte>& b) {
    std::vector<T> r(b.size() / sizeof(T));
    std::memcpy(r.data(), b.data(), r.size() * sizeof(T));
    return r;
  }

 private:
  friend class Model;
  Program(std::shared_ptr<Model::Core> core, Plan plan);
  std::shared_ptr<Model::Core> core_;
  std::unique_ptr<Plan> plan_;  // stable address: the executable refers to it
  std::byte* arena_ = nullptr;
  std::unique_ptr<Executable> exe_;
};

}  // namespace seam
