// `seam bench --trace`: the device's own record of a few replayed steps (cuda::trace_device),
// summed up: how long a step spans on the GPU, how much of that some kernel runs (busy),
// the kernels' summed time (more than busy where streams overlap), the idle gaps between
// them, the time per kernel name, and one step's timeline.
#pragma once
#include <string>
#include <vector>

#include "backend/cuda/trace.h"

namespace seam::bench {

// spans: `steps` steps' records, ordered by start; `timeline`: print the last step's
// records one a line.
std::string trace_report(const std::vector<cuda::Span>& spans, int steps, bool timeline);

}  // namespace seam::bench
