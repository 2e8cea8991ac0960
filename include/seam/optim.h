// Optimizers and learning-rate schedules. An optimizer updates the flat parameter buffer
// from the flat gradient buffer in one pass (multi-tensor by construction), with its
// moments in flat state buffers of the same layout. The learning rate is a pure function
// of the step counter kept with the optimizer state, so a captured step stays valid.
#pragma once
#include <cstdint>
#include <string>

namespace seam {

struct Schedule {
  enum class Kind : uint8_t { constant, step, cosine } kind = Kind::constant;
  int64_t warmup_steps = 0;  // linear warmup from lr/warmup to lr, before any kind
  int64_t step_size = 1;     // step: multiply by gamma every step_size steps
  double gamma = 0.1;
  int64_t total_steps = 0;   // cosine: steps from the end of warmup to min_lr
  double min_lr = 0.0;

  // Learning rate for update number `step` (0-based).
  double lr_at(double base_lr, int64_t step) const;
  std::string str() const;
};

// Dynamic loss scaling, as PyTorch's GradScaler, on the device inside the step: the
// backward pass starts from the scale instead of 1 (small f16 gradients stay above f16's
// underflow), the update divides the gradients by it. A step whose loss or gradient norm
// is not finite is skipped and the scale multiplied by `backoff`; after `interval` clean
// steps in a row it is multiplied by `growth`. automatic: dynamic where the model has f16
// values, off elsewhere.
struct LossScaling {
  enum class Mode : uint8_t { automatic, off, dynamic } mode = Mode::automatic;
  double init = 65536.0, growth = 2.0, backoff = 0.5;
  int64_t interval = 2000;
  std::string str() const;
};

struct OptimizerConfig {
  // sgd covers plain SGD, momentum and Nesterov momentum (as torch.optim.SGD); adam
  // adds weight decay to the gradient (torch.optim.Adam); adamw decays the weights
  // directly (torch.optim.AdamW).
  enum class Kind : uint8_t { sgd, adam, adamw } kind = Kind::sgd;
  double lr = 0.01;
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;  // applies to parameters created with decay = true
  double clip_norm = 0.0;     // > 0: clip gradients to this global L2 norm first
  Schedule schedule;
  LossScaling loss_scaling;
  // A step whose loss or global gradient norm is not finite leaves the parameters and
  // moments as they were and counts as skipped (StepState::skipped_steps), at every
  // precision. Costs one read of the gradients a step where nothing else needs the norm.
  bool skip_nonfinite = true;

  static OptimizerConfig sgd(double lr, double momentum = 0.0, bool nesterov = false);
  static OptimizerConfig adam(double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8);
  static OptimizerConfig adamw(double lr, double weight_decay = 0.01);

  int state_slots() const;  // flat state buffers needed: momentum 1, Adam 2
  // Whether an update needs the gradients' global norm (clipping, the non-finite guard, a
  // dynamic loss scale); the GPU computes it only then, and `seam train` logs it.
  bool needs_norm() const;
  void validate() const;    // throws seam::Error for out-of-range settings
  std::string str() const;
};

const char* optimizer_name(OptimizerConfig::Kind k);

}  // namespace seam
