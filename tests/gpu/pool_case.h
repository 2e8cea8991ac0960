// A pooling case for the GPU pooling tests (f32 and 16-bit alike).
#pragma once
#include <string>
#include <vector>

#include "seam/seam.h"

namespace seam::gpu_testing {

struct PoolCase {
  Shape x;
  std::vector<int64_t> kernel, stride, padding;
  std::string str() const {
    return "x " + shape_str(x) + " kernel " + shape_str(kernel) + " stride " + shape_str(stride) + " pad " +
           shape_str(padding);
  }
};

}  // namespace seam::gpu_testing
