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
#pragma once
#include "passes/fuse.h"

namespace seam {

// layout plain: g unchanged. A graph that already has an op in layout nhwc is left as
// its author wrote it.
FuseResult apply_layout(const Graph& g, DataLayout conv_layout);

}  // namespace seam
