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

  static OptimizerConfig sgd(double lr, double momentum = 0.0, bool nesterov = false);
  static OptimizerConfig adam(double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8);
  static OptimizerConfig adamw(double lr, double weight_decay = 0.01);

  int state_slots() const;  // flat state buffers needed: momentum 1, Adam 2
  void validate() const;    // throws seam::Error for out-of-range settings
  std::string str() const;
};

const char* optimizer_name(OptimizerConfig::Kind k);

}  // namespace seam
