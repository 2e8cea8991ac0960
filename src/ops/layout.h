// The `layout` attribute of the ops that see images (conv2d, pooling, batch_norm and their
// gradients): "nchw" (the default) or "nhwc", where every 4-d operand, the filter
// included, is stored with its channels last and its shape written in that order
// (include/seam/dtype.h, DataLayout). Shape inference checks the NCHW tensors they stand
// for, so the rules and messages of both layouts are one.
#pragma once
#include <cstddef>
#include <cstring>
#include <string>

#include "seam/attrs.h"
#include "seam/dtype.h"

namespace seam {

inline bool is_nhwc(const Attrs& a) { return a.has("layout") && a.s("layout") == "nhwc"; }

// [N, C, H, W] -> [N, H, W, C] and back; shapes of another rank pass unchanged.
inline Shape nhwc_order(const Shape& s) { return s.size() == 4 ? Shape{s[0], s[2], s[3], s[1]} : s; }
inline Shape nchw_order(const Shape& s) { return s.size() == 4 ? Shape{s[0], s[3], s[1], s[2]} : s; }

// The permutations that take an NCHW tensor to NHWC storage and back (transpose's perm).
inline std::vector<int64_t> to_nhwc_perm() { return {0, 2, 3, 1}; }
inline std::vector<int64_t> to_nchw_perm() { return {0, 3, 1, 2}; }

// dst = src from NHWC storage to NCHW (to_nchw) or back, elements of `size` bytes; `nhwc`
// is the NHWC shape. For host code: the CPU's nhwc steps and reading a value back.
inline void reorder_nhwc(const std::byte* src, std::byte* dst, const Shape& nhwc, size_t size, bool to_nchw) {
  const int64_t n = nhwc[0], hw = nhwc[1] * nhwc[2], c = nhwc[3];
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < hw; ++i)
      for (int64_t ch = 0; ch < c; ++ch) {
        const int64_t last = (b * hw + i) * c + ch, first = (b * c + ch) * hw + i;
        const int64_t from = to_nchw ? last : first, to = to_nchw ? first : last;
        std::memcpy(dst + static_cast<size_t>(to) * size, src + static_cast<size_t>(from) * size, size);
      }
}

}  // namespace seam
