// matmul and linear on the CPU through GEMM (backend/cpu/gemm.h).
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/gemm.h"
#include "ops/geometry.h"

#include "ops/ew_math_std.h"

namespace seam::cpu {

namespace {

void matmul(const KernelArgs& x) {
  const Shape& as = x.in[0].shape();
  const Shape& bs = x.in[1].shape();
  const Shape& ys = x.out[0].shape();
  bool ta = x.attrs().i("transpose_a") != 0, tb = x.attrs().i("transpose_b") != 0;
  int64_t m = ys[ys.size() - 2], n = ys.back();
  int64_t k = as[as.size() - (ta ? 2 : 1)];
  dispatch_float(x.in[0].dtype(), [&]<class T>() {
    const T* a = x.in[0].as<T>();
    const T* b = x.in[1].as<T>();
    T* y = x.out[0].as<T>();
    // An addend is y's starting value (in place or copied there), then beta = 1.
    T beta = T(0);
    if (x.in.size() == 3) {
      const T* c = x.in[2].as<T>();
      if (c != y) std::memcpy(y, c, static_cast<size_t>(x.out[0].numel()) * sizeof(T));
      beta = T(1);
    }
    if (bs.size() == 2 && !ta) {  // a's batch dims fold into M: one GEMM
      gemm(false, tb, x.in[0].numel() / k, n, k, a, b, beta, y);
      return;
    }
    Shape batch(ys.begin(), ys.end() - 2), ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
    for_each_broadcast<2>(batch, {&ab, &bb}, [&](int64_t i, const std::array<int64_t, 2>& o) {
      gemm(ta, tb, m, n, k, a + o[0] * m * k, b + o[1] * k * n, beta, y + i * m * n);
    });
  });
}

// y = x w^T (+ b) (+ r): linear's inputs x, w, b?; linear_add's x, w, r, b?.
void linear_rows(const KernelArgs& x, const TensorView* b, const TensorView* r) {
  int64_t in = x.in[1].shape()[1], out = x.in[1].shape()[0];
  int64_t rows = x.in[0].numel() / in;
  dispatch_float(x.in[0].dtype(), [&]<class T>() {
    T* y = x.out[0].as<T>();
    gemm(false, true, rows, out, in, x.in[0].as<T>(), x.in[1].as<T>(), T(0), y);
    if (b) {
      const T* bv = b->as<T>();
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < out; ++j) y[i * out + j] += bv[j];
    }
    if (r) {
      const T* rv = r->as<T>();
      for (int64_t i = 0; i < rows * out; ++i) y[i] += rv[i];
    }
  });
}

void linear(const KernelArgs& x) { linear_rows(x, x.in.size() == 3 ? &x.in[2] : nullptr, nullptr); }
void linear_add(const KernelArgs& x) { linear_rows(x, x.in.size() == 4 ? &x.in[3] : nullptr, &x.in[2]); }

// out[j] = the sum over rows of x [rows, cols] column j, added in double, stored in out's
// dtype: a bias gradient.
template <class T>
void column_sums(const T* x, int64_t rows, int64_t cols, const TensorView& out) {
  std::vector<double> acc(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) acc[static_cast<size_t>(j)] += static_cast<double>(x[r * cols + j]);
  for (int64_t j = 0; j < cols; ++j) store_value(out, j, acc[static_cast<size_t>(j)]);
}

// dw = dy^T x, db = column sums of dy (double accumulation).
void linear_grad_weight_bias(const KernelArgs& a) {
  int64_t m = a.in[0].shape()[0], out = a.in[0].shape()[1], in = a.in[1].shape()[1];
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* dy = a.in[0].as<T>();
    gemm(true, false, out, in, m, dy, a.in[1].as<T>(), T(0), a.out[0].as<T>());
    column_sums(dy, m, out, a.out[1]);
  });
}

// Fused linear + activation (relu or gelu_tanh), optionally keeping the record for the
// backward GEMM (see relu_mask_row_bytes). Same arithmetic as linear then relu/gelu_tanh.
template <bool Aux>
void linear_act(const KernelArgs& a) {
  linear(a);
  const bool relu = a.attrs().s("act") == "relu";
  const int64_t n = a.out[0].shape().back(), rows = a.out[0].numel() / n;
  dispatch_float(a.out[0].dtype(), [&]<class T>() {
    T* y = a.out[0].as<T>();
    if (Aux && relu) {
      const int64_t ld = relu_mask_row_bytes(n);
      uint8_t* mask = a.out[1].as<uint8_t>();
      std::memset(mask, 0, static_cast<size_t>(rows * ld));
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < n; ++j)
          if (y[i * n + j] > T(0)) mask[i * ld + j / 8] |= static_cast<uint8_t>(1u << (j % 8));
    }
    if (Aux && !relu) std::memcpy(a.out[1].data, y, static_cast<size_t>(rows * n) * sizeof(T));
    for (int64_t i = 0; i < rows * n; ++i) y[i] = relu ? (y[i] > T(0) ? y[i] : T(0)) : seam_ew::gelu_tanh(y[i]);
  });
}

// dx = (dy w) * act'(pre), with pre recorded by linear_act_aux; with dx_sums, dx's column
// sums (double accumulation).
void matmul_act_grad(const KernelArgs& a) {
  const int64_t m = a.in[0].shape()[0], n = a.in[0].shape()[1], k = a.in[1].shape()[1];
  const bool relu = a.attrs().s("act") == "relu";
  dispatch_float(a.out[0].dtype(), [&]<class T>() {
    T* dx = a.out[0].as<T>();
    gemm(false, false, m, k, n, a.in[0].as<T>(), a.in[1].as<T>(), T(0), dx);
    if (relu) {
      const int64_t ld = relu_mask_row_bytes(k);
      const uint8_t* mask = a.in[2].as<uint8_t>();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j)
          if (!(mask[i * ld + j / 8] >> (j % 8) & 1)) dx[i * k + j] = T(0);
    } else {
      const T* pre = a.in[2].as<T>();
      for (int64_t i = 0; i < m * k; ++i) dx[i] = dx[i] * seam_ew::gelu_tanh_grad(pre[i]);
    }
    if (a.out.size() == 2) column_sums(dx, m, k, a.out[1]);  // dx_sums: of dx as stored
  });
}

// dx = dy w, db = column sums of dy (double accumulation): the GEMM matmul_act_grad runs,
// without the derivative.
void linear_grad_input_bias(const KernelArgs& a) {
  const int64_t m = a.in[0].shape()[0], n = a.in[0].shape()[1], k = a.in[1].shape()[1];
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* dy = a.in[0].as<T>();
    gemm(false, false, m, k, n, dy, a.in[1].as<T>(), T(0), a.out[0].as<T>());
    column_sums(dy, m, n, a.out[1]);
  });
}

}  // namespace

void register_matmul(KernelTable& t) {
  set(t, Op::linear_act, linear_act<false>);
  set(t, Op::linear_act_aux, linear_act<true>);
  set(t, Op::matmul_act_grad, matmul_act_grad);
  set(t, Op::linear_grad_input_bias, linear_grad_input_bias);
  set(t, Op::matmul, matmul);
  set(t, Op::linear, linear);
  set(t, Op::linear_grad_weight_bias, linear_grad_weight_bias);
  set(t, Op::linear_add, linear_add);
}

}  // namespace seam::cpu
