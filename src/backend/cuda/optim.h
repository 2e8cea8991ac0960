// The optimizer update on the GPU: one kernel over the flat parameter, gradient and
// moment buffers (multi-tensor by construction), with the learning rate computed on the
// device from the step counter in device memory, and the counter advanced there.
#pragma once
#include "backend/backend.h"
#include "backend/cuda/cuda.h"

namespace seam::cuda {

class Nccl;

// ZeRO-1 (Plan::zero): this rank updates values [lo, hi) of the flat parameters, whose
// moments are all `opt` holds; the gradient norm is the ranks' together, and after the
// update the ranks gather each other's shards (`nccl`).
struct OptimizerShard {
  int64_t lo = 0, hi = 0;
  Nccl* nccl = nullptr;
};

// `loss`: the plan's f32 loss for the finiteness check (null: none to check).
// `working`: the dtype of the parameters' working copies to write (Regions::working).
Launch prepare_optimizer(const OptimizerConfig& c, const Layout& layout, const Regions& r, Context& ctx,
                         const float* loss, std::optional<DType> working, const OptimizerShard* shard = nullptr);

// For a plan that writes the gradients without an update: the gradient buffers then hold
// what its backward wrote, so the factor an earlier update of the model left in the
// counters (DeviceCounters::grad_scale, which the reads apply) goes back to 1.
Launch gradients_as_written(Context& ctx);

}  // namespace seam::cuda
