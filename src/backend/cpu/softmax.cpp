// CPU kernels of softmax and log_softmax along any axis, and their gradients (which read
// only the forward output). The tensor is seen as outer x len x inner; each lane of
// `len` elements along the axis is handled independently.
#include <cmath>
#include <utility>

#include "backend/cpu/cpu.h"

namespace seam::cpu {

namespace {

// Calls f(base, stride, len) for every lane along the op's `axis` attribute of a tensor
// of shape s: element j of the lane is at base + j * stride.
template <class F>
void for_each_lane(const Shape& s, int64_t axis_attr, F&& f) {
  const auto axis = static_cast<size_t>(normalize_axis(axis_attr, s.size()));
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= s[d];
  for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t len = s[axis];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) f(o * len * inner + i, inner, len);
}

// The lane's max and sum(exp(x - max)); subtracting the max keeps exp from overflowing.
template <class T>
std::pair<double, double> max_and_sum_exp(const T* x, int64_t stride, int64_t len) {
  double m = -INFINITY;
  for (int64_t j = 0; j < len; ++j) m = std::fmax(m, static_cast<double>(x[j * stride]));
  double s = 0;
  for (int64_t j = 0; j < len; ++j) s += std::exp(static_cast<double>(x[j * stride]) - m);
  return {m, s};
}

void softmax(const KernelArgs& a) {
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    for_each_lane(a.in[0].shape(), a.attrs().i("axis"), [&](int64_t base, int64_t st, int64_t len) {
      auto [m, s] = max_and_sum_exp(x + base, st, len);
      for (int64_t j = 0; j < len; ++j) {
        const int64_t k = base + j * st;
        y[k] = static_cast<T>(std::exp(static_cast<double>(x[k]) - m) / s);
      }
    });
  });
}

void log_softmax(const KernelArgs& a) {
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    for_each_lane(a.in[0].shape(), a.attrs().i("axis"), [&](int64_t base, int64_t st, int64_t len) {
      auto [m, s] = max_and_sum_exp(x + base, st, len);
      const double lse = m + std::log(s);
      for (int64_t j = 0; j < len; ++j) {
        const int64_t k = base + j * st;
        y[k] = static_cast<T>(static_cast<double>(x[k]) - lse);
      }
    });
  });
}

// dx = y * (dy - sum(dy * y))
void softmax_grad(const KernelArgs& a) {
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* dy = a.in[0].as<T>();
    const T* y = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    for_each_lane(a.in[0].shape(), a.attrs().i("axis"), [&](int64_t base, int64_t st, int64_t len) {
      double dot = 0;
      for (int64_t j = 0; j < len; ++j) {
        const int64_t k = base + j * st;
        dot += static_cast<double>(dy[k]) * static_cast<double>(y[k]);
      }
      for (int64_t j = 0; j < len; ++j) {
        const int64_t k = base + j * st;
        dx[k] = static_cast<T>(static_cast<double>(y[k]) * (static_cast<double>(dy[k]) - dot));
      }
    });
  });
}

// dx = dy - exp(y) * sum(dy), since exp(y) is the softmax.
void log_softmax_grad(const KernelArgs& a) {
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* dy = a.in[0].as<T>();
    const T* y = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    for_each_lane(a.in[0].shape(), a.attrs().i("axis"), [&](int64_t base, int64_t st, int64_t len) {
      double total = 0;
      for (int64_t j = 0; j < len; ++j) total += static_cast<double>(dy[base + j * st]);
      for (int64_t j = 0; j < len; ++j) {
        const int64_t k = base + j * st;
        dx[k] = static_cast<T>(static_cast<double>(dy[k]) - std::exp(static_cast<double>(y[k])) * total);
      }
    });
  });
}

}  // namespace

void register_softmax(KernelTable& t) {
  set(t, Op::softmax, softmax);
  set(t, Op::softmax_grad, softmax_grad);
  set(t, Op::log_softmax, log_softmax);
  set(t, Op::log_softmax_grad, log_softmax_grad);
}

}  // namespace seam::cpu
