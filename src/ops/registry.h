// The op registry: for every Op, its schema (inputs, outputs, attributes with defaults),
// shape inference, gradient rule and cost. Each op family fills its entries in
// src/ops/<family>.cpp; the registry refuses to start if any op of ops.def is missing.
#pragma once
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "ops/shapes.h"
#include "seam/error.h"
#include "seam/graph.h"
#include "seam/ops.h"

namespace seam {

struct AttrSpec {
  std::string name;
  AttrValue def;
  bool required = false;
};

// What shape inference sees of a node being added.
struct InferCtx {
  const Graph& g;
  Op op;
  const std::string& node_name;
  const std::vector<ValueId>& in;
  const Attrs& attrs;

  size_t n() const { return in.size(); }
  const TensorType& type(size_t i) const { return g.value(in.at(i)).type; }
  const Shape& shape(size_t i) const { return type(i).shape; }
  // Throws a seam::Error that names the op, the node, every operand and its type.
  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    seam::fail(where(), ": ", parts...);
  }
  std::string where() const;
  // Checks that input i is floating point / of a given dtype, with a clear message.
  void expect_float(size_t i) const;
  void expect_dtype(size_t i, DType t) const;
  void expect_rank(size_t i, size_t rank) const;
  void expect_same_dtype() const;  // all inputs
  // Inputs `others` have input i's dtype or the dtype it computes in (f32 parameters of
  // an op on bf16 data, such as a norm's gamma and beta).
  void expect_dtype_or_compute(size_t i, std::initializer_list<size_t> others) const;
  // The dtype of the outputs of an op with a "dtype" attribute: "" for `in`, else the
  // named one, which must be `in` or the dtype `in` computes in (a GEMM on bf16 inputs
  // may write f32, e.g. a weight gradient into the f32 gradient buffer).
  DType result_dtype(DType in) const;
  int axis(const std::string& attr, size_t rank) const;  // normalized, checked
  // The `layout` attribute (src/ops/layout.h), checked: true for "nhwc".
  bool nhwc() const;
};

// What a gradient rule sees: the node (copied: the graph grows while rules run), handles
// to its inputs and outputs, the incoming gradients, and where to put the results.
struct GradCtx {
  Graph& g;
  Node node;
  std::vector<ValueId> dys;   // gradient of each output, -1 where none flows
  std::vector<bool> wants;    // which inputs need a gradient
  std::vector<ValueId> dxs;   // results, -1 where none

  Var x(size_t i) { return g.var(node.in.at(i)); }
  Var y(size_t i = 0) { return g.var(node.out.at(i)); }
  bool has_dy(size_t i = 0) const { return dys.at(i) >= 0; }
  Var dy(size_t i = 0);  // throws if no gradient flows into output i
  bool needs(size_t i) const { return i < wants.size() && wants[i]; }
  void set(size_t i, Var dx) {
    if (needs(i)) dxs.at(i) = dx.id();
  }
  const Attrs& attrs() const { return node.attrs; }
};

struct OpCostCtx {
  const std::vector<TensorType>& in;
  const std::vector<TensorType>& out;
  const Attrs& attrs;
};

struct OpDef {
  std::string name;
  // Input names; "b?" marks an optional trailing input, "xs..." a variadic one.
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<AttrSpec> attrs;
  std::function<std::vector<TensorType>(const InferCtx&)> infer;
  // Empty: no gradient flows through this op (integer outputs, stop_gradient, grads).
  std::function<void(GradCtx&)> grad;
  // Floating-point operations of one execution; empty: one per output element.
  std::function<double(const OpCostCtx&)> flops;
  // >= 0: output 0 is a view of that input's storage (no kernel, no copy).
  int view_of = -1;
  // {out, in}: output `out` may take input `in`'s buffer where no later step reads that
  // input (the planner decides): every kernel of the op reads an element of it before it
  // writes that element, and nothing else of it after. -1: never.
  std::pair<int, int> in_place{-1, -1};
  // Writes persistent state (input 0) and has no outputs: kept in a plan although no
  // output is read, unless its `training` attribute says the plan's mode skips it.
  bool side_effect = false;
  // Reads the step's state (the loss scale): a node of no inputs that still runs every
  // step, not once as a constant.
  bool per_step = false;
  std::string doc;

  std::string signature() const;  // "conv2d(x, w, b?; stride=[1,1], ...) -> y"
};

const OpDef& op_def(Op op);
// An op the backward pass emits (relu_grad, conv2d_grad_input, cross_entropy_with_grad):
// "_grad" as a word of its name. stop_gradient is a forward op.
bool is_gradient_op(Op op);
// A GEMM through the library (cuBLASLt on the GPU), fused epilogues included.
bool is_gemm(Op op);

// Family registration, one per src/ops/<family>.cpp.
using OpTable = std::vector<OpDef>;
void register_elementwise(OpTable& t);
void register_misc(OpTable& t);
void register_matmul(OpTable& t);
void register_reduce(OpTable& t);
void register_shape(OpTable& t);
void register_softmax(OpTable& t);
void register_loss(OpTable& t);
void register_norm(OpTable& t);
void register_conv(OpTable& t);
void register_pool(OpTable& t);
void register_attention(OpTable& t);
void register_fused_elementwise(OpTable& t);

inline OpDef& def(OpTable& t, Op op) { return t.at(static_cast<size_t>(op)); }

// Helpers shared by gradient rules.
// Sums g (at a broadcast shape) back down to `shape` (numpy broadcasting in reverse).
Var sum_to(Var g, const Shape& shape);

}  // namespace seam
