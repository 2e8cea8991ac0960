// Optimizer settings and learning-rate schedules.
#include <cmath>
#include <numbers>
#include <sstream>

#include "seam/error.h"
#include "seam/optim.h"

namespace seam {

double Schedule::lr_at(double base, int64_t step) const {
  if (step < warmup_steps) return base * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const int64_t t = step - warmup_steps;
  switch (kind) {
    case Kind::constant: return base;
    case Kind::step: return base * std::pow(gamma, static_cast<double>(t / std::max<int64_t>(step_size, 1)));
    case Kind::cosine: {
      double progress = std::min(1.0, static_cast<double>(t) / static_cast<double>(std::max<int64_t>(total_steps, 1)));
      return min_lr + (base - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    }
  }
  return base;
}

std::string Schedule::str() const {
  std::ostringstream s;
  switch (kind) {
    case Kind::constant: s << "constant"; break;
    case Kind::step: s << "step(every " << step_size << ", gamma " << gamma << ")"; break;
    case Kind::cosine: s << "cosine(" << total_steps << " steps, min " << min_lr << ")"; break;
  }
  if (warmup_steps > 0) s << " after " << warmup_steps << " warmup steps";
  return s.str();
}

std::string LossScaling::str() const {
  std::ostringstream s;
  switch (mode) {
    case Mode::automatic: s << "auto"; break;
    case Mode::off: return "off";
    case Mode::dynamic: s << "dynamic"; break;
  }
  s << "(init " << init << ", x" << growth << " after " << interval << " clean steps, x" << backoff << " on overflow)";
  return s.str();
}

const char* optimizer_name(OptimizerConfig::Kind k) {
  switch (k) {
    case OptimizerConfig::Kind::sgd: return "sgd";
    case OptimizerConfig::Kind::adam: return "adam";
    case OptimizerConfig::Kind::adamw: return "adamw";
  }
  return "?";
}

OptimizerConfig OptimizerConfig::sgd(double lr, double momentum, bool nesterov) {
  OptimizerConfig c;
  c.kind = Kind::sgd;
  c.lr = lr;
  c.momentum = momentum;
  c.nesterov = nesterov;
  return c;
}

OptimizerConfig OptimizerConfig::adam(double lr, double beta1, double beta2, double eps) {
  OptimizerConfig c;
  c.kind = Kind::adam;
  c.lr = lr;
  c.beta1 = beta1;
  c.beta2 = beta2;
  c.eps = eps;
  return c;
}

OptimizerConfig OptimizerConfig::adamw(double lr, double weight_decay) {
  OptimizerConfig c = adam(lr);
  c.kind = Kind::adamw;
  c.weight_decay = weight_decay;
  return c;
}

int OptimizerConfig::state_slots() const {
  if (kind == Kind::sgd) return momentum != 0.0 ? 1 : 0;
  return 2;
}

bool OptimizerConfig::needs_norm() const {
  return clip_norm > 0 || skip_nonfinite || loss_scaling.mode == LossScaling::Mode::dynamic;
}

void OptimizerConfig::validate() const {
  const char* n = optimizer_name(kind);
  if (!(lr >= 0)) fail(n, ": lr must be >= 0, got ", lr);
  if (!(weight_decay >= 0)) fail(n, ": weight_decay must be >= 0, got ", weight_decay);
  if (!(clip_norm >= 0)) fail(n, ": clip_norm must be >= 0 (0 = off), got ", clip_norm);
  if (kind == Kind::sgd) {
    if (!(momentum >= 0)) fail("sgd: momentum must be >= 0, got ", momentum);
    if (nesterov && (momentum <= 0 || dampening != 0))
      fail("sgd: nesterov needs momentum > 0 and dampening = 0");
  } else {
    if (!(beta1 >= 0 && beta1 < 1)) fail(n, ": beta1 must be in [0, 1), got ", beta1);
    if (!(beta2 >= 0 && beta2 < 1)) fail(n, ": beta2 must be in [0, 1), got ", beta2);
    if (!(eps > 0)) fail(n, ": eps must be > 0, got ", eps);
  }
  if (schedule.warmup_steps < 0) fail("schedule: warmup_steps must be >= 0");
  const LossScaling& ls = loss_scaling;
  if (!(ls.init > 0 && std::isfinite(ls.init))) fail("loss scaling: init must be finite and > 0, got ", ls.init);
  if (!(ls.growth >= 1)) fail("loss scaling: growth must be >= 1, got ", ls.growth);
  if (!(ls.backoff > 0 && ls.backoff < 1)) fail("loss scaling: backoff must be in (0, 1), got ", ls.backoff);
  if (ls.interval < 1) fail("loss scaling: interval must be >= 1, got ", ls.interval);
  if (schedule.kind == Schedule::Kind::step && schedule.step_size < 1) fail("schedule: step_size must be >= 1");
  if (schedule.kind == Schedule::Kind::cosine && schedule.total_steps < 1)
    fail("schedule: cosine needs total_steps >= 1");
}

std::string OptimizerConfig::str() const {
  std::ostringstream s;
  s << optimizer_name(kind) << "(lr=" << lr;
  if (kind == Kind::sgd) {
    if (momentum != 0) s << ", momentum=" << momentum << (nesterov ? ", nesterov" : "");
    if (dampening != 0) s << ", dampening=" << dampening;
  } else {
    s << ", betas=(" << beta1 << ", " << beta2 << "), eps=" << eps;
  }
  if (weight_decay != 0) s << ", weight_decay=" << weight_decay;
  if (clip_norm != 0) s << ", clip_norm=" << clip_norm;
  s << ", schedule=" << schedule.str();
  if (loss_scaling.mode == LossScaling::Mode::dynamic) s << ", loss_scaling=" << loss_scaling.str();
  if (!skip_nonfinite) s << ", skip_nonfinite=off";
  s << ")";
  return s.str();
}

}  // namespace seam
