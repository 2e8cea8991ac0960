// Index arithmetic shared by shape inference and every backend's kernels, so that the
// output size a schema promises is the one a kernel computes.
#pragma once
#include <cstdint>
#include <vector>

#include "seam/dtype.h"

namespace seam {

// Row-major strides of a shape, in elements.
inline std::vector<int64_t> row_major_strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

// A shape split at `axis` into (outer, axis length, inner) element counts.
struct AxisSplit {
  int64_t outer = 1, len = 1, inner = 1;
};
inline AxisSplit split_at(const Shape& s, int axis) {
  AxisSplit p;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (d < axis) p.outer *= s[static_cast<size_t>(d)];
    else if (d == axis) p.len = s[static_cast<size_t>(d)];
    else p.inner *= s[static_cast<size_t>(d)];
  }
  return p;
}

// Python-style slice of an axis of length `dim`: negative indices count from the end,
// bounds clamp. `count` is the number of selected elements (0 if empty).
struct SliceRange {
  int64_t start = 0, step = 1, count = 0;
};
inline SliceRange normalize_slice(int64_t start, int64_t end, int64_t step, int64_t dim) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  start = start < 0 ? 0 : (start > dim ? dim : start);
  end = end < 0 ? 0 : (end > dim ? dim : end);
  int64_t count = end > start ? (end - start + step - 1) / step : 0;
  return {start, step, count};
}

// Output length of a convolution or pooling window along one axis (floor mode).
inline int64_t window_out(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                          int64_t dilation = 1) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

// The auxiliary record a fused linear + activation keeps for its backward GEMM, laid out
// as cuBLASLt's epilogues write it: for relu a bit per element (bit j of row i at bit
// i * ld + j, ld = N rounded up to 128), for gelu_tanh the pre-activation itself (this
// needs N % 8 == 0, so that the record is exactly the [M, N] matrix).
inline int64_t relu_mask_row_bytes(int64_t n) { return (n + 127) / 128 * 16; }

}  // namespace seam
