// CPU kernels of layer_norm (over the last dim) and batch_norm (per channel, axis 1), and
// their gradients. Statistics and the sums of the backward pass accumulate in double.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/parallel.h"

namespace seam::cpu {

template <class T>
void layer_norm_rows(const T* x, const T* gamma, const T* beta, T* y, T* mean_out, T* rstd_out, int64_t rows,
                     int64_t dim, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    double sum = 0;
    for (int64_t j = 0; j < dim; ++j) sum += static_cast<double>(xr[j]);
    const double mean = sum / static_cast<double>(dim);
    // Two passes: the centred sum of squares does not cancel catastrophically.
    double sq = 0;
    for (int64_t j = 0; j < dim; ++j) {
      const double d = static_cast<double>(xr[j]) - mean;
      sq += d * d;
    }
    const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(dim) + eps);
    for (int64_t j = 0; j < dim; ++j) {
      const double xhat = (static_cast<double>(xr[j]) - mean) * rstd;
      y[r * dim + j] = static_cast<T>(xhat * static_cast<double>(gamma[j]) + static_cast<double>(beta[j]));
    }
    mean_out[r] = static_cast<T>(mean);
    rstd_out[r] = static_cast<T>(rstd);
  }
}
template void layer_norm_rows<float>(const float*, const float*, const float*, float*, float*, float*, int64_t,
                                     int64_t, double);
template void layer_norm_rows<double>(const double*, const double*, const double*, double*, double*, double*,
                                      int64_t, int64_t, double);

namespace {

// Outputs y, mean, rstd; the variance is biased (divides by the row length), as PyTorch.
void layer_norm(const KernelArgs& a) {
  const int64_t dim = a.in[0].shape().back();
  const int64_t rows = a.out[1].numel();
  const double eps = a.attrs().f("eps");
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    layer_norm_rows<T>(a.in[0].as<T>(), a.in[1].as<T>(), a.in[2].as<T>(), a.out[0].as<T>(), a.out[1].as<T>(),
                       a.out[2].as<T>(), rows, dim, eps);
  });
}

// With xhat = (x - mean) * rstd and g = dy * gamma, per row:
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (+ dr); dgamma, dbeta sum over rows.
void layer_norm_grad(const KernelArgs& a) {
  const int64_t dim = a.in[1].shape().back();
  const int64_t rows = a.in[3].numel();
  dispatch_float(a.in[1].dtype(), [&]<class T>() {
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    // from_output: x is y and "mean" is beta; xhat = (y - beta) / gamma.
    const bool from_y = a.attrs().i("from_output") == 1;
    const T* mean = a.in[2].as<T>();
    const T* rstd = a.in[3].as<T>();
    const T* gamma = a.in[4].as<T>();
    if (from_y)
      for (int64_t j = 0; j < dim; ++j)
        if (gamma[j] == T(0))
          fail("layer_norm_grad from its output: gamma[", j, "] is 0, so the output does not determine the input");
    const T* dr = a.in.size() == 6 ? a.in[5].as<T>() : nullptr;
    T* dx = a.out[0].as<T>();
    const bool sums = a.out.size() == 4;  // dx_sums: of dx as stored, as a sum step reading it would add
    std::vector<double> dgamma(static_cast<size_t>(dim), 0.0), dbeta(static_cast<size_t>(dim), 0.0),
        dx_sum(sums ? static_cast<size_t>(dim) : 0, 0.0);
    std::vector<double> xhat(static_cast<size_t>(dim));
    for (int64_t r = 0; r < rows; ++r) {
      const double m = from_y ? 0.0 : static_cast<double>(mean[r]), s = static_cast<double>(rstd[r]);
      double g_sum = 0, gx_sum = 0;
      for (int64_t j = 0; j < dim; ++j) {
        const auto k = static_cast<size_t>(j);
        const double d = static_cast<double>(dy[r * dim + j]);
        const double v = static_cast<double>(x[r * dim + j]);
        xhat[k] = from_y ? (v - static_cast<double>(mean[j])) / static_cast<double>(gamma[j]) : (v - m) * s;
        const double g = d * static_cast<double>(gamma[j]);
        g_sum += g;
        gx_sum += g * xhat[k];
        dgamma[k] += d * xhat[k];
        dbeta[k] += d;
      }
      const double g_mean = g_sum / static_cast<double>(dim), gx_mean = gx_sum / static_cast<double>(dim);
      for (int64_t j = 0; j < dim; ++j) {
        const double g = static_cast<double>(dy[r * dim + j]) * static_cast<double>(gamma[j]);
        const T own = static_cast<T>(s * (g - g_mean - xhat[static_cast<size_t>(j)] * gx_mean));
        // With dr, the sum an add step would form: fused and unfused plans agree bit for bit.
        dx[r * dim + j] = dr ? static_cast<T>(own + dr[r * dim + j]) : own;
        if (sums) dx_sum[static_cast<size_t>(j)] += static_cast<double>(dx[r * dim + j]);
      }
    }
    for (int64_t j = 0; j < dim; ++j) {
      a.out[1].as<T>()[j] = static_cast<T>(dgamma[static_cast<size_t>(j)]);
      a.out[2].as<T>()[j] = static_cast<T>(dbeta[static_cast<size_t>(j)]);
      if (sums) a.out[3].as<T>()[j] = static_cast<T>(dx_sum[static_cast<size_t>(j)]);
    }
  });
}

