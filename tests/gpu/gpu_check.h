// GPU against CPU: build a graph once, run it on a CPU model and a CUDA model with the
// same parameters and inputs, and compare every output and gradient with a tolerance
// chosen by precision. Inputs are fresh random values, never zeros.
#pragma once
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "seam/seam.h"

namespace seam::gpu_testing {

// How two results may differ: the relative L2 error ||gpu - cpu|| / ||cpu|| at most `rel`,
// and every element within atol + rms_atol * rms(cpu) + elem_rel * |cpu|.
struct Tolerance {
  Tolerance(double rel_l2, double element_rel, double abs) : rel(rel_l2), elem_rel(element_rel), atol(abs) {}
  double rel;
  double elem_rel;
  double atol;
  // An element floor in units of the tensor's RMS, for sums whose small elements are the
  // cancellation of large terms: their rounding error is the terms' size, not theirs.
  double rms_atol = 0;
  static Tolerance f32() { return {1e-5, 1e-4, 1e-6}; }
  static Tolerance tf32() { return {2e-3, 2e-2, 1e-3}; }
  // cuDNN's channels-last tensor-core convolutions at TF32: as tf32() over the tensor, but
  // measured on the H200 an element whose 288 terms cancel to 0.04 came out 0.01 off, so
  // the elementwise floor is the size of such terms' rounding, not of the result's.
  static Tolerance tf32_nhwc() { return {3e-3, 5e-2, 1.5e-2}; }
  // 16-bit storage: the GPU and the CPU's emulation round the same values, but sums in a
  // different order can land a value on the other side of a rounding boundary (one unit
  // in the last place: 2^-8 relative for bf16, 2^-11 for f16), and chains compound it.
  static Tolerance bf16() { return {1e-2, 5e-2, 2e-2}; }
  static Tolerance f16() { return {2e-3, 1e-2, 2e-3}; }
  static Tolerance exact() { return {0, 0, 0}; }  // bit for bit (for finite values)
};

class GpuCase {
 public:
  explicit GpuCase(uint64_t seed = 1) : rng_(seed) {}
  Graph g;
  // A parameter (compared gradient), uniform in [lo, hi).
  Var param(const std::string& name, Shape shape, double lo = -1, double hi = 1, bool decay = true);
  // Input data, uniform in [lo, hi), in f32 or (rounded to it) a 16-bit dtype.
  Var data(const std::string& name, Shape shape, double lo = -1, double hi = 1, DType dtype = DType::f32);
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

// Every comparison names its precision and tolerance (there is no default).
struct CompareOptions {
  CompareOptions(Precision p, Tolerance t) : precision(p), tol(t) {}
  CompareOptions with_runs(int n) const {
    CompareOptions o = *this;
    o.runs = n;
    return o;
  }
  CompareOptions fixed() const {
    CompareOptions o = *this;
    o.deterministic = true;
    return o;
  }
  CompareOptions in_mode(Mode m) const {
    CompareOptions o = *this;
    o.mode = m;
    return o;
  }
  Precision precision;
  Tolerance tol;
  Mode mode = Mode::train;
  bool gradients = true;  // also compare d(sum(out * r))/d(each param)
  int runs = 1;           // runs before comparing (e.g. running statistics)
  bool fuse = true;       // epilogue fusion on both sides
  EpiloguePolicy epilogue = EpiloguePolicy::fastest;  // how the GPU runs fused epilogues
  bool deterministic = false;                         // ModelOptions::deterministic on the GPU
  LayoutPolicy layout = LayoutPolicy::automatic;      // of both models (the CPU's follows the same policy)
  // The output is a scalar loss whose own gradients are compared (seed 1), rather than
  // those of sum(out * random weights): the shape loss fusion needs.
  bool output_is_loss = false;
  std::vector<std::string> recompute;  // CompileOptions::recompute on both sides
  int output_chunks = 1;               // CompileOptions::output_chunks on both sides
  // A memory budget one byte under what the step takes without one (the CPU's plan), on
  // both sides: what the planner does first to fit.
  bool budget_just_under = false;
};

// An f32 comparison with gradients, and a TF32 one.
inline CompareOptions f32() { return {Precision::f32, Tolerance::f32()}; }
inline CompareOptions tf32() { return {Precision::tf32, Tolerance::tf32()}; }
inline CompareOptions tf32_nhwc() { return {Precision::tf32, Tolerance::tf32_nhwc()}; }
inline CompareOptions bf16() { return {Precision::bf16, Tolerance::bf16()}; }
inline CompareOptions f16() { return {Precision::f16, Tolerance::f16()}; }

// Points XDG_CACHE_HOME at a fresh folder of its own for the lifetime of the object (every
// cache the backend keeps lives under it), then restores it and removes the folder.
class TempCacheDir {
 public:
  TempCacheDir();
  ~TempCacheDir();
  TempCacheDir(const TempCacheDir&) = delete;
  TempCacheDir& operator=(const TempCacheDir&) = delete;
  void use() const;  // points XDG_CACHE_HOME here again
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, old_;
  bool had_old_ = false;
};

// An example model file trained on the GPU with ModelOptions::deterministic and fresh
// caches (no pick carried over from an earlier run), on four random batches in turn.
struct ExampleRun {
  int64_t batch = 16;
  int steps = 12;
  bool graph = true;
  std::shared_ptr<dist::Comm> ranks;  // the gradients summed over them (NCCL), in 64 KiB buckets
  int zero = 0;                       // ModelOptions::zero
};
// Its tensors (parameters, states, moments) after the run.
std::vector<HostTensor> train_example(const std::string& example, const ExampleRun& r);

// Adds a gtest failure per mismatching tensor; returns the largest relative error seen.
double compare_with_cpu(const std::function<Var(GpuCase&)>& build, const CompareOptions& o);

// Compares two float vectors; records a gtest failure naming `what` if they differ.
double expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, const Tolerance& tol,
                    const std::string& what);

}  // namespace seam::gpu_testing
