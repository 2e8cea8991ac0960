// The CUDA backend's kernel interface. For each plan step a preparer runs once, when a
// plan is prepared: it checks dtypes, builds library descriptors, picks algorithms and
// reserves scratch memory, and returns a Launch that only enqueues work on a stream.
// Launches capture everything by value, so the same sequence can be replayed or
// captured into a CUDA Graph.
//
// Kernels cannot throw: one that meets bad data (an embedding id or a label out of range)
// records it in the device error slot with report_error(); the host turns the first such
// report into a seam::Error when it next reads results.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "seam/model.h"
#include "seam/plan.h"

namespace seam::cuda {

struct DeviceTensor {
  void* data = nullptr;
  TensorType type;
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
  int64_t numel() const { return type.numel(); }
  const Shape& shape() const { return type.shape; }
  DType dtype() const { return type.dtype; }
};

// Step-to-step state in device memory, read and advanced by kernels (so a captured graph
// stays valid): the optimizer step, the dropout seed, the learning rate it used.
struct DeviceCounters {
  int64_t step;
  uint64_t seed;
  float lr;
  float grad_norm;
  float loss_scale;  // StepState's fields of the same names
  int32_t scale_good;
  int64_t skipped_steps;
  int64_t skip_streak;
  // The factor the last update applied to the gradients as it read them (unscaling and
  // clipping): it leaves the buffers as the backward wrote them (writing the clipped
  // values back was 0.5 GB on each clipped GPT-2 124M step), and
  // Executable::grad_read_scale gives it to whoever reads them.
  float grad_scale;
};

// The first bad input a kernel met: which step, what, and two numbers for the message.
struct DeviceError {
  int32_t step;  // plan step index, -1 if none
  int32_t code;
  int64_t a, b, c;
};

enum ErrorCode : int32_t {
  kNoError = 0,
  kEmbeddingId = 1,   // a: position, b: id, c: rows
  kLabelRange = 2,    // a: row, b: label, c: classes
  kZeroGamma = 3,     // a: column (layer norm's backward from its output)
};

class GemmCache;

// Shared by every step of one prepared plan.
class Context {
 public:
  cudaStream_t stream = nullptr;
  void* cublaslt = nullptr;  // cublasLtHandle_t
  void* cudnn = nullptr;     // cudnnHandle_t
  GemmCache* gemm_cache = nullptr;
  bool tf32 = false;  // f32 GEMMs and convolutions may use TF32 tensor cores (ModelOptions::precision)
  EpiloguePolicy epilogue = EpiloguePolicy::fastest;  // see choose_variant (gemm.h)
  // ModelOptions::deterministic: each choice a fixed rule's (the heuristics' first, the
  // first variant offered), never a timing's or a cached one's.
  bool deterministic = false;
  DeviceCounters* counters = nullptr;
  DeviceError* error = nullptr;
  int sm_count = 0;

  // Persistent device memory for one step's own use (zeroed); freed with the plan, or
  // earlier by release() (a variant that was not chosen).
  void* scratch(size_t bytes);
  void release(void* p);
  // One workspace shared by the steps of a stream (they run one after another); a launch
  // reads workspace() and workspace_size() when it runs. While the plan is prepared it
  // grows as steps state their needs, at once, so that launches timed then
  // (choose_variant) can use it; each need is kept for the step being prepared
  // (preparing_step), -1 for work outside the plan's steps.
  void need_workspace(size_t bytes);
  // The step being prepared needs `bytes` and no more: it asked for more while it timed
  // candidates that were not chosen.
  void set_workspace_need(size_t bytes);
  size_t workspace_need() const;  // the step being prepared's, so far
  void* workspace() const { return lane_workspace_[static_cast<size_t>(lane_)]; }
  size_t workspace_size() const { return lane_workspace_size_[static_cast<size_t>(lane_)]; }
  void set_preparing_step(int step) { preparing_ = step; }
  // Steps may run on several streams (lanes), each with a workspace of its own: the
  // executable sets the lane before it enqueues a step, whose launch reads workspace().
  // Once every step is prepared, set_lanes sizes each lane's workspace to the largest
  // need among its steps (lane_of[step]); work outside the steps runs on lane 0.
  void set_lanes(const std::vector<int>& lane_of, int count);
  void set_lane(int lane) { lane_ = lane; }

  // Device memory held for the steps beyond the plan's arena: the workspaces and every
  // step's scratch.
  size_t device_bytes() const;

  // What a preparer chose for its step where it had a choice (plan step index -> a line).
  std::vector<std::pair<int, std::string>> choices;

  // Device memory a step leaves for a later one beside the plan's values (cuDNN's fused
  // batch norm writes a reserve space that only its own backward call reads), keyed by
  // the place of a value the first step writes and the second reads: steps are prepared
  // in plan order, so the entry a reader finds is its producer's. `kind` says what wrote it.
  struct Carried {
    void* data = nullptr;
    size_t bytes = 0;
    int kind = 0;
  };
  std::map<std::pair<Region, size_t>, Carried> carried;

  ~Context();

