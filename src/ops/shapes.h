// Shape rules shared by schemas and kernels (broadcasting, reductions), apart from the op
// registry so that kernel files can use them without its Var overloads.
#pragma once
#include <optional>
#include <vector>

#include "seam/dtype.h"

namespace seam {

struct InferCtx;

// Numpy broadcast of two shapes; empty optional if incompatible.
std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b);
// A reduction's axes (sum, mean), normalized and sorted; an empty attribute is every axis.
// Out of range or repeated axes fail through `c` when given (naming the node).
std::vector<int> reduce_axes(const std::vector<int64_t>& axes, size_t rank, const InferCtx* c);
Shape reduced_shape(const Shape& in, const std::vector<int>& axes, bool keepdims);

}  // namespace seam
