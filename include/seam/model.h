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
#include <type_traits>
#include <vector>

#include "seam/error.h"
#include "seam/graph.h"
#include "seam/plan.h"

namespace seam {

namespace dist {
class Comm;
}

enum class Mode : uint8_t { train, eval };

// A named tensor on the host, as checkpoints store it.
struct HostTensor {
  std::string name;
  TensorType type;
  std::vector<std::byte> data;
};

// A value in the memory of the program's GPU, handed to other libraries without a host
// round trip (DLPack): `data` is device memory the array owns (freed, after the device
// has finished with it, when the last owner lets go), `type` is what Program::read
// would return (the graph's dtype, NCHW order), `device` the GPU's index.
struct DeviceArray {
  std::shared_ptr<std::byte> data;
  TensorType type;
  int device = 0;
};

// Everything the step reads that changes from step to step.
struct StepState {
  int64_t step = 0;      // optimizer updates done; also the dropout RNG offset
  uint64_t seed = 0;     // dropout and initialization seed
  double lr = 0.0;       // learning rate of the last update
  double grad_norm = 0;  // global gradient L2 norm of the last update (before clipping)
  // Dynamic loss scaling: the scale the next step multiplies the loss by (0: not started,
  // the first takes LossScaling::init) and the clean steps since it last changed.
  double loss_scale = 0;
  int64_t scale_good = 0;
  int64_t skipped_steps = 0;  // updates skipped for a non-finite loss or gradient
  int64_t skip_streak = 0;    // of them, the ones in a row up to the last step
  // The CUDA backend keeps grad_norm, loss_scale, scale_good, skipped_steps and
  // skip_streak in device memory; Program::sync_state() brings them here.
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
  // Activations the backward recomputes instead of keeping them from the forward, for
  // memory: "gelu" (a GELU's output that a weight gradient reads), "layer_norm" (a layer
  // norm's; src/passes/fuse.h).
  std::vector<std::string> recompute;
  // The output layer (the logits' GEMM, the fused loss and the GEMMs of the logits'
  // gradient) run in this many chunks of rows, so one chunk's logits exist at a time
  // (src/passes/fuse.h, chunk_output_layer); 1: whole.
  int output_chunks = 1;
  // Bytes the model's buffers (parameters, gradients, working copies, optimizer state) and
  // the step's arena may take together (library workspaces aside); 0: no limit. Where the
  // step needs more, layer norm gradients come from the norms' outputs (their inputs no
  // longer kept; not where `recompute` names "layer_norm"), the output layer runs in more
  // chunks (up to 4), then more GELU and then layer norm outputs are recomputed (after
  // those `recompute` names), the fewest that fit; Plan::budget_note says which. An error
  // where even all of them do not fit.
  size_t memory_budget = 0;
  // Steps between a buffer's last read and the reuse of its space (LowerRequest); -1:
  // the backend's choice (1 where it runs independent steps concurrently, else 0).
  int reuse_gap = -1;
};

enum class Device : uint8_t { cpu, cuda };

// The precision policy of a model. f32: IEEE fp32 everywhere. tf32: fp32 values, GEMMs and
// convolutions on TF32 tensor cores (10-bit mantissa products, fp32 accumulation), as
// PyTorch's allow_tf32. bf16 and f16: mixed precision as PyTorch's autocast (the
// precision pass, src/passes/precision.h): GEMMs and convolutions read and write the
// 16-bit type with fp32 accumulation, softmax, losses, normalization statistics and
// reductions compute in fp32, parameters and optimizer state stay fp32 (the masters),
// gradients reach them in fp32. The CPU reference emulates 16-bit storage (every store
// rounds to nearest even), so it stays the oracle at every policy.
enum class Precision : uint8_t { f32, tf32, bf16, f16 };
const char* precision_name(Precision p);
std::optional<Precision> parse_precision(std::string_view name);
// The 16-bit storage type of a mixed policy, or nullopt for f32 and tf32.
std::optional<DType> low_dtype(Precision p);
// The names parse_precision knows, for error messages.
std::vector<std::string> precision_names();
// A node, or every node of a scope ("fc4" covers "fc4/linear" and "fc4/relu"), computing
// at its own precision (f32, bf16 or f16) in a model of another policy: e.g. the last
// linear layer in f32. The longest matching name wins. TF32 stays the model's choice
// for its f32 GEMMs.
struct PrecisionOverride {
  std::string node;
  Precision precision;
};
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
const char* epilogue_policy_name(EpiloguePolicy p);
std::optional<EpiloguePolicy> parse_epilogue_policy(std::string_view name);  // "fastest", "fused", ...
std::vector<std::string> epilogue_policy_names();  // for messages and flag checks

// Where convolutions run channels-last (the layout pass, src/passes/layout.h). automatic:
// nhwc on CUDA at tf32, bf16 and f16, where cuDNN's implicit-GEMM kernels on tensor cores
// read NHWC (ResNet-18's step on the H200: 1.86 ms against 2.24 in bf16); nchw on the CPU
// (its im2col reads NCHW planes) and in f32 on the GPU (6.4 ms against 11.3: cuDNN's FMA
// convolutions are faster in NCHW). Results are the same either way, within the
// precision's rounding of a different summation order.
enum class LayoutPolicy : uint8_t { automatic, nchw, nhwc };
const char* layout_policy_name(LayoutPolicy p);
std::optional<LayoutPolicy> parse_layout_policy(std::string_view name);  // "auto", "nchw", "nhwc"
std::vector<std::string> layout_policy_names();  // for messages and flag checks

struct ModelOptions {
  uint64_t seed = 0;
  Device device = Device::cpu;
  Precision precision = Precision::f32;
  std::vector<PrecisionOverride> precision_overrides;  // checked when the model is made
  // false (with a bf16 or f16 policy): the parameters themselves are stored in 16 bits,
  // with no f32 masters, as llm.c can: half the parameter and gradient memory, and the
  // update rounds each new value stochastically (so updates below half a unit in the last
  // place still move a parameter on average). Moments stay f32.
  bool master_weights = true;
  LayoutPolicy layout = LayoutPolicy::automatic;
  bool cuda_graph = true;  // replay each step as one captured CUDA Graph (CUDA)
  EpiloguePolicy epilogue = EpiloguePolicy::fastest;
  // CUDA streams a step may spread independent steps over (step_dependencies): e.g. a
  // layer's weight gradient beside the input gradient of the layer below. 1: one stream.
  int cuda_streams = 4;
  // Bitwise repeatable GPU steps: every algorithm the step runs is the heuristics' fixed
  // pick (no timing, no cached picks), and no kernel sums with atomics in an order that
  // varies (the embedding gradient reduces each row's occurrences in their order).
  // The CPU's steps repeat their bits either way.
  bool deterministic = false;
  // The processes training this model together (src/dist/comm.h), one batch share each:
  // a training plan sums the gradients over them and divides by their number before the
  // update (Plan::buckets; on GPUs through NCCL, also for a group of one). Empty: this
  // process alone, no sums.
  std::shared_ptr<dist::Comm> comm;
  size_t grad_bucket_bytes = kGradBucketBytes;  // about how much one all-reduce carries
  // 1: ZeRO-1 over `comm`'s ranks (Plan::zero): each keeps 1/ranks of the optimizer
  // moments and updates that shard of the parameters (a group of one takes the same path).
  // save_tensors and load_tensors then take every rank's part (collectives).
  int zero = 0;
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
  // How ModelOptions::layout was resolved: a line per region of convolutions, with the
  // layout it runs in and the estimates behind the choice (src/passes/layout.h).
  std::vector<std::string> layout_choices() const;
  StepState& state();
  Device device() const;