// x is [N, C, inner...]: element (n, c, k) sits at (n * C + c) * inner + k.
struct ChannelLayout {
  int64_t batch, channels, inner;
  explicit ChannelLayout(const Shape& s) : batch(s[0]), channels(s[1]), inner(1) {
    for (size_t d = 2; d < s.size(); ++d) inner *= s[d];
  }
  int64_t count() const { return batch * inner; }  // elements per channel
  // Calls f(offset) for every element of channel c.
  template <class F>
  void each(int64_t c, F&& f) const {
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t k = 0; k < inner; ++k) f((n * channels + c) * inner + k);
  }
  // The sum of term(offset) over channel c in double. Eight partial sums, so the additions
  // do not wait on each other (one running sum is bound by the add's latency, a quarter of
  // the rate the loads allow); their order is fixed, so the result is the same every run.
  template <class F>
  double sum(int64_t c, F&& term) const {
    double acc[8] = {};
    for (int64_t n = 0; n < batch; ++n) {
      const int64_t base = (n * channels + c) * inner;
      int64_t k = 0;
      for (; k + 8 <= inner; k += 8)
        for (int j = 0; j < 8; ++j) acc[j] += term(base + k + j);
      for (int j = 0; k < inner; ++k, ++j) acc[j] += term(base + k);
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
};

// Outputs y, mean, invstd. Training normalizes with the batch statistics and updates the
// running ones in place (inputs 3 and 4 are persistent state), as torch.nn.BatchNorm;
// evaluation normalizes with the running statistics and reports them. With activation
// relu, y is relu's value of the normalized one (ops.def's: x > 0 ? x : 0), or of the
// normalized one plus the residual z (input 5), added in T as the unfused add does.
void batch_norm(const KernelArgs& a) {
  const ChannelLayout l(a.in[0].shape());
  const bool training = a.attrs().i("training") != 0;
  const bool relu = a.attrs().s("activation") == "relu";
  const double momentum = a.attrs().f("momentum"), eps = a.attrs().f("eps");
  const auto n = static_cast<double>(l.count());
  if (training && l.count() < 2)
    fail("batch_norm in training needs more than 1 value per channel, got input ", shape_str(a.in[0].shape()));
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* x = a.in[0].as<T>();
    const T* gamma = a.in[1].as<T>();
    const T* beta = a.in[2].as<T>();
    T* running_mean = a.in[3].as<T>();
    T* running_var = a.in[4].as<T>();
    const T* z = a.in.size() > 5 ? a.in[5].as<T>() : nullptr;
    T* y = a.out[0].as<T>();
    parallel_for(l.channels, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double mean, invstd;
        if (training) {
          mean = l.sum(c, [&](int64_t i) { return static_cast<double>(x[i]); }) / n;
          const double sq = l.sum(c, [&](int64_t i) {
            const double d = static_cast<double>(x[i]) - mean;
            return d * d;
          });
          const double var = sq / n;
          invstd = 1.0 / std::sqrt(var + eps);
          // The running variance is unbiased (n / (n - 1)), the normalization is not.
          running_mean[c] = static_cast<T>((1 - momentum) * static_cast<double>(running_mean[c]) + momentum * mean);
          running_var[c] = static_cast<T>((1 - momentum) * static_cast<double>(running_var[c]) + momentum * sq / (n - 1));
        } else {
          mean = static_cast<double>(running_mean[c]);
          invstd = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps);
        }
        const double g = static_cast<double>(gamma[c]), b = static_cast<double>(beta[c]);
        l.each(c, [&](int64_t i) {
          T v = static_cast<T>((static_cast<double>(x[i]) - mean) * invstd * g + b);
          if (z) v = static_cast<T>(v + z[i]);
          y[i] = relu && !(v > T(0)) ? T(0) : v;
        });
        a.out[1].as<T>()[c] = static_cast<T>(mean);
        a.out[2].as<T>()[c] = static_cast<T>(invstd);
      }
    });
  });
}

