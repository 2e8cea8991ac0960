// Shape ops that move data: transpose, concat, slice and its gradient. They only move
// elements, so they work for every dtype. Views (reshape, flatten) have no kernel.
#include <cstring>

#include "backend/cpu/cpu.h"
#include "ops/geometry.h"

namespace seam::cpu {

namespace {

void transpose(const KernelArgs& a) {
  const auto& perm = a.attrs().ints("perm");
  auto in_st = row_major_strides(a.in[0].shape());
  const size_t r = perm.size();
  std::vector<int64_t> st(r);
  for (size_t d = 0; d < r; ++d) st[d] = in_st[static_cast<size_t>(normalize_axis(perm[d], r))];
  dispatch_bits(a.in[0].dtype(), [&]<class U>() {
    const U* x = a.in[0].as<U>();
    U* y = a.out[0].as<U>();
    for_each_strided<1>(a.out[0].shape(), {st}, [&](int64_t i, const std::array<int64_t, 1>& o) { y[i] = x[o[0]]; });
  });
}

void concat(const KernelArgs& a) {
  int axis = normalize_axis(a.attrs().i("axis"), a.out[0].shape().size());
  const size_t es = dtype_size(a.out[0].dtype());
  AxisSplit out = split_at(a.out[0].shape(), axis);
  int64_t at = 0;  // elements along the axis already filled
  for (auto& in : a.in) {
    AxisSplit p = split_at(in.shape(), axis);
    const size_t chunk = static_cast<size_t>(p.len * p.inner) * es;
    for (int64_t o = 0; o < p.outer; ++o)
      std::memcpy(a.out[0].data + static_cast<size_t>((o * out.len + at) * out.inner) * es,
                  in.data + static_cast<size_t>(o) * chunk, chunk);
    at += p.len;
  }
}

// Copies between a full tensor and its slice; `to_slice` picks the direction.
void slice_copy(const KernelArgs& a, const TensorView& full, const TensorView& part, bool to_slice) {
  int axis = normalize_axis(a.attrs().i("axis"), full.shape().size());
  AxisSplit f = split_at(full.shape(), axis);
  auto r = normalize_slice(a.attrs().i("start"), a.attrs().i("end"), a.attrs().i("step"), f.len);
  const size_t es = dtype_size(full.dtype());
  const size_t row = static_cast<size_t>(f.inner) * es;
  for (int64_t o = 0; o < f.outer; ++o)
    for (int64_t j = 0; j < r.count; ++j) {
      std::byte* fp = full.data + static_cast<size_t>((o * f.len + r.start + j * r.step) * f.inner) * es;
      std::byte* pp = part.data + static_cast<size_t>((o * r.count + j) * f.inner) * es;
      if (to_slice) std::memcpy(pp, fp, row);
      else std::memcpy(fp, pp, row);
    }
}

void slice(const KernelArgs& a) { slice_copy(a, a.in[0], a.out[0], true); }

void slice_grad(const KernelArgs& a) {
  std::memset(a.out[0].data, 0, a.out[0].type.bytes());
  slice_copy(a, a.out[0], a.in[0], false);
}

}  // namespace

void register_shape(KernelTable& t) {
  set(t, Op::transpose, transpose);
  set(t, Op::concat, concat);
  set(t, Op::slice, slice);
  set(t, Op::slice_grad, slice_grad);
}

}  // namespace seam::cpu
