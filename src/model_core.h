// Model::Core, what a Model and its Programs share (src/model.cpp makes it;
// src/program_io.cpp moves a program's inputs and outputs), and the byte helpers both use.
#pragma once
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "passes/layout.h"
#include "seam/model.h"

namespace seam {

struct Model::Core {
  Graph graph;
  Layout layout;
  StepState state;
  Device device = Device::cpu;
  Precision precision = Precision::f32;
  std::vector<PrecisionOverride> overrides;
  std::optional<DType> stored;  // the 16-bit parameter dtype without masters (master_weights false)
  std::vector<LayoutRegion> layout_regions;  // ModelOptions::layout, resolved per region
  std::set<std::string> nhwc_convs;          // the convolutions they put channels-last
  int reuse_gap = 0;  // LowerRequest::reuse_gap: 1 when the backend runs steps concurrently
  std::shared_ptr<Backend> backend;
  // params, grads, state_buf and counters are made, and the parameters and states drawn
  // from init_seed (ModelOptions::seed), on first use (with_values, model.cpp): planning
  // alone needs none of them. drawn: the parameters and states hold values (drawn, reset
  // or loaded).
  uint64_t init_seed = 0;
  bool drawn = false;
  std::byte* params = nullptr;
  std::byte* grads = nullptr;
  std::byte* state_buf = nullptr;
  std::byte* opt = nullptr;
  int opt_slots = 0;  // moments a parameter that `opt` holds: the first optimizer's (or a checkpoint's)
  std::byte* counters = nullptr;  // the backend's copy of step and seed, if it keeps one
  // The parameters' 16-bit working copies (Plan::working), made from the masters where
  // they are stale: after anything but an update that writes them changed the masters.
  std::byte* working = nullptr;
  bool working_valid = false;
  std::shared_ptr<dist::Comm> comm;  // ModelOptions::comm
  size_t bucket_bytes = 0;
  bool zero = false;  // ZeRO-1 among comm's ranks (a group of one takes its path too)
  // The parameter values whose moments `opt` holds (as elements): all of them, or this
  // rank's ZeRO-1 shard.
  size_t shard_lo = 0, shard_hi = 0;
  bool sharded() const { return shard_hi - shard_lo != layout.param_bytes / dtype_size(layout.param_dtype); }
  size_t moment_bytes() const { return (shard_hi - shard_lo) * dtype_size(layout.moment_dtype()); }
  StepState synced{-1, 0, 0, 0};  // what `counters` holds (step -1: nothing yet)
  ~Core() {
    for (std::byte* p : {params, grads, state_buf, opt, counters, working})
      if (p) backend->release(p);
  }
  void refresh_working(DType t) {
    if (working_valid) return;
    backend->round_f32(working, t, params, layout.param_bytes / sizeof(float));
    working_valid = true;
  }
  Regions regions(std::byte* arena) { return {arena, params, grads, state_buf, opt, counters, &synced, working, comm.get()}; }
  void allocate();           // params, grads, state_buf, counters, unless made already
  void draw(uint64_t seed);  // every parameter and state tensor from its initializer
  Core& with_values();       // allocate() and draw(init_seed) unless drawn
};

// Values as the bytes of dtype t (rounded to nearest even for the 16-bit types).
std::vector<std::byte> encode(const std::vector<double>& v, DType t);
// Bytes between a slot's stored order and its users' (NCHW) order; a copy where they agree.
std::vector<std::byte> reordered(const TensorType& stored, std::span<const std::byte> data, DType element,
                                 bool to_user);

}  // namespace seam
