// CPU kernels of the losses: cross_entropy (with ignore_index and PyTorch's label
// smoothing) and mse, each reduced to a scalar mean, and their gradients.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu.h"

namespace seam::cpu {

namespace {

// The rows of logits [..., C] and their labels, with the attributes of the op: the first
// `classes` columns of each row of `stride` are classes, the rest padding. A chunk of the
// rows (row_offset >= 0) reads its labels from row_offset on, and its mean's divisor
// counts the rows of every label.
struct CrossEntropyRows {
  int64_t rows, classes, stride;
  const int32_t* labels;  // the logits' rows' labels
  int64_t ignore_index;
  double smoothing;
  const int32_t* all_labels;  // the rows the divisor counts
  int64_t all_rows;
};

// Validates every label before any work so that a bad batch fails the same way in the
// forward and the backward; returns the number of rows that count.
int64_t count_rows(const CrossEntropyRows& r) {
  int64_t count = 0;
  for (int64_t i = 0; i < r.all_rows; ++i) {
    const int32_t l = r.all_labels[i];
    if (l == r.ignore_index) continue;
    if (l < 0 || l >= r.classes)
      fail("label ", l, " of row ", i, " is outside [0, ", r.classes, ") and is not ignore_index (",
           r.ignore_index, ")");
    ++count;
  }
  return count;
}

CrossEntropyRows rows_of(const KernelArgs& a, const TensorView& logits, const TensorView& labels) {
  const int64_t stride = logits.shape().back(), classes = a.attrs().i("classes");
  const int64_t offset = a.attrs().has("row_offset") ? a.attrs().i("row_offset") : -1;
  const int32_t* all = labels.as<int32_t>();
  return {stride ? logits.numel() / stride : labels.numel(), classes > 0 ? classes : stride, stride,
          all + std::max<int64_t>(offset, 0), a.attrs().i("ignore_index"), a.attrs().f("label_smoothing"), all,
          labels.numel()};
}

// Returns log(sum(exp(z))) of one row, shifted by its max for stability.
template <class T>
double log_sum_exp(const T* z, int64_t n) {
  double m = -INFINITY;
  for (int64_t c = 0; c < n; ++c) m = std::fmax(m, static_cast<double>(z[c]));
  double s = 0;
  for (int64_t c = 0; c < n; ++c) s += std::exp(static_cast<double>(z[c]) - m);
  return m + std::log(s);
}

// Per row: (1 - eps) * -log p[label] + eps * mean_c(-log p[c]); -log p[c] = lse - z[c].
void cross_entropy(const KernelArgs& a) {
  const CrossEntropyRows r = rows_of(a, a.in[0], a.in[1]);
  const int64_t count = count_rows(r);
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* logits = a.in[0].as<T>();
    double total = 0;
    for (int64_t i = 0; i < r.rows; ++i) {
      if (r.labels[i] == r.ignore_index) continue;
      const T* z = logits + i * r.stride;
      const double lse = log_sum_exp(z, r.classes);
      double zsum = 0;
      for (int64_t c = 0; c < r.classes; ++c) zsum += static_cast<double>(z[c]);
      const double nll = lse - static_cast<double>(z[r.labels[i]]);
      const double smooth = lse - zsum / static_cast<double>(r.classes);
      total += (1 - r.smoothing) * nll + r.smoothing * smooth;
    }
    a.out[0].as<T>()[0] = static_cast<T>(count > 0 ? total / static_cast<double>(count) : 0.0);
  });
}

