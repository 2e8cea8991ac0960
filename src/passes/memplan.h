// The memory planner: places buffers with known lifetimes in one arena so that buffers
// alive at the same time never overlap, reusing the space of dead ones.
#pragma once
#include <cstddef>
#include <vector>

namespace seam {

struct Lifetime {
  size_t bytes = 0;
  int first = 0;  // step that writes it (-1: before the first step)
  int last = 0;   // last step that reads it (inclusive)
};

struct MemPlan {
  std::vector<size_t> offsets;  // one per lifetime
  size_t peak = 0;              // arena size
  size_t naive = 0;             // sum of the (aligned) sizes
  size_t lower_bound = 0;       // bytes live at the busiest step: no placement does better
};

// Greedy by size: largest buffers first, each at the lowest offset that does not overlap
// a placed buffer whose lifetime intersects its own. Offsets are multiples of `align`.
MemPlan plan_memory(const std::vector<Lifetime>& lifetimes, size_t align = 256);

}  // namespace seam