  class Program compile(const CompileOptions& options);
  // The plan compile() would run, without the program: no arena, no kernels prepared,
  // nothing allocated (`seam plan` of a model larger than the host's memory).
  Plan plan(const CompileOptions& options) const;

  // Host copies of parameters and state tensors, by name, in their dtype.
  std::vector<std::byte> read_param(const std::string& name) const;
  // Bytes the model holds on its device: parameters, gradients, state, optimizer moments,
  // 16-bit working copies (each program adds its arena and its steps' workspaces).
  size_t device_bytes() const;
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
  // An input from the memory of the program's GPU (a CUDA tensor through DLPack), copied
  // on the device. The producer's work must be ordered before input_stream() (DLPack's
  // `stream` argument does that); `owner` keeps the memory alive until the copy is done.
  // Fails on the CPU, for memory of another GPU, or for a size that is not the input's.
  void set_input_device(const std::string& name, const void* data, size_t bytes, std::shared_ptr<const void> owner);
  // The stream device inputs are copied on (a cudaStream_t); nullptr on the CPU.
  void* input_stream() const;
  // The GPU the program runs on; -1 on the CPU.
  int device_index() const;
  // Runs the step once; a plan with an optimizer advances the step counter. On a GPU it
  // returns as soon as the work is queued.
  void run();
  // Waits for the work queued so far and throws the first bad-input error a kernel
  // reported (reads do this too).
  void check();
  // Waits for the work queued so far and returns the model's step state with what the
  // device keeps of it (gradient norm, loss scale, skipped steps) brought up to date.
  const StepState& sync_state();
  // Times each plan step alone (median of `reps` runs, milliseconds), for `seam plan
  // --measure` and `seam bench --breakdown`. Replaying steps alone would update the
  // parameters, optimizer moments, running statistics and step counter, so everything
  // the model keeps (and the plan's inputs) is saved first and restored after: the model
  // is bitwise as it was.
  std::vector<double> time_steps(int reps);
  std::vector<std::byte> read(const std::string& output) const;
  // The type read() returns for an output: the graph's dtype and NCHW order, whatever
  // the precision and layout passes stored.
  TensorType output_type(const std::string& output) const;
  std::vector<std::byte> read_grad(const std::string& param) const;
  // An output or a gradient as read() and read_grad() give it, in fresh device memory,
  // the work queued so far done. Fails on the CPU.
  DeviceArray read_device(const std::string& output) const;
  DeviceArray read_grad_device(const std::string& param) const;
  // An output's or a gradient's elements as T, the type of its dtype: float for f32,
  // double for f64, int32_t for i32, uint8_t for u8, uint16_t for the bits of bf16 and
  // f16. The bytes are copied, not converted, so any other T is an error naming the value.
  template <class T>
  std::vector<T> read_as(const std::string& output) const {
    return cast_bytes<T>(read(output, &elements_fit<T>, sizeof(T)));
  }
  template <class T>
  std::vector<T> grad_as(const std::string& param) const {
    return cast_bytes<T>(read_grad(param, &elements_fit<T>, sizeof(T)));
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
  // read_as's and grad_as's test of T against the value's dtype.
  template <class T>
  static bool elements_fit(DType t) {
    return std::is_same_v<T, float>      ? t == DType::f32
           : std::is_same_v<T, double>   ? t == DType::f64
           : std::is_same_v<T, int32_t>  ? t == DType::i32
           : std::is_same_v<T, uint8_t>  ? t == DType::u8
           : std::is_same_v<T, uint16_t> ? is_half(t)
                                         : false;
  }
  // read() and read_grad() that first test the element type (fits) of the value they
  // resolve, so a mismatch fails before anything is copied.
  std::vector<std::byte> read(const std::string& output, bool (*fits)(DType), size_t element_bytes) const;
  std::vector<std::byte> read_grad(const std::string& param, bool (*fits)(DType), size_t element_bytes) const;
  [[noreturn]] static void elements_mismatch(const std::string& what, DType t, size_t element_bytes);

  // An input's binding in the plan; nullptr for an input of the model this plan does not
  // read; fails naming the model's inputs for any other name.
  const Binding* input_binding(const std::string& name) const;
  std::shared_ptr<Model::Core> core_;
  std::unique_ptr<Plan> plan_;  // stable address: the executable refers to it
  std::byte* arena_ = nullptr;
  std::unique_ptr<Executable> exe_;
};

}  // namespace seam