// dlogits = dy * (softmax - target) / count, target = (1 - eps) * onehot + eps / C.
void cross_entropy_grad(const KernelArgs& a) {
  const CrossEntropyRows r = rows_of(a, a.in[1], a.in[2]);
  const int64_t count = count_rows(r);
  dispatch_float(a.in[1].dtype(), [&]<class T>() {
    const T* logits = a.in[1].as<T>();
    T* dz = a.out[0].as<T>();
    const double scale = count > 0 ? static_cast<double>(a.in[0].as<T>()[0]) / static_cast<double>(count) : 0.0;
    const double off_target = r.smoothing / static_cast<double>(r.classes);
    for (int64_t i = 0; i < r.rows; ++i) {
      const T* z = logits + i * r.stride;
      T* d = dz + i * r.stride;
      std::fill(d + r.classes, d + r.stride, T(0));
      if (r.labels[i] == r.ignore_index) {
        std::fill(d, d + r.classes, T(0));
        continue;
      }
      const double lse = log_sum_exp(z, r.classes);
      for (int64_t c = 0; c < r.classes; ++c) {
        const double target = off_target + (c == r.labels[i] ? 1 - r.smoothing : 0.0);
        d[c] = static_cast<T>(scale * (std::exp(static_cast<double>(z[c]) - lse) - target));
      }
    }
  });
}

// The fused op: the same two kernels in turn, so fused and unfused plans agree bitwise;
// with count_correct, the rows that count whose argmax (argmax's rule: the first largest,
// a later NaN never ahead) is their label. The gradient comes last: it may be written
// over the logits (OpDef::in_place), each row after that row's sums.
// A chunk's addends (loss_acc, correct_acc) are added to its loss and count last.
void cross_entropy_with_grad(const KernelArgs& a) {
  const std::vector<TensorView> fwd_in{a.in[0], a.in[1]}, fwd_out{a.out[0]};
  cross_entropy({a.step, fwd_in, fwd_out, a.state});
  if (a.in.size() > 3)
    dispatch_float(a.out[0].dtype(), [&]<class T>() { a.out[0].as<T>()[0] += a.in[3].as<T>()[0]; });
  if (a.out.size() == 3) {
    const CrossEntropyRows r = rows_of(a, a.in[0], a.in[1]);
    int64_t correct = 0;
    dispatch_float(a.in[0].dtype(), [&]<class T>() {
      for (int64_t i = 0; i < r.rows; ++i) {
        if (r.labels[i] == r.ignore_index) continue;
        const T* z = a.in[0].as<T>() + i * r.stride;
        int64_t best = 0;
        for (int64_t c = 1; c < r.classes; ++c)
          if (z[c] > z[best]) best = c;
        correct += best == r.labels[i];
      }
    });
    a.out[2].as<int32_t>()[0] = static_cast<int32_t>(correct) + (a.in.size() > 4 ? a.in[4].as<int32_t>()[0] : 0);
  }
  const std::vector<TensorView> grad_in{a.in[2], a.in[0], a.in[1]}, grad_out{a.out[1]};
  cross_entropy_grad({a.step, grad_in, grad_out, a.state});
}

void mse(const KernelArgs& a) {
  const int64_t n = a.in[0].numel();
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* p = a.in[0].as<T>();
    const T* t = a.in[1].as<T>();
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(p[i]) - static_cast<double>(t[i]);
      total += d * d;
    }
    a.out[0].as<T>()[0] = static_cast<T>(n > 0 ? total / static_cast<double>(n) : 0.0);
  });
}

// dprediction = dy * 2 (prediction - target) / n
void mse_grad(const KernelArgs& a) {
  const int64_t n = a.in[1].numel();
  dispatch_float(a.in[1].dtype(), [&]<class T>() {
    const T* p = a.in[1].as<T>();
    const T* t = a.in[2].as<T>();
    T* dp = a.out[0].as<T>();
    const double scale = 2.0 * static_cast<double>(a.in[0].as<T>()[0]) / static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i)
      dp[i] = static_cast<T>(scale * (static_cast<double>(p[i]) - static_cast<double>(t[i])));
  });
}

}  // namespace

void register_loss(KernelTable& t) {
  set(t, Op::cross_entropy, cross_entropy);
  set(t, Op::cross_entropy_grad, cross_entropy_grad);
  set(t, Op::cross_entropy_with_grad, cross_entropy_with_grad);
  set(t, Op::mse, mse);
  set(t, Op::mse_grad, mse_grad);
}

}  // namespace seam::cpu
