// ew_math.h for C++ compilers (host, and nvcc's device code): the expressions of
// seam/ops.def call exp, tanh, erf, ... unqualified, so they find std's overloads here
// (CUDA provides device versions of them for float). NVRTC sources include ew_math.h
// directly and bring their own math functions.
#pragma once
#include <cmath>

namespace seam_ew {
using std::erf;
using std::exp;
using std::log;
using std::pow;
using std::sqrt;
using std::tanh;
}  // namespace seam_ew

#include "ops/ew_math.h"
