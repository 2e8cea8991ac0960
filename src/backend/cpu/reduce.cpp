// sum, mean, broadcast_to on the CPU. Reductions accumulate in double.
#include <algorithm>

#include "backend/cpu/cpu.h"

namespace seam::cpu {

namespace {

// Adds every element of `in` into the output element it reduces to.
template <class T>
void reduce_sum(const TensorView& in, const TensorView& out, const std::vector<int64_t>& axes_attr,
                double scale) {
  const Shape& s = in.shape();
  const size_t r = s.size();
  std::vector<bool> red(r, axes_attr.empty());
  for (int64_t a : axes_attr) red[static_cast<size_t>(normalize_axis(a, r))] = true;
  // The output as keepdims, broadcast back over the input: stride 0 on reduced dims.
  Shape kept(r);
  for (size_t d = 0; d < r; ++d) kept[d] = red[d] ? 1 : s[d];
  std::vector<double> acc(static_cast<size_t>(out.numel()), 0.0);
  const T* x = in.as<T>();
  for_each_broadcast<1>(s, {&kept}, [&](int64_t i, const std::array<int64_t, 1>& o) {
    acc[static_cast<size_t>(o[0])] += static_cast<double>(x[i]);
  });
  T* y = out.as<T>();
  for (size_t i = 0; i < acc.size(); ++i) y[i] = static_cast<T>(acc[i] * scale);
}

void sum(const KernelArgs& a) {
  dispatch_float(a.in[0].dtype(), [&]<class T>() { reduce_sum<T>(a.in[0], a.out[0], a.attrs().ints("axes"), 1.0); });
}

void mean(const KernelArgs& a) {
  double scale = static_cast<double>(a.out[0].numel()) / static_cast<double>(a.in[0].numel());
  dispatch_float(a.in[0].dtype(), [&]<class T>() { reduce_sum<T>(a.in[0], a.out[0], a.attrs().ints("axes"), scale); });
}

void broadcast_to(const KernelArgs& a) {
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    for_each_broadcast<1>(a.out[0].shape(), {&a.in[0].shape()},
                          [&](int64_t i, const std::array<int64_t, 1>& o) { y[i] = x[o[0]]; });
  });
}

}  // namespace

void register_reduce(KernelTable& t) {
  set(t, Op::sum, sum);
  set(t, Op::mean, mean);
  set(t, Op::broadcast_to, broadcast_to);
}

}  // namespace seam::cpu
