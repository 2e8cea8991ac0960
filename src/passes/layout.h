// The layout pass: runs convolution regions channels-last. On the forward graph after the
// precision pass (before autodiff, so the backward follows), each 4-d conv2d of a region
// chosen channels-last (below) goes to layout nhwc (src/ops/layout.h): its input and
// filter are transposed to channels-last
// order where they are not already. Batch norm, pooling and global average pooling whose
// input is channels-last follow it, as do elementwise ops with a channels-last operand of
// their output's shape (their broadcast operands are reordered, a view where only dims of
// size 1 move). Any other consumer of a channels-last value reads it through one
// transpose back to NCHW, so values keep their meaning: a region's transposes stand only
// at its boundaries. A value keeps its name in either order; Program::read gives a
// channels-last one back in NCHW order.
//
// Filters are kept channels-last where they live: a rank-4 parameter that only such
// convolutions read as their filter (directly or through casts, as the precision pass
// leaves it) is declared [C_out, kh, kw, C_in] nhwc, so the parameter buffer, its gradient, the
// optimizer's moments and the 16-bit working copy all hold that order and no step
// transposes a filter or its gradient. The model stores those parameters so
// (channels_last_params) and speaks NCHW to its users: checkpoints, read_param and
// write_param reorder on the host.
//
// Which convolutions go channels-last is chosen per region (src/passes/layout_choice.cpp):
// a region is a maximal set of ops that can run in either layout (convolutions, and the
// batch norm, pooling and elementwise ops joined to them through their values), so a
// choice never puts a transpose inside one. Each region is costed both ways for a
// training step on the model's device and precision: its convolutions (cuDNN's NCHW
// tensor-core kernels transpose their operands internally; its FMA kernels for f32 are
// faster in NCHW; the CPU runs a channels-last step on permuted copies) and, channels-
// last, the transposes at its boundaries. ModelOptions::layout nchw or nhwc forces every
// region.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "passes/fuse.h"
#include "seam/model.h"

namespace seam {

// The convolutions, by their output's name, that run channels-last. A graph that already
// has an op in layout nhwc is left as its author wrote it.
FuseResult apply_layout(const Graph& g, const std::set<std::string>& nhwc_convs);

// The parameters apply_layout(g, nhwc_convs) declares channels-last (see above): the
// filters that only channels-last convolutions read.
std::set<std::string> channels_last_params(const Graph& g, const std::set<std::string>& nhwc_convs);

// One region and its choice. Estimates are of a training step (forward and both
// gradients), in microseconds on the ceilings of LayoutCosts.
struct LayoutRegion {
  std::vector<std::string> convs;  // by output name, in graph order
  bool nhwc = false;
  double nhwc_us = 0, nchw_us = 0;
  double boundary_us = 0;  // of nhwc_us: the transposes at the region's edges
  std::string why;         // "cost model" or the policy that forced it
  std::string str() const;  // one line for `seam plan`
};

// The ceilings the estimates take: the H200's, measured (docs/perf.md), by default.
struct LayoutCosts {
  bool gpu = true;
  Precision precision = Precision::f32;  // the model's: tf32 puts f32 convolutions on tensor cores
  double bandwidth_gbps = 4250;          // device memory, read + write
  double tf32_tflops = 400, half_tflops = 785, fma_tflops = 60;
  // f32 without TF32 on the GPU: cuDNN's FMA kernels take this much longer channels-last
  // (ResNet-18 on the H200: 11.30 ms against 6.41 a step, docs/perf.md).
  double fma_nhwc_slowdown = 1.76;
  // Depthwise and thin grouped convolutions (under 8 input channels a group) stay off the
  // tensor cores; cuDNN has direct NCHW kernels for them, and its channels-last ones at
  // TF32 took 6-25x the roofline (mobilenet_v3_small's, batch 64, on the H200).
  double grouped_nhwc_slowdown = 8;
};
// The H200's for the GPU; the 2-core development machine's for the CPU.
LayoutCosts layout_costs(Device device, Precision precision);

// g as compile sees it before the layout pass (after the precision pass), so that each
// convolution is costed at the dtype it runs in.
std::vector<LayoutRegion> choose_layouts(const Graph& g, LayoutPolicy policy, const LayoutCosts& costs);
std::set<std::string> nhwc_convs(const std::vector<LayoutRegion>& regions);

}  // namespace seam
