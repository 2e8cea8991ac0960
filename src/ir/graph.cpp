// Graph construction and verification.
#include "seam/graph.h"

#include <cmath>

#include "common/strings.h"
#include "ops/layout.h"
#include "ops/registry.h"

namespace seam {

namespace {

// The DataLayout of each 4-d output, from the node alone: nhwc where the op works in nhwc
// (its layout attribute), where a transpose takes a plain value to channels-last order,
// or where an operand of the output's shape is nhwc (elementwise ops, fused groups,
// views); plain otherwise, and back to plain where a transpose restores NCHW order.
void tag_layouts(const Graph& g, Op op, const std::vector<ValueId>& in, const Attrs& attrs,
                 std::vector<TensorType>& types) {
  for (TensorType& t : types) {
    t.layout = DataLayout::plain;
    if (t.shape.size() != 4) continue;
    if (is_nhwc(attrs)) {
      t.layout = DataLayout::nhwc;
    } else if (op == Op::transpose) {
      const DataLayout from = g.value(in.at(0)).type.layout;
      if (from == DataLayout::plain && attrs.ints("perm") == to_nhwc_perm()) t.layout = DataLayout::nhwc;
    } else {
      for (ValueId v : in)
        if (g.value(v).type.layout == DataLayout::nhwc && g.value(v).type.shape == t.shape) t.layout = DataLayout::nhwc;
    }
  }
}

}  // namespace

Init Init::fan_in_uniform(int64_t fan_in) {
  double bound = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(fan_in, 1)));
  return uniform(-bound, bound);
}

std::string Init::str() const {
  switch (kind) {
    case Kind::zeros: return "zeros";
    case Kind::ones: return "ones";
    case Kind::constant: return "constant(" + std::to_string(a) + ")";
    case Kind::uniform: return "uniform(" + std::to_string(a) + ", " + std::to_string(b) + ")";
    case Kind::normal: return "normal(" + std::to_string(a) + ", " + std::to_string(b) + ")";
  }
  return "?";
}

TensorType Var::type() const { return g_->value(id_).type; }
std::string Var::name() const { return g_->value(id_).name; }
int64_t Var::dim(int64_t axis) const {
  const Shape& s = g_->value(id_).type.shape;
  int a = normalize_axis(axis, s.size());
  if (a < 0) fail("axis ", axis, " is out of range for ", g_->describe(id_));
  return s[static_cast<size_t>(a)];
}

Graph::Scope::Scope(Graph& g, const std::string& prefix) : g_(g) { g_.scopes_.push_back(prefix); }
Graph::Scope::~Scope() { g_.scopes_.pop_back(); }

std::string Graph::unique_name(const std::string& base) {
  std::string name;
  for (auto& s : scopes_) name += s + "/";
  name += base;
  int& count = name_counts_[name];
  std::string result = count == 0 ? name : name + "_" + std::to_string(count);
  ++count;
  while (by_name_.count(result)) result = name + "_" + std::to_string(count++);
  return result;
}

ValueId Graph::new_leaf(const std::string& name, TensorType type, ValueKind kind) {
  if (name.empty()) fail("a graph ", kind == ValueKind::input ? "input" : "parameter",
                         " needs a name");
  if (by_name_.count(name)) fail("duplicate value name '", name, "'");
  for (int64_t d : type.shape)
    if (d <= 0) fail("value '", name, "' has a non-positive dimension: ", shape_str(type.shape));
  Value v;
  v.type = std::move(type);
  v.name = name;
  v.kind = kind;
  auto id = static_cast<ValueId>(values_.size());
  values_.push_back(std::move(v));
  by_name_[name] = id;
  return id;
}

Var Graph::input(const std::string& name, Shape shape, DType dtype) {
  ValueId id = new_leaf(name, {dtype, std::move(shape)}, ValueKind::input);
  inputs_.push_back(id);
  return Var(this, id);
}

