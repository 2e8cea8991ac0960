// Gradient checking against central finite differences, in double precision. A case
// builds a small graph whose parameters are the tensors to check; the harness adds a
// random weighting so every output element matters: loss = sum(out * r).
#pragma once
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "seam/seam.h"

namespace seam::testing {

class GradCase {
 public:
  explicit GradCase(uint64_t seed = 1) : rng_(seed) {}
  Graph g;
  // A checked tensor: f64 parameter with values uniform in [lo, hi).
  Var param(const std::string& name, Shape shape, double lo = -1.0, double hi = 1.0);
  // Unchecked f64 data (no gradient is taken).
  Var data(const std::string& name, Shape shape, double lo = -1.0, double hi = 1.0);
  // i32 data, uniform in [0, n).
  Var labels(const std::string& name, Shape shape, int32_t n);
  // Unchecked state tensor (e.g. running statistics), f64.
  Var state(const std::string& name, Shape shape, double value);

  std::mt19937_64& rng() { return rng_; }
  std::vector<std::pair<std::string, std::vector<std::byte>>> feeds;

 private:
  std::mt19937_64 rng_;
};

struct GradCheckOptions {
  double step = 1e-5;
  double rtol = 1e-5, atol = 1e-8;
  Mode mode = Mode::train;
  size_t max_elements = 160;  // elements checked per tensor (a random subset if larger)
};

// Builds the case, differentiates, and compares each parameter's gradient with central
// differences; adds a gtest failure naming the tensor and element for each mismatch.
// Returns the number of elements compared.
size_t check_gradients(const std::function<Var(GradCase&)>& build, const GradCheckOptions& o = {});

}  // namespace seam::testing
