// A Plan is the compiled training (or evaluation) step: a flat list of kernel steps whose
// operands are fixed places in a few regions, plus an optional optimizer update. It is
// what backends execute, and it is printable and testable without any device.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "seam/attrs.h"
#include "seam/dtype.h"
#include "seam/graph.h"
#include "seam/op.h"
#include "seam/optim.h"

namespace seam {

// arena: every intermediate and input, placed by the memory planner; params, grads:
// the flat parameter and gradient buffers (same layout); state: running statistics.
// working: the parameters' 16-bit working copies under a mixed policy, one per parameter
// at half its f32 offset, made when parameters change and kept by the update.
enum class Region : uint8_t { arena, params, grads, state, working };
const char* region_name(Region r);

struct BufferRef {
  Region region = Region::arena;
  size_t offset = 0;  // bytes from the region's start
  TensorType type;
  size_t bytes() const { return type.bytes(); }
  // Whether the two share a byte (empty references share none).
  bool overlaps(const BufferRef& o) const {
    return region == o.region && offset < o.offset + o.bytes() && o.offset < offset + bytes() && bytes() > 0 &&
           o.bytes() > 0;
  }
};

struct PlanStep {
  Op op;
  Attrs attrs;
  std::vector<BufferRef> in, out;
  std::string name;  // the graph node's name
  double flops = 0;
};

struct Binding {
  std::string name;
  BufferRef ref;
};

// Where each parameter and state tensor lives; shared by every plan of a model.
struct Slot {
  std::string name;
  TensorType type;  // as stored: a filter the layout pass keeps channels-last is [O, kh, kw, C] nhwc
  size_t offset = 0;  // bytes
  Init init;
  bool decay = true;
  // The type its users see (checkpoints, Model::read_param/write_param, gradients read
  // back): a channels-last tensor in NCHW order.
  TensorType user_type() const;
};
struct Layout {
  std::vector<Slot> params, states;
  size_t param_bytes = 0, state_bytes = 0;
  size_t decay_bytes = 0;  // params [0, decay_bytes) get weight decay
  DType param_dtype = DType::f32;
  // Optimizer moments are kept in the dtype the parameters compute in: f32 for 16-bit
  // parameters (ModelOptions::master_weights = false), else the parameters' own.
  DType moment_dtype() const { return compute_dtype(param_dtype); }
  size_t moment_bytes() const { return param_bytes / dtype_size(param_dtype) * dtype_size(moment_dtype()); }
  size_t moment_offset(const Slot& s) const { return s.offset / dtype_size(param_dtype) * dtype_size(moment_dtype()); }
  int64_t param_count() const;
  const Slot* param(const std::string& name) const;
  const Slot* state(const std::string& name) const;
};

// Data parallelism: each rank runs the step on its share of the batch, and the ranks'
// gradients are summed and divided by their number before the update. They travel in
// buckets of adjacent gradients, each as soon as the last step writing into it is done,
// so that the transfer overlaps the rest of the backward pass (src/plan/buckets.cpp).
struct GradBucket {
  std::vector<BufferRef> parts;     // in the grads region; gradients adjacent there are one part
  std::vector<std::string> params;  // whose gradients it holds, in the order they become final
  int after = -1;                   // the last step writing into it or reading it, in the
                                    // plan's order (-1: none)
  size_t bytes() const;
};

struct Plan {
  std::vector<PlanStep> steps;
  std::vector<PlanStep> init;  // run once when the plan is prepared (constants)
  std::vector<Binding> inputs, outputs, grads;  // grads: by parameter name
  std::optional<OptimizerConfig> optimizer;  // its loss scaling resolved to off or dynamic
  std::string loss;  // the output the update's finiteness check reads ("" if none)
  // The dtype of the working copies this plan reads (Region::working); the update writes
  // them beside the f32 masters.
  std::optional<DType> working;
  Layout layout;
  int ranks = 1;                    // processes summing their gradients (1: no buckets)
  // ZeRO-1: each rank keeps the optimizer moments of its shard of the parameters only
  // (zero_shard), receives the gradient sum of that shard only (a reduce-scatter), updates
  // it, and the ranks then gather the updated parameters.
  bool zero = false;
  std::vector<GradBucket> buckets;  // in the order their `after` steps run
  size_t arena_bytes = 0;  // peak of the memory plan
  size_t naive_bytes = 0;  // what the arena would need without reuse
  size_t live_bytes = 0;   // bytes live at the busiest step: the best any placement can do
  // What the memory options did: the chunks and recomputation CompileOptions::memory_budget
  // chose, or that output_chunks found no output layer to chunk.
  std::string budget_note;
  double flops() const;
  const Binding* input(const std::string& name) const;
  const Binding* output(const std::string& name) const;
  const Binding* grad(const std::string& name) const;
  std::string str() const;  // every step with shapes and offsets, then a summary
};

// A byte count as people read it: "6264.25 MiB", "2.75 KiB", "12 B".
std::string bytes_str(size_t bytes);

// For each step, the earlier steps it must run after: those that write what it reads or
// writes, and those that read what it writes (the arena reuses memory, so a later step
// may overwrite an earlier step's input). A step writes its outputs and, in place, its
// inputs in the state region (running statistics, metrics). Steps that do not depend on
// each other, directly or through others, may run concurrently. (src/plan/deps.cpp)
std::vector<std::vector<int>> step_dependencies(const Plan& plan);

// Steps spread over up to `lanes` in-order queues (CUDA streams) so that independent
// steps can overlap: step j runs on lane[j] after the steps before it on that lane, and
// after waits[j] (steps on other lanes). Every dependency is honoured that way; a step
// goes to a lane whose last step it follows anyway where one exists, so few false orders
// are added. Lanes 0..lanes_used-1 are used.
struct LaneSchedule {
  std::vector<int> lane;
  std::vector<std::vector<int>> waits;
  int lanes_used = 1;
};
LaneSchedule schedule_lanes(const std::vector<std::vector<int>>& deps, int lanes);

// Splits a training plan's gradients into buckets of about `bucket_bytes` for `ranks`
// processes (Plan::buckets): gradients in the order the backward pass finishes them (the
// last layers' first), a bucket closed once it holds bucket_bytes.
void plan_gradient_buckets(Plan& plan, int ranks, size_t bucket_bytes);
constexpr size_t kGradBucketBytes = size_t{25} << 20;  // as PyTorch's DDP

// ZeRO-1's shard of rank r of `ranks` among n flat parameter values: [n r / ranks,
// n (r + 1) / ranks), as elements. Every split of the values among the ranks, by shard.
std::pair<size_t, size_t> zero_shard(size_t n, int rank, int ranks);
std::vector<size_t> zero_split(size_t n, int ranks);

}  // namespace seam
