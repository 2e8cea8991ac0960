// Facts about the elementwise ops of seam/ops.def, for the gradient rules here and for
// backends that generate code from the expressions (the strings are the expressions of
// ops.def, verbatim).
#pragma once
#include "seam/op.h"

namespace seam {

enum class Uses { X, Y, N };  // which forward value a unary derivative reads

struct UnaryInfo {
  Op op, grad;
  const char* attr;  // "" if the op has no scalar attribute
  double def;        // NAN: required
  const char* value;
  const char* derivative;
  Uses uses;
};

struct BinaryInfo {
  Op op, grad_a, grad_b;
  const char* value;
  const char* da;
  const char* db;
};

// Both look up by the forward op or by any of its gradient ops; nullptr if not one.
const UnaryInfo* unary_info(Op op);
const BinaryInfo* binary_info(Op op);

}  // namespace seam