Var Graph::param(const std::string& name, Shape shape, Init init, bool decay, DType dtype) {
  if (!is_float(dtype)) fail("parameter '", name, "' must be floating point, got ", dtype_name(dtype));
  ValueId id = new_leaf(name, {dtype, std::move(shape)}, ValueKind::param);
  values_[static_cast<size_t>(id)].init = init;
  values_[static_cast<size_t>(id)].decay = decay;
  params_.push_back(id);
  return Var(this, id);
}

Var Graph::state(const std::string& name, Shape shape, Init init, DType dtype) {
  ValueId id = new_leaf(name, {dtype, std::move(shape)}, ValueKind::state);
  values_[static_cast<size_t>(id)].init = init;
  states_.push_back(id);
  return Var(this, id);
}

std::optional<ValueId> Graph::find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::string Graph::describe(ValueId id) const {
  const Value& v = value(id);
  return "'" + v.name + "' " + v.type.str();
}

namespace {

// Checks the operand count against the schema ("b?" optional, "xs..." variadic).
void check_arity(const OpDef& d, size_t n, const std::string& node) {
  size_t required = 0;
  bool variadic = false;
  for (auto& name : d.inputs) {
    if (name.ends_with("...")) variadic = true;
    else if (!name.ends_with("?")) ++required;
  }
  bool ok = variadic ? n >= std::max<size_t>(required, 1) : n >= required && n <= d.inputs.size();
  if (!ok)
    fail(d.name, " node '", node, "': takes ", d.signature(), ", got ", n, " input(s)");
}

// Fills defaults into `attrs` and rejects unknown or mistyped attributes.
Attrs complete_attrs(const OpDef& d, const Attrs& given, const std::string& node) {
  std::vector<std::string> known;
  for (auto& s : d.attrs) known.push_back(s.name);
  for (auto& [name, value] : given.items()) {
    const AttrSpec* spec = nullptr;
    for (auto& s : d.attrs)
      if (s.name == name) spec = &s;
    if (!spec) {
      std::string near = nearest_names(name, known);
      fail(d.name, " node '", node, "': unknown attribute '", name, "'",
           near.empty() ? "" : "; did you mean " + near + "?",
           known.empty() ? " (it takes none)" : "");
    }
    bool same = spec->def.index() == value.index() ||
                (std::holds_alternative<double>(spec->def) && std::holds_alternative<int64_t>(value));
    if (!same)
      fail(d.name, " node '", node, "': attribute '", name, "' must be a ",
           attr_type_name(spec->def), ", got ", attr_type_name(value), " ", attr_str(value));
  }
  Attrs out;
  for (auto& s : d.attrs) {
    if (given.has(s.name)) {
      AttrValue v = given.get(s.name);
      if (std::holds_alternative<double>(s.def) && std::holds_alternative<int64_t>(v))
        v = static_cast<double>(std::get<int64_t>(v));
      out.set(s.name, std::move(v));
    } else if (s.required) {
      fail(d.name, " node '", node, "': attribute '", s.name, "' is required");
    } else {
      out.set(s.name, s.def);
    }
  }
  return out;
}

}  // namespace

std::vector<ValueId> Graph::add(Op op, const std::vector<ValueId>& inputs, Attrs attrs) {
  return add_impl(op, inputs, std::move(attrs), unique_name(op_def(op).name));
}

std::vector<ValueId> Graph::add_named(Op op, const std::vector<ValueId>& inputs, Attrs attrs, const std::string& name) {
  if (by_name_.count(name)) fail("duplicate node name '", name, "'");
  return add_impl(op, inputs, std::move(attrs), name);
}

std::vector<ValueId> Graph::add_named(Op op, const std::vector<ValueId>& inputs, Attrs attrs,
                                     const std::vector<std::string>& out_names) {
  SEAM_ASSERT(!out_names.empty());
  for (auto& n : out_names)
    if (by_name_.count(n)) fail("duplicate node name '", n, "'");
  return add_impl(op, inputs, std::move(attrs), out_names[0], &out_names);
}

