// GPU against CPU: build a graph once, run it on a CPU model and a CUDA model with the
// same parameters and inputs, and compare every output and gradient with a tolerance
// chosen by precision. Inputs are fresh random values, never zeros.
#pragma once
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "seam/seam.h"

namespace seam::gpu_testing {

// Relative L2 error ||gpu - cpu|| / ||cpu||, and max abs error against atol + rtol*|cpu|.
struct Tolerance {
  double rel = 1e-5;   // f32
  double atol = 1e-6;
  static Tolerance f32() { return {1e-5, 1e-6}; }
  static Tolerance tf32() { return {2e-3, 1e-3}; }
};

class GpuCase {
 public:
  explicit GpuCase(uint64_t seed = 1) : rng_(seed) {}
  Graph g;
  // A parameter (compared gradient), uniform in [lo, hi).
  Var param(const std::string& name, Shape shape, double lo = -1, double hi = 1, bool decay = true);
  // Input data, uniform in [lo, hi).
  Var data(const std::string& name, Shape shape, double lo = -1, double hi = 1);
  // i32 labels or ids, uniform in [0, n).
  Var labels(const std::string& name, Shape shape, int32_t n);
  // i32 input with given values.
  Var ints(const std::string& name, Shape shape, std::vector<int32_t> values);
  Var state(const std::string& name, Shape shape, Init init);
  std::mt19937_64& rng() { return rng_; }
  std::vector<std::pair<std::string, std::vector<std::byte>>> feeds;

 private:
  std::mt19937_64 rng_;
};

struct CompareOptions {
  Tolerance tol;
  Mode mode = Mode::train;
  bool gradients = true;  // also compare d(sum(out * r))/d(each param)
  int runs = 1;           // runs before comparing (e.g. running statistics)
  bool tf32 = true;       // the GPU model may use TF32 for f32 GEMMs and convolutions
  bool fuse = true;       // epilogue fusion on both sides
  EpiloguePolicy epilogue = EpiloguePolicy::fastest;  // how the GPU runs fused epilogues
  // The output is a scalar loss whose own gradients are compared (seed 1), rather than
  // those of sum(out * random weights): the shape loss fusion needs.
  bool output_is_loss = false;
};

// The options for an f32 comparison with gradients.
inline CompareOptions f32() {
  CompareOptions o;
  o.tol = Tolerance::f32();
  return o;
}

// Adds a gtest failure per mismatching tensor; returns the largest relative error seen.
double compare_with_cpu(const std::function<Var(GpuCase&)>& build, const CompareOptions& o = {});

// Compares two float vectors; records a gtest failure naming `what` if they differ.
double expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, const Tolerance& tol,
                    const std::string& what);

}  // namespace seam::gpu_testing