// With xhat = (x - mean) * invstd, per channel: dbeta = sum(dy), dgamma = sum(dy * xhat).
// Training (mean and invstd depend on x): dx = gamma * invstd / n * (n dy - dbeta - xhat dgamma).
// Evaluation (they are constants): dx = dy * gamma * invstd. With activation relu, dy is
// the gradient of relu's output y (input 6) and reaches the normalized value where y > 0
// (ops.def's relu derivative); beta (input 5) is cuDNN's, unused here.
void batch_norm_grad(const KernelArgs& a) {
  const ChannelLayout l(a.in[1].shape());
  const bool training = a.attrs().i("training") != 0;
  const bool relu = a.attrs().s("activation") == "relu";
  const auto n = static_cast<double>(l.count());
  dispatch_float(a.in[1].dtype(), [&]<class T>() {
    const T* dy_in = a.in[0].as<T>();
    const T* y = relu ? a.in[6].as<T>() : nullptr;
    // relu's masked gradient: the residual's dz (output 3) where there is one.
    std::vector<T> own;
    T* masked = nullptr;
    if (relu) {
      const auto count = static_cast<size_t>(a.in[0].numel());
      if (a.out.size() > 3) {
        masked = a.out[3].as<T>();
      } else {
        own.resize(count);
        masked = own.data();
      }
      for (size_t i = 0; i < count; ++i) masked[i] = y[i] > T(0) ? dy_in[i] : T(0);
    }
    const T* dy = relu ? masked : dy_in;
    const T* x = a.in[1].as<T>();
    const T* gamma = a.in[2].as<T>();
    const T* mean = a.in[3].as<T>();
    const T* invstd = a.in[4].as<T>();
    T* dx = a.out[0].as<T>();
    parallel_for(l.channels, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const double m = static_cast<double>(mean[c]), s = static_cast<double>(invstd[c]);
        const double scale = static_cast<double>(gamma[c]) * s;
        const double dbeta = l.sum(c, [&](int64_t i) { return static_cast<double>(dy[i]); });
        const double dgamma =
            l.sum(c, [&](int64_t i) { return static_cast<double>(dy[i]) * (static_cast<double>(x[i]) - m) * s; });
        l.each(c, [&](int64_t i) {
          const double d = static_cast<double>(dy[i]);
          if (training) {
            const double xhat = (static_cast<double>(x[i]) - m) * s;
            dx[i] = static_cast<T>(scale / n * (n * d - dbeta - xhat * dgamma));
          } else {
            dx[i] = static_cast<T>(scale * d);
          }
        });
        a.out[1].as<T>()[c] = static_cast<T>(dgamma);
        a.out[2].as<T>()[c] = static_cast<T>(dbeta);
      }
    });
  });
}

}  // namespace

void register_norm(KernelTable& t) {
  set(t, Op::layer_norm, layer_norm);
  set(t, Op::layer_norm_grad, layer_norm_grad);
  set(t, Op::batch_norm, batch_norm);
  set(t, Op::batch_norm_grad, batch_norm_grad);
}

}  // namespace seam::cpu
