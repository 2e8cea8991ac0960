// What the ONNX importer's op table (onnx_ops.cpp) and its driver (onnx.cpp) share: the
// values known so far, folded constants, and one node's view of its operands and
// attributes. Internal to the importer.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "io/onnx.h"
#include "onnx.pb.h"
#include "seam/ops.h"

namespace seam::onnx::detail {

// A constant known at import time: an initializer or a Constant node's value, or what
// folding made of them. Values as doubles (exact for every float dtype seam keeps and for
// integers up to 2^53); elem is the ONNX element type.
struct Const {
  Shape shape;
  std::vector<double> v;
  int32_t elem = ::onnx::TensorProto::FLOAT;
  std::vector<int64_t> ints() const;
};

// The seam dtype ONNX element type `elem` is kept in, or nullopt where seam has none.
std::optional<DType> dtype_of(int32_t elem);
const char* elem_name(int32_t elem);

struct Importer {
  Graph& g;
  const OnnxOptions& options;
  int64_t opset = 0;
  std::map<std::string, Var> vars;      // ONNX value name -> seam value
  std::map<std::string, Const> consts;  // ONNX value name -> its constant
  std::set<std::string> initializers;   // which constants came from initializers
  std::set<std::string> differentiable;  // values a gradient from the outputs reaches
  // The graph's nodes by the values they make, and how many nodes (and graph outputs)
  // read each value: what a pattern spanning nodes (attention) looks back through.
  std::map<std::string, const ::onnx::NodeProto*> producer;
  std::map<std::string, int> readers;
  std::vector<HostTensor>* initial = nullptr;
  std::string source;  // the file, for errors
  // The value named `name` as a graph value: a constant becomes a parameter (a float
  // initializer, unless frozen) or a state value, once. `where` names the node asking.
  Var var(const std::string& name, const std::string& where);
  // Whether the constant `name` becomes a trained parameter when a node reads it as data:
  // such a value is never folded into another constant.
  bool trainable(const std::string& name) const;
};

// A value's rank, signed, for the dim arithmetic of the op importers.
inline int64_t rank(Var v) { return static_cast<int64_t>(v.rank()); }

// One node being imported.
class NodeCtx {
 public:
  NodeCtx(Importer& imp, const ::onnx::NodeProto& node, int index);
  Importer& imp;
  const ::onnx::NodeProto& node;
  const std::string where;  // "file: node 'name' (OpType)", or node #index where it has no name
  Graph& g() { return imp.g; }
  int64_t opset() const { return imp.opset; }

  size_t inputs() const { return static_cast<size_t>(node.input_size()); }
  bool has(size_t i) const { return i < inputs() && !node.input(static_cast<int>(i)).empty(); }
  Var in(size_t i);                            // input i as a graph value (required)
  const Const* maybe_const(size_t i) const;    // input i's constant, if it has one
  // The same, unless it becomes a trained parameter: what a node may fold.
  const Const* foldable(size_t i) const {
    return has(i) && !imp.trainable(node.input(static_cast<int>(i))) ? maybe_const(i) : nullptr;
  }
  const Const& const_in(size_t i, const char* what);  // input i, which must be constant

  bool has_attr(const std::string& name) const;
  int64_t i(const std::string& name, int64_t def) const;
  double f(const std::string& name, double def) const;
  std::string s(const std::string& name, const std::string& def) const;
  std::vector<int64_t> ints(const std::string& name, std::vector<int64_t> def = {}) const;
  std::vector<double> floats(const std::string& name) const;
  const ::onnx::TensorProto* tensor_attr(const std::string& name) const;

  void out(size_t i, Var v);           // output i is v
  void out_const(size_t i, Const c);   // output i is a constant (folded)
  size_t outputs() const { return static_cast<size_t>(node.output_size()); }
  bool wants(size_t i) const { return i < outputs() && !node.output(static_cast<int>(i)).empty(); }

  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    seam::fail(where, ": ", parts...);
  }
};

// Each op type's importer; it may read every input and attribute and must set every
// output the node names.
using OpImporter = void (*)(NodeCtx&);
const std::map<std::string, OpImporter>& op_importers();
// The table's entries for linear algebra, normalization, convolution and pooling
// (onnx_ops_nn.cpp).
void add_nn_importers(std::map<std::string, OpImporter>& table);

// Helpers the op files share (onnx_ops.cpp).
// Fails unless a constant of `shape` is small enough to fold at import (2^26 values).
void check_foldable(NodeCtx& c, const Shape& shape);
// The one value of a constant operand (a scalar, or a tensor of one element).
double scalar_of(NodeCtx& c, const Const& k, const char* what);
// x's slices along `axis` at the indices ids (i32, of shape id_shape): an embedding
// lookup on x with the axis moved first; the result [before..., id_shape..., after...].
Var gather_along(NodeCtx& c, Var x, int64_t axis, Var ids, const Shape& id_shape);
// The same with constant indices (in range), kept as the state value "<node>.<suffix>".
Var gather_const(NodeCtx& c, Var x, int64_t axis, const std::vector<int64_t>& idx, const std::string& suffix);
// The table's entries for Resize and Upsample (onnx_ops_resize.cpp).
void add_resize_importers(std::map<std::string, OpImporter>& table);
// The table's entries for comparisons, logic, Where and Mod (onnx_ops_logic.cpp).
void add_logic_importers(std::map<std::string, OpImporter>& table);
// The table's entries for activations (onnx_ops_act.cpp).
void add_activation_importers(std::map<std::string, OpImporter>& table);
// The table's entries for values known at import (onnx_ops_const.cpp).
void add_constant_importers(std::map<std::string, OpImporter>& table);
// An input's shape, constant or not.
Shape shape_of(NodeCtx& c, size_t i);
// Fails unless every input that is no constant is floating point (seam folds integer
// arithmetic; its kernels compute in floating point).
void expect_float_operands(NodeCtx& c);
// MatMul(Softmax(scale * MatMul(q, k^T) [+ causal mask]), v), as exporters write
// attention, at its last MatMul: seam's attention op in its place, true; false where the
// node is not the end of that pattern (onnx_attention.cpp).
bool import_attention(NodeCtx& c);
// Element `flat` of the broadcast of c to the shape `to`.
double at_broadcast(const Const& c, const Shape& to, int64_t flat);
// f over the broadcast of a and b, truncated to integers for an integer a.
Const fold_binary(NodeCtx& c, const Const& a, const Const& b, const std::function<double(double, double)>& f);
// Whether every input the node has is a constant that folds (none a trained parameter).
bool all_const(NodeCtx& c);
int64_t norm_axis(NodeCtx& c, int64_t axis, size_t rank, const char* what = "axis");
Shape broadcast_shape(NodeCtx& c, const Shape& a, const Shape& b);
std::vector<int64_t> axes_of(NodeCtx& c, size_t input, int64_t since_opset);
Var scalar(Graph& g, double v, DType t);

// A TensorProto's values (doubles) and shape; `where` names it in errors.
Const const_of(const ::onnx::TensorProto& t, const std::string& where);
// A host tensor's values as a constant of ONNX element type elem.
Const const_of(const HostTensor& h, int32_t elem);
// Element i of bytes in dtype t, as a double.
double value_at(const std::vector<std::byte>& data, DType t, size_t i);
// A constant's values in seam's storage dtype for it, as a HostTensor named `name`.
HostTensor host_tensor(const Const& c, const std::string& name, const std::string& where);

}  // namespace seam::onnx::detail