std::vector<ValueId> Graph::add_impl(Op op, const std::vector<ValueId>& inputs, Attrs attrs, std::string name,
                                     const std::vector<std::string>* out_names) {
  const OpDef& d = op_def(op);
  for (ValueId id : inputs)
    if (id < 0 || static_cast<size_t>(id) >= values_.size())
      fail(d.name, " node '", name, "': operand ", id, " does not belong to this graph");
  check_arity(d, inputs.size(), name);
  Attrs full = complete_attrs(d, attrs, name);
  InferCtx ctx{*this, op, name, inputs, full};
  std::vector<TensorType> types = d.infer(ctx);
  tag_layouts(*this, op, inputs, full, types);
  // A variadic output list ("ys...") takes as many outputs as shape inference gives.
  // An optional last output ("dz?") is there where shape inference gives it.
  const bool variadic = d.outputs.size() == 1 && d.outputs[0].ends_with("...");
  const bool optional_last = !d.outputs.empty() && d.outputs.back().ends_with("?");
  SEAM_ASSERT(variadic ? !types.empty()
                       : types.size() == d.outputs.size() || (optional_last && types.size() + 1 == d.outputs.size()));
  SEAM_ASSERT(!out_names || out_names->size() == types.size());
  for (auto& t : types)
    for (int64_t dim : t.shape)
      if (dim <= 0) ctx.fail("produces an empty or negative shape ", t.str());

  Node n{op, inputs, {}, std::move(full), name};
  auto node_index = static_cast<int>(nodes_.size());
  for (size_t i = 0; i < types.size(); ++i) {
    Value v;
    v.type = types[i];
    std::string role = variadic ? std::to_string(i) : d.outputs[i];
    if (role.ends_with("?")) role.pop_back();
    v.name = out_names ? (*out_names)[i] : i == 0 ? name : name + ":" + role;
    v.node = node_index;
    v.out_index = static_cast<int>(i);
    auto id = static_cast<ValueId>(values_.size());
    by_name_[v.name] = id;
    values_.push_back(std::move(v));
    n.out.push_back(id);
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().out;
}

void Graph::set_attr(int node, const std::string& name, AttrValue value) {
  Node& n = nodes_.at(static_cast<size_t>(node));
  if (!n.attrs.has(name)) fail(op_name(n.op), " node '", n.name, "' has no attribute '", name, "'");
  if (n.attrs.get(name).index() != value.index())
    fail(op_name(n.op), " node '", n.name, "': attribute '", name, "' must stay a ",
         attr_type_name(n.attrs.get(name)));
  n.attrs.set(name, std::move(value));
}

void Graph::verify() const {
  for (size_t k = 0; k < nodes_.size(); ++k) {
    const Node& n = nodes_[k];
    const OpDef& d = op_def(n.op);
    check_arity(d, n.in.size(), n.name);
    for (ValueId id : n.in) {
      if (id < 0 || static_cast<size_t>(id) >= values_.size())
        fail(d.name, " node '", n.name, "': operand ", id, " does not exist");
      const Value& v = value(id);
      if (v.node >= static_cast<int>(k))
        fail(d.name, " node '", n.name, "': uses ", describe(id), " before it is computed");
    }
    Attrs full = complete_attrs(d, n.attrs, n.name);
    if (!(full == n.attrs)) fail(d.name, " node '", n.name, "': attributes out of schema order");
    InferCtx ctx{*this, n.op, n.name, n.in, n.attrs};
    std::vector<TensorType> types = d.infer(ctx);
    tag_layouts(*this, n.op, n.in, n.attrs, types);
    if (types.size() != n.out.size()) ctx.fail("has ", n.out.size(), " outputs, schema says ", types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      const Value& v = value(n.out[i]);
      if (!(v.type == types[i]))
        ctx.fail("output ", i, " is recorded as ", v.type.str(), " but infers to ", types[i].str());
      if (v.node != static_cast<int>(k) || v.out_index != static_cast<int>(i))
        ctx.fail("output ", i, " is not linked back to its node");
    }
  }
}

}  // namespace seam
