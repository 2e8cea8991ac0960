// A cross-entropy case for the GPU loss tests (f32 and 16-bit alike).
#pragma once
#include <string>
#include <vector>

#include "gpu_check.h"

namespace seam::gpu_testing {

struct CeCase {
  Shape shape;                  // logits [..., C]
  double smoothing = 0;
  std::vector<size_t> ignored;  // rows whose label is set to ignore_index
  int64_t ignore_index = -100;
  double lo = -3, hi = 3;       // logits
  int64_t padding = 0;          // columns past C that a slice cuts off before the loss
};

inline std::string describe(const CeCase& k) {
  return "cross_entropy of " + shape_str(k.shape) + ", smoothing " + std::to_string(k.smoothing) + ", " +
         std::to_string(k.ignored.size()) + " rows set to ignore_index " + std::to_string(k.ignore_index) +
         ", logits in [" + std::to_string(k.lo) + ", " + std::to_string(k.hi) + ")" +
         (k.padding ? ", " + std::to_string(k.padding) + " padding columns sliced off" : "");
}

}  // namespace seam::gpu_testing
