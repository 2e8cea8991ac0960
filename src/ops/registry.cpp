// The op registry: built once from every family's registration, checked for gaps.
#include "ops/registry.h"

#include <algorithm>

namespace seam {

namespace {

const char* const kOpNames[] = {
#define SEAM_OP(name) #name,
#define SEAM_UNARY(name, ...) #name, #name "_grad",
#define SEAM_BINARY(name, ...) #name, #name "_grad_a", #name "_grad_b",
#include "seam/ops.def"
};
static_assert(std::size(kOpNames) == static_cast<size_t>(kNumOps));

OpTable build() {
  OpTable t(static_cast<size_t>(kNumOps));
  register_elementwise(t);
  register_misc(t);
  register_matmul(t);
  register_reduce(t);
  register_shape(t);
  register_softmax(t);
  register_loss(t);
  register_norm(t);
  register_attention(t);
  register_conv(t);
  register_pool(t);
  register_fused_elementwise(t);
  for (size_t i = 0; i < t.size(); ++i) {
    if (!t[i].infer) fail("internal error: op '", kOpNames[i], "' has no schema registered");
    if (t[i].name != kOpNames[i])
      fail("internal error: op '", kOpNames[i], "' registered as '", t[i].name, "'");
  }
  return t;
}

}  // namespace

const char* op_name(Op op) { return kOpNames[static_cast<size_t>(op)]; }

std::optional<Op> parse_op(std::string_view name) {
  for (int i = 0; i < kNumOps; ++i)
    if (name == kOpNames[i]) return static_cast<Op>(i);
  return std::nullopt;
}

const OpDef& op_def(Op op) {
  static const OpTable table = build();
  return table.at(static_cast<size_t>(op));
}

std::string OpDef::signature() const {
  std::string s = name + "(";
  for (size_t i = 0; i < inputs.size(); ++i) s += (i ? ", " : "") + inputs[i];
  for (size_t i = 0; i < attrs.size(); ++i) {
    s += (i == 0 ? (inputs.empty() ? "" : "; ") : ", ") + attrs[i].name;
    s += attrs[i].required ? std::string(": ") + attr_type_name(attrs[i].def)
                           : "=" + attr_str(attrs[i].def);
  }
  s += ") -> ";
  for (size_t i = 0; i < outputs.size(); ++i) s += (i ? ", " : "") + outputs[i];
  return s;
}

std::string InferCtx::where() const {
  std::string s = std::string(op_name(op)) + " node '" + node_name + "'";
  const OpDef& d = op_def(op);
  if (!in.empty()) {
    s += " (";
    for (size_t i = 0; i < in.size(); ++i) {
      std::string arg = i < d.inputs.size() ? d.inputs[i] : d.inputs.back();
      while (!arg.empty() && (arg.back() == '?' || arg.back() == '.')) arg.pop_back();
      s += (i ? ", " : "") + arg + "=" + g.describe(in[i]);
    }
    s += ")";
  }
  return s;
}

void InferCtx::expect_float(size_t i) const {
  if (!is_float(type(i).dtype))
    fail("input ", i, " must be floating point, got ", dtype_name(type(i).dtype));
}

void InferCtx::expect_dtype(size_t i, DType t) const {
  if (type(i).dtype != t)
    fail("input ", i, " must be ", dtype_name(t), ", got ", dtype_name(type(i).dtype));
}

void InferCtx::expect_rank(size_t i, size_t rank) const {
  if (shape(i).size() != rank) fail("input ", i, " must have rank ", rank, ", got ", shape(i).size());
}

void InferCtx::expect_same_dtype() const {
  for (size_t i = 1; i < n(); ++i)
    if (type(i).dtype != type(0).dtype)
      fail("inputs must share one dtype, got ", dtype_name(type(0).dtype), " and ",
           dtype_name(type(i).dtype));
}

void InferCtx::expect_dtype_or_compute(size_t i, std::initializer_list<size_t> others) const {
  const DType t = type(i).dtype;
  for (size_t k : others)
    if (type(k).dtype != t && type(k).dtype != compute_dtype(t))
      fail("input ", k, " must be ", dtype_name(t), t != compute_dtype(t) ? std::string(" or ") + dtype_name(compute_dtype(t)) : "",
           " (as input ", i, "), got ", dtype_name(type(k).dtype));
}

DType InferCtx::result_dtype(DType in) const {
  const std::string& name = attrs.s("dtype");
  if (name.empty()) return in;
  auto t = parse_dtype(name);
  if (!t || (*t != in && *t != compute_dtype(in)))
    fail("dtype '", name, "' is not a result dtype of ", dtype_name(in), " inputs (", dtype_name(in),
         in != compute_dtype(in) ? std::string(" or ") + dtype_name(compute_dtype(in)) : "", ")");
  return *t;
}

int InferCtx::axis(const std::string& attr, size_t rank) const {
  int64_t a = attrs.i(attr);
  int r = normalize_axis(a, rank);
  if (r < 0) fail(attr, "=", a, " is out of range for rank ", rank);
  return r;
}

bool is_gradient_op(Op op) {
  const std::string_view n = op_name(op);
  for (size_t at = n.find("_grad"); at != std::string_view::npos; at = n.find("_grad", at + 1))
    if (at + 5 == n.size() || n[at + 5] == '_') return true;
  return false;
}

bool is_gemm(Op op) {
  switch (op) {
    case Op::matmul: case Op::linear: case Op::linear_act: case Op::linear_act_aux: case Op::linear_add:
    case Op::matmul_act_grad: case Op::linear_grad_weight_bias: case Op::linear_grad_input_bias:
      return true;
    default:
      return false;
  }
}

bool InferCtx::nhwc() const {
  const std::string& l = attrs.s("layout");
  if (l != "nchw" && l != "nhwc") fail("layout must be \"nchw\" or \"nhwc\", got \"", l, "\"");
  return l == "nhwc";
}

Var GradCtx::dy(size_t i) {
  if (dys.at(i) < 0)
    fail("internal error: ", node.name, " output ", i, " has no gradient");
  return g.var(dys[i]);
}

std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Var sum_to(Var g, const Shape& shape) {
  const Shape from = g.shape();
  if (from == shape) return g;
  SEAM_ASSERT(from.size() >= shape.size());
  size_t lead = from.size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < from.size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && from[i] != 1)) axes.push_back(static_cast<int64_t>(i));
  Var s = axes.empty() ? g : sum(g, axes, /*keepdims=*/true);
  return s.shape() == shape ? s : reshape(s, shape);
}

}  // namespace seam
