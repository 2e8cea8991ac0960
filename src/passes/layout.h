// The layout pass: runs convolution regions channels-last. On the forward graph after the
// precision pass (before autodiff, so the backward follows), every 4-d conv2d goes to
// layout nhwc (src/ops/layout.h): its input and filter are transposed to channels-last
// order where they are not already. Batch norm, pooling and global average pooling whose
// input is channels-last follow it, as do elementwise ops with a channels-last operand of
// their output's shape (their broadcast operands are reordered, a view where only dims of
// size 1 move). Any other consumer of a channels-last value reads it through one
// transpose back to NCHW, so values keep their meaning: a region's transposes stand only
// at its boundaries. A value keeps its name in either order; Program::read gives a
// channels-last one back in NCHW order.
//
// Filters are kept channels-last where they live: a rank-4 parameter that some 4-d conv2d
// reads as its filter (directly or through casts, as the precision pass leaves it) is
// declared [C_out, kh, kw, C_in] nhwc, so the parameter buffer, its gradient, the
// optimizer's moments and the 16-bit working copy all hold that order and no step
// transposes a filter or its gradient. The model stores those parameters so
// (channels_last_params) and speaks NCHW to its users: checkpoints, read_param and
// write_param reorder on the host.
#pragma once
#include <set>
#include <string>

#include "passes/fuse.h"

namespace seam {

// layout plain: g unchanged. A graph that already has an op in layout nhwc is left as
// its author wrote it.
FuseResult apply_layout(const Graph& g, DataLayout conv_layout);

// The parameters apply_layout(g, nhwc) declares channels-last (see above).
std::set<std::string> channels_last_params(const Graph& g);

}  // namespace seam
