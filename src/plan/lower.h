// Lowering: from a graph (forward and, for training, backward nodes) to a Plan.
#pragma once
#include <optional>
#include <vector>

#include "seam/graph.h"
#include "seam/plan.h"

namespace seam {

// Where each parameter and state tensor of a graph lives. Parameters that get weight
// decay come first, so one boundary offset tells the optimizer which ones decay.
Layout make_layout(const Graph& g);

struct LowerRequest {
  std::vector<ValueId> outputs;  // readable after a run (kept alive to the end)
  // Final gradient value of each parameter, by Layout::params index; each must be an
  // intermediate of its own (the compiler inserts copies to make it so).
  std::vector<std::pair<ValueId, size_t>> grads;
  std::optional<OptimizerConfig> optimizer;
  bool reuse_memory = true;
  // A buffer's space is reused only this many steps after its last reader, so that a
  // backend running independent steps concurrently (the CUDA lanes) does not find them
  // ordered by a shared buffer: in backward, a layer's input gradient would otherwise
  // take the place of the activation the weight gradient beside it still reads.
  int reuse_gap = 0;
  // Casts of f32 parameters to this dtype read the model's working copies
  // (Region::working) instead of running as steps.
  std::optional<DType> working;
};

// Keeps only the nodes the requested values need, places every value, and plans the
// arena. Views (reshape, flatten, stop_gradient, a slice of one contiguous run) become
// aliases, not steps, and so does a concat of such runs, its inputs written in place.
Plan lower(const Graph& g, const Layout& layout, const LowerRequest& request);

}  // namespace seam