 private:
  std::vector<void*> scratch_;
  std::vector<size_t> scratch_sizes_;  // scratch_'s, for device_bytes()
  std::vector<void*> lane_workspace_{nullptr};  // lane 0's serves preparation too
  std::vector<size_t> lane_workspace_size_{0};
  std::vector<size_t> step_need_;  // by plan step
  size_t outside_need_ = 0;        // of work that is not a plan step
  int preparing_ = -1;
  bool lanes_set_ = false;
  int lane_ = 0;
};

struct StepArgs {
  const PlanStep& step;
  int index;  // position in the plan, for error reports
  std::vector<DeviceTensor> in, out;
  Context& ctx;
};

using Launch = std::function<void(cudaStream_t)>;
using Preparer = Launch (*)(const StepArgs&);
using PreparerTable = std::vector<Preparer>;

// The preparer for an op; throws if the CUDA backend has none.
Preparer preparer_for(Op op);

void register_elementwise(PreparerTable& t);
void register_reduce(PreparerTable& t);
void register_shape(PreparerTable& t);
void register_misc(PreparerTable& t);
void register_matmul(PreparerTable& t);
void register_softmax(PreparerTable& t);
void register_loss(PreparerTable& t);
void register_norm(PreparerTable& t);        // layer_norm
void register_batch_norm(PreparerTable& t);  // batch_norm (cuDNN)
void register_conv(PreparerTable& t);
void register_conv_bn(PreparerTable& t);  // conv2d_bn (inference)
void register_pool(PreparerTable& t);
void register_attention(PreparerTable& t);  // attention (kernels of its own)
void register_fused_elementwise(PreparerTable& t);  // generated kernels (codegen.h)

inline void set(PreparerTable& t, Op op, Preparer p) { t.at(static_cast<size_t>(op)) = p; }

// Prepares `op` on the given tensors as a step of its own (attributes as given): the
// kernels of a split variant are the unfused ops' kernels.
Launch prepare_as_step(const StepArgs& a, Op op, Attrs attrs, std::vector<DeviceTensor> in,
                       std::vector<DeviceTensor> out);
// Milliseconds per run of `run` as a step runs it: a few runs captured into one CUDA
// graph and replayed, after a warm-up (gemm.cu); -1 where `run` returns false (a
// candidate that does not launch). For choosing among a library's candidates.
float time_in_graph(const std::function<bool(cudaStream_t)>& run, cudaStream_t s);

// Where the backend's caches live: $XDG_CACHE_HOME/seam (an absolute one; relative ones
// are ignored, as the XDG spec says), else $HOME/.cache/seam; empty if neither is set.
std::string cache_root();

// The second kernel of a reduction whose range was cut into chunks, each chunk's sums
// stored as double partials (deterministic: no atomics, a fixed order):
//   out[r][o] = scale[r] * sum over chunks c of partial[(c * outputs + r) * kept + o]
// for r < outputs and o < kept. sum and mean, fused groups ending in sums and layer
// norm's gamma and beta gradients share it. Output r is stored as dtype[r] (f32, bf16 or
// f16; f32 unless set), rounded once from the double sum.
struct PartialSums {
  static constexpr int kMaxOutputs = 8;
  const double* partial = nullptr;
  void* out[kMaxOutputs] = {};
  DType dtype[kMaxOutputs] = {};  // {} is DType::f32
  double scale[kMaxOutputs] = {};
  int outputs = 0, chunks = 0;
  int64_t kept = 0;
};
static_assert(DType{} == DType::f32, "PartialSums' outputs default to f32");
void add_partials(const PartialSums& p, cudaStream_t st);

// One launch running `parts` in turn.
Launch in_order(std::vector<Launch> parts);

// Throws unless every input and output is f32, the dtype the CUDA kernels compute in,
// except the integer operands an op takes (ids, labels, relu records), each listed with
// the dtype it must have.
struct IntOperand {
  const DeviceTensor* tensor;
  DType dtype;
};
void expect_f32(const StepArgs& a, std::initializer_list<IntOperand> integers = {});
// Throws unless operand t (one of a.in or a.out) has one of the dtypes `allowed`, naming
// the step, the operand and its type.
void expect_dtype(const StepArgs& a, const DeviceTensor& t, std::initializer_list<DType> allowed);
// f32, bf16 or f16: the storage types the kernels template on (storage.cuh).
inline constexpr std::initializer_list<DType> kStored = {DType::f32, DType::bf16, DType::f16};
// With f64: the kernels that compute in compute_t (storage.cuh).
inline constexpr std::initializer_list<DType> kValues = {DType::f32, DType::bf16, DType::f16, DType::f64};
// Throws unless every input and output of the step has one dtype, one of `allowed`;
// returns it. For the kernels whose operands all share one dtype.
DType expect_one_stored_dtype(const StepArgs& a, std::initializer_list<DType> allowed = kStored);

// The most blocks a grid-stride kernel needs to fill the GPU: a few per multiprocessor.
inline unsigned grid_cap(const Context& ctx) { return static_cast<unsigned>(std::max(ctx.sm_count, 1) * 8); }

// Blocks of `threads` covering n items, capped to a grid the GPU keeps busy with
// grid-stride loops.
inline unsigned blocks_for(int64_t n, int threads, int cap = 65535) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

}  // namespace seam::cuda
