// Graph passes that run before lowering.
#pragma once
#include "seam/graph.h"
#include "seam/model.h"

namespace seam {

// Switches every mode-dependent op (dropout, batch_norm: attribute `training`).
void apply_mode(Graph& g, Mode mode);

}  // namespace seam
