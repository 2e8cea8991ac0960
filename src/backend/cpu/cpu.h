// The CPU backend's kernel interface. CPU kernels are the reference every other backend
// is tested against: plain loops, computing in the value's dtype (f32, or f64 for
// gradient checks) with double accumulation in reductions; GEMMs go to BLAS.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "seam/error.h"
#include "seam/model.h"
#include "ops/geometry.h"
#include "seam/plan.h"

namespace seam::cpu {

struct TensorView {
  std::byte* data = nullptr;
  TensorType type;
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(data);
  }
  int64_t numel() const { return type.numel(); }
  const Shape& shape() const { return type.shape; }
  DType dtype() const { return type.dtype; }
};

// Views into the executable's prepared operands: nothing is copied per step.
struct KernelArgs {
  const PlanStep& step;
  const std::vector<TensorView>& in;
  const std::vector<TensorView>& out;
  const StepState& state;
  const Attrs& attrs() const { return step.attrs; }
};

using Kernel = void (*)(const KernelArgs&);
using KernelTable = std::vector<Kernel>;

// The kernel for an op; throws if the CPU backend has none.
Kernel kernel_for(Op op);

void register_elementwise(KernelTable& t);
void register_matmul(KernelTable& t);
void register_reduce(KernelTable& t);
void register_shape(KernelTable& t);
void register_softmax(KernelTable& t);
void register_loss(KernelTable& t);
void register_norm(KernelTable& t);
void register_attention(KernelTable& t);
void register_conv(KernelTable& t);
void register_pool(KernelTable& t);
void register_misc(KernelTable& t);

inline void set(KernelTable& t, Op op, Kernel k) { t.at(static_cast<size_t>(op)) = k; }

// Element i of a tensor of any dtype as a double, and a store of a double into one:
// floats round to nearest even (a double through float first, as the cast kernel),
// integers truncate toward zero and saturate.
double load_value(const TensorView& t, int64_t i);
void store_value(const TensorView& t, int64_t i, double v);

// layer_norm over rows of `dim` (src/backend/cpu/norm.cpp); y may be x (in place). For
// the layer_norm kernel and fused groups ending in one, so both give the same bits.
template <class T>
void layer_norm_rows(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int64_t rows, int64_t dim,
                     double eps);

// Calls f.template operator()<T>() with T = float or double for the dtype.
template <class F>
void dispatch_float(DType t, F&& f) {
  switch (t) {
    case DType::f32: f.template operator()<float>(); return;
    case DType::f64: f.template operator()<double>(); return;
    default: fail("the CPU backend computes in f32 or f64, got ", dtype_name(t));
  }
}


// Visits every element of a tensor of shape `out` in row-major order, with the element
// offsets of N operands whose strides (in out's index space) are given:
// f(i, {off_0, ..., off_{N-1}}).
template <size_t N, class F>
void for_each_strided(const Shape& out, const std::array<std::vector<int64_t>, N>& st, F&& f) {
  const size_t r = out.size();
  const int64_t n = numel(out);
  std::array<int64_t, N> off{};
  if (r == 0) {
    if (n == 1) f(int64_t{0}, off);
    return;
  }
  std::vector<int64_t> idx(r, 0);
  const int64_t inner = out[r - 1];
  std::array<int64_t, N> inner_st;
  for (size_t k = 0; k < N; ++k) inner_st[k] = st[k][r - 1];
  for (int64_t i = 0; i < n; i += inner) {
    for (int64_t j = 0; j < inner; ++j) {
      std::array<int64_t, N> o;
      for (size_t k = 0; k < N; ++k) o[k] = off[k] + j * inner_st[k];
      f(i + j, o);
    }
    // Advance the odometer over all but the innermost dim.
    for (size_t d = r - 1; d-- > 0;) {
      ++idx[d];
      for (size_t k = 0; k < N; ++k) off[k] += st[k][d];
      if (idx[d] < out[d]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= st[k][d] * out[d];
      idx[d] = 0;
    }
  }
}

// Visits every element of `out` with the matching element offsets of inputs broadcast
// (numpy rules) to out's shape: f(i, {off_0, ..., off_{N-1}}).
template <size_t N, class F>
void for_each_broadcast(const Shape& out, const std::array<const Shape*, N>& ins, F&& f) {
  bool same = true;
  for (auto* s : ins) same = same && *s == out;
  if (same) {
    const int64_t n = numel(out);
    std::array<int64_t, N> off;
    for (int64_t i = 0; i < n; ++i) {
      off.fill(i);
      f(i, off);
    }
    return;
  }
  const size_t r = out.size();
  std::array<std::vector<int64_t>, N> st;
  for (size_t k = 0; k < N; ++k) {
    st[k].assign(r, 0);
    auto own = row_major_strides(*ins[k]);
    size_t lead = r - ins[k]->size();
    for (size_t d = lead; d < r; ++d)
      if ((*ins[k])[d - lead] != 1) st[k][d] = own[d - lead];
  }
  for_each_strided<N>(out, st, f);
}

// Calls f.template operator()<U>() with an unsigned integer type of the dtype's size, for
// kernels that only move elements.
template <class F>
void dispatch_bits(DType t, F&& f) {
  switch (dtype_size(t)) {
    case 1: f.template operator()<uint8_t>(); return;
    case 2: f.template operator()<uint16_t>(); return;
    case 4: f.template operator()<uint32_t>(); return;
    case 8: f.template operator()<uint64_t>(); return;
  }
  fail("internal error: no element type of size ", dtype_size(t));
}

}  // namespace seam::cpu
