// Reverse-mode differentiation over a graph: appends the backward nodes of a scalar loss
// to the same graph, one op's gradient rule at a time, in reverse node order.
#pragma once
#include <vector>

#include "seam/graph.h"

namespace seam {

// Returns, for each value of `wrt`, the value holding d loss / d wrt, or -1 where the
// loss does not depend on it. Gradients of values used several times are summed;
// integer values and values behind stop_gradient get none.
std::vector<ValueId> autodiff(Graph& g, ValueId loss, const std::vector<ValueId>& wrt);

}  // namespace seam
