// The optimizer update over the flat buffers, on the CPU. Formulas follow PyTorch's
// documented torch.optim.SGD, Adam and AdamW; clipping follows clip_grad_norm_.
#include <algorithm>
#include <cmath>

#include "backend/cpu/optim.h"

#include "common/half.h"
#include "common/philox.h"
#include "common/stochastic.h"
#include "dist/comm.h"

namespace seam::cpu {

namespace {

template <class T>
void adam(const OptimizerConfig& c, int64_t n, int64_t n_decay, T* p, const T* g, T* m, T* v, double lr, int64_t t) {
  const double wd = c.weight_decay;
  const bool decoupled = c.kind == OptimizerConfig::Kind::adamw;
  const double bc1 = 1 - std::pow(c.beta1, static_cast<double>(t + 1));
  const double bc2 = 1 - std::pow(c.beta2, static_cast<double>(t + 1));
  const double step_size = lr / bc1, sqrt_bc2 = std::sqrt(bc2);
  for (int64_t i = 0; i < n; ++i) {
    double gi = g[i], pi = p[i];
    if (wd != 0 && i < n_decay) {
      if (decoupled) pi *= 1 - lr * wd;
      else gi += wd * pi;
    }
    double mi = c.beta1 * m[i] + (1 - c.beta1) * gi;
    double vi = c.beta2 * v[i] + (1 - c.beta2) * gi * gi;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    p[i] = static_cast<T>(pi - step_size * mi / (std::sqrt(vi) / sqrt_bc2 + c.eps));
  }
}

// The update over n values (the first n_decay decay); false when the step was skipped.
// `comm`: the values are this rank's shard, and the norm is the ranks' together.
template <class T>
bool update_values(const OptimizerConfig& c, int64_t n, int64_t n_decay, T* p, T* g, T* m, T* v, StepState& st,
                   double loss, dist::Comm* comm = nullptr) {
  const LossScaling& ls = c.loss_scaling;
  const bool scaled = ls.mode == LossScaling::Mode::dynamic;
  if (scaled && st.loss_scale <= 0) st.loss_scale = ls.init;
  const double unscale = scaled ? 1.0 / st.loss_scale : 1.0;
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  if (comm) comm->all_reduce_sum(&sq, 1);
  st.grad_norm = std::sqrt(sq) * unscale;
  const double lr = c.schedule.lr_at(c.lr, st.step);  // the schedule counts every step
  st.lr = lr;
  if (!(std::isfinite(st.grad_norm) && std::isfinite(loss)) && (c.skip_nonfinite || scaled)) {
    ++st.skipped_steps;
    ++st.skip_streak;
    if (scaled) st.loss_scale *= ls.backoff, st.scale_good = 0;
    return false;
  }
  st.skip_streak = 0;
  double coef = unscale;  // the gradient left in g is unscaled and clipped
  if (c.clip_norm > 0) coef *= std::min(1.0, c.clip_norm / (st.grad_norm + 1e-6));
  if (coef != 1)
    for (int64_t i = 0; i < n; ++i) g[i] = static_cast<T>(g[i] * coef);
  if (scaled && ++st.scale_good >= ls.interval) st.loss_scale *= ls.growth, st.scale_good = 0;

  // Updates done so far (Adam's bias correction, SGD's first momentum step): skipped
  // steps made none.
  const int64_t t = st.step - st.skipped_steps;
  const double wd = c.weight_decay;
  if (c.kind == OptimizerConfig::Kind::sgd) {
    for (int64_t i = 0; i < n; ++i) {
      double gi = g[i];
      if (wd != 0 && i < n_decay) gi += wd * p[i];
      if (c.momentum != 0) {
        double b = t == 0 ? gi : c.momentum * m[i] + (1 - c.dampening) * gi;
        m[i] = static_cast<T>(b);
        gi = c.nesterov ? gi + c.momentum * b : b;
      }
      p[i] = static_cast<T>(p[i] - lr * gi);
    }
  } else {
    adam(c, n, n_decay, p, g, m, v, lr, t);
  }
  return true;
}

// f32 or f64 parameters (the masters): updated in place, their working copies after.
template <class T>
void update_masters(const OptimizerConfig& c, const Layout& layout, const Regions& r, StepState& st, double loss,
                    std::optional<DType> working, bool zero) {
  const auto n = static_cast<int64_t>(layout.param_bytes / sizeof(T));
  const auto n_decay = static_cast<int64_t>(layout.decay_bytes / sizeof(T));
  T* m = reinterpret_cast<T*>(r.opt);
  auto* p = reinterpret_cast<T*>(r.params);
  auto* g = reinterpret_cast<T*>(r.grads);
  bool updated = false;
  if (zero) {
    // This rank's shard [lo, hi): its moments start at r.opt.
    const auto [lo, hi] = zero_shard(static_cast<size_t>(n), r.comm->rank(), r.comm->size());
    const auto k = static_cast<int64_t>(hi - lo), at = static_cast<int64_t>(lo);
    updated = update_values(c, k, std::clamp<int64_t>(n_decay - at, 0, k), p + at, g + at, m, m ? m + k : nullptr, st,
                            loss, r.comm);
    if (updated) {
      std::vector<size_t> split = zero_split(static_cast<size_t>(n), r.comm->size());
      for (size_t& s : split) s *= sizeof(T);
      r.comm->all_gather(p, split);
    }
  } else {
    updated = update_values(c, n, n_decay, p, g, m, m ? m + n : nullptr, st, loss);
  }
  if (!updated || !working) return;
  // The working copies leave the update with the masters, rounded once.
  auto* w = reinterpret_cast<uint16_t*>(r.working);
  for (int64_t i = 0; i < n; ++i) w[i] = float_to_half(static_cast<float>(p[i]), *working);
}

// 16-bit parameters without masters: the update in f32 (f32 moments), each new value
// rounded stochastically with a draw keyed by (seed, step, index) that the GPU makes too.
void update_stored16(const OptimizerConfig& c, const Layout& layout, const Regions& r, StepState& st, double loss) {
  const DType t = layout.param_dtype;
  const auto n = static_cast<int64_t>(layout.param_bytes / 2);
  auto* ph = reinterpret_cast<uint16_t*>(r.params);
  auto* gh = reinterpret_cast<uint16_t*>(r.grads);
  std::vector<float> p(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (size_t i = 0; i < p.size(); ++i) p[i] = half_to_float(ph[i], t), g[i] = half_to_float(gh[i], t);
  const int64_t step = st.step;
  float* m = reinterpret_cast<float*>(r.opt);
  if (!update_values(c, n, static_cast<int64_t>(layout.decay_bytes / 2), p.data(), g.data(), m, m ? m + n : nullptr, st,
                     loss))
    return;
  for (int64_t i = 0; i < n; ++i) {
    const float x = p[static_cast<size_t>(i)];
    const float u = dropout_uniform(st.seed, static_cast<uint64_t>(step), kRoundingStream, static_cast<uint64_t>(i));
    ph[i] = round_stochastic(x, float_to_half(x, t), [t](uint16_t h) { return half_to_float(h, t); }, u);
    gh[i] = float_to_half(g[static_cast<size_t>(i)], t);  // unscaled and clipped, as with masters
  }
}

}  // namespace

void optimizer_update(const OptimizerConfig& c, const Layout& layout, const Regions& r, StepState& st, double loss,
                      std::optional<DType> working, bool zero) {
  if (is_half(layout.param_dtype)) return update_stored16(c, layout, r, st, loss);
  dispatch_float(layout.param_dtype, [&]<class T>() { update_masters<T>(c, layout, r, st, loss, working, zero); });
}

}  // namespace seam::cpu
