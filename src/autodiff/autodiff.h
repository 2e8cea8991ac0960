// Reverse-mode differentiation over a graph: appends the backward nodes of a scalar loss
// to the same graph, one op's gradient rule at a time, in reverse node order.
#pragma once
#include <optional>
#include <vector>

#include "seam/graph.h"

namespace seam {

// Returns, for each value of `wrt`, the value holding d loss / d wrt, or -1 where the
// loss does not depend on it. Gradients of values used several times are summed;
// integer values and values behind stop_gradient get none.
// The pass starts from `seed` (a scalar, e.g. the loss scale) where given, else from 1.
std::vector<ValueId> autodiff(Graph& g, ValueId loss, const std::vector<ValueId>& wrt,
                              std::optional<ValueId> seed = std::nullopt);

}  // namespace seam
