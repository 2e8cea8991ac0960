// Training vs evaluation: ops whose behaviour differs carry a `training` attribute.
#include "passes/passes.h"

namespace seam {

void apply_mode(Graph& g, Mode mode) {
  for (size_t k = 0; k < g.nodes().size(); ++k)
    if (g.nodes()[k].attrs.has("training"))
      g.set_attr(static_cast<int>(k), "training", int64_t{mode == Mode::train ? 1 : 0});
}

}  // namespace seam
