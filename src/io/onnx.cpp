// The ONNX importer's driver (src/io/onnx.h): the protobuf read, tensors, the graph's
// inputs, initializers and outputs, and one node at a time through the op table.
#include "io/onnx.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "common/half.h"
#include "io/onnx_import.h"

namespace seam::onnx {

namespace detail {

namespace T = ::onnx;

std::optional<DType> dtype_of(int32_t elem) {
  switch (elem) {
    case T::TensorProto::FLOAT: return DType::f32;
    case T::TensorProto::DOUBLE: return DType::f64;
    case T::TensorProto::FLOAT16: return DType::f16;
    case T::TensorProto::BFLOAT16: return DType::bf16;
    case T::TensorProto::INT64: case T::TensorProto::INT32: case T::TensorProto::INT16:
    case T::TensorProto::INT8: case T::TensorProto::UINT16: case T::TensorProto::UINT32:
    case T::TensorProto::UINT64:
      return DType::i32;  // each value checked to fit (host_tensor)
    case T::TensorProto::BOOL: case T::TensorProto::UINT8: return DType::u8;
    default: return std::nullopt;
  }
}

const char* elem_name(int32_t elem) {
  return T::TensorProto::DataType_IsValid(elem)
             ? T::TensorProto::DataType_Name(static_cast<T::TensorProto::DataType>(elem)).c_str()
             : "an unknown element type";
}

std::vector<int64_t> Const::ints() const {
  // INT64_MAX (an exporter's "to the end") is 2^63 as a double, one past what int64 holds:
  // saturate rather than convert out of range.
  constexpr double kLimit = 9223372036854775808.0;
  std::vector<int64_t> r;
  for (double x : v)
    r.push_back(x >= kLimit ? std::numeric_limits<int64_t>::max()
                : x <= -kLimit ? std::numeric_limits<int64_t>::min()
                               : static_cast<int64_t>(x));
  return r;
}

namespace {

size_t elem_bytes(int32_t elem) {
  switch (elem) {
    case T::TensorProto::DOUBLE: case T::TensorProto::INT64: case T::TensorProto::UINT64: return 8;
    case T::TensorProto::FLOAT: case T::TensorProto::INT32: case T::TensorProto::UINT32: return 4;
    case T::TensorProto::FLOAT16: case T::TensorProto::BFLOAT16: case T::TensorProto::INT16:
    case T::TensorProto::UINT16:
      return 2;
    case T::TensorProto::INT8: case T::TensorProto::UINT8: case T::TensorProto::BOOL: return 1;
    default: return 0;
  }
}

// Element i of little-endian raw bytes of type elem, as a double.
double raw_value(const std::string& raw, size_t i, int32_t elem) {
  const char* p = raw.data() + i * elem_bytes(elem);
  auto load = [&]<class U>(U) {
    U u;
    std::memcpy(&u, p, sizeof u);
    return u;
  };
  switch (elem) {
    case T::TensorProto::FLOAT: return load(float{});
    case T::TensorProto::DOUBLE: return load(double{});
    case T::TensorProto::INT64: return static_cast<double>(load(int64_t{}));
    case T::TensorProto::UINT64: return static_cast<double>(load(uint64_t{}));
    case T::TensorProto::INT32: return load(int32_t{});
    case T::TensorProto::UINT32: return load(uint32_t{});
    case T::TensorProto::INT16: return load(int16_t{});
    case T::TensorProto::UINT16: return load(uint16_t{});
    case T::TensorProto::INT8: return load(int8_t{});
    case T::TensorProto::UINT8: case T::TensorProto::BOOL: return load(uint8_t{});
    case T::TensorProto::FLOAT16: return half_to_float(load(uint16_t{}), DType::f16);
    case T::TensorProto::BFLOAT16: return half_to_float(load(uint16_t{}), DType::bf16);
    default: return 0;
  }
}

}  // namespace

Const const_of(const T::TensorProto& t, const std::string& where) {
  Const c;
  c.elem = t.data_type();
  for (int64_t d : t.dims()) {
    if (d < 0) fail(where, ": tensor '", t.name(), "' has a negative dimension ", d);
    c.shape.push_back(d);
  }
  if (t.data_location() == T::TensorProto::EXTERNAL || t.external_data_size() > 0)
    fail(where, ": tensor '", t.name(), "' keeps its data in an external file, which seam does not read");
  if (elem_bytes(c.elem) == 0)
    fail(where, ": tensor '", t.name(), "' holds ", elem_name(c.elem), ", which seam does not take");
  int64_t n = 1;
  for (int64_t d : c.shape) {
    if (d > 0 && n > std::numeric_limits<int64_t>::max() / d) fail(where, ": tensor '", t.name(), "' is too large");
    n *= d;
  }
  const size_t count = static_cast<size_t>(n);
  if (t.has_raw_data()) {
    if (count > t.raw_data().size() / elem_bytes(c.elem) || t.raw_data().size() != count * elem_bytes(c.elem))
      fail(where, ": tensor '", t.name(), "' has ", t.raw_data().size(), " bytes of raw data for ", count, " ",
           elem_name(c.elem), " values");
    c.v.reserve(count);
    for (size_t i = 0; i < count; ++i) c.v.push_back(raw_value(t.raw_data(), i, c.elem));
    return c;
  }
  auto take = [&](const auto& field, const char* name) {
    if (static_cast<size_t>(field.size()) != count)
      fail(where, ": tensor '", t.name(), "' has ", field.size(), " values in ", name, " for ", count, " elements");
    c.v.reserve(count);
    for (auto x : field) c.v.push_back(static_cast<double>(x));
  };
  switch (c.elem) {
    case T::TensorProto::FLOAT: take(t.float_data(), "float_data"); break;
    case T::TensorProto::DOUBLE: take(t.double_data(), "double_data"); break;
    case T::TensorProto::INT64: take(t.int64_data(), "int64_data"); break;
    case T::TensorProto::UINT64: case T::TensorProto::UINT32: take(t.uint64_data(), "uint64_data"); break;
    case T::TensorProto::FLOAT16: case T::TensorProto::BFLOAT16:
      take(t.int32_data(), "int32_data");
      for (double& x : c.v) x = half_to_float(static_cast<uint16_t>(x), c.elem == T::TensorProto::FLOAT16 ? DType::f16 : DType::bf16);
      break;
    default: take(t.int32_data(), "int32_data"); break;
  }
  return c;
}

double value_at(const std::vector<std::byte>& data, DType t, size_t i) {
  const std::byte* p = data.data() + i * dtype_size(t);
  auto load = [&]<class U>(U) {
    U u;
    std::memcpy(&u, p, sizeof u);
    return u;
  };
  switch (t) {
    case DType::f32: return load(float{});
    case DType::f64: return load(double{});
    case DType::f16: case DType::bf16: return half_to_float(load(uint16_t{}), t);
    case DType::i32: return load(int32_t{});
    case DType::u8: return load(uint8_t{});
  }
  return 0;
}

Const const_of(const HostTensor& h, int32_t elem) {
  Const c{h.type.shape, {}, elem};
  const size_t n = static_cast<size_t>(numel(h.type.shape));
  for (size_t i = 0; i < n; ++i) c.v.push_back(value_at(h.data, h.type.dtype, i));
  return c;
}

HostTensor host_tensor(const Const& c, const std::string& name, const std::string& where) {
  const std::optional<DType> dt = dtype_of(c.elem);
  if (!dt) fail(where, ": '", name, "' holds ", elem_name(c.elem), ", which seam keeps in no dtype");
  HostTensor h{name, TensorType{*dt, c.shape}, {}};
  h.data.resize(c.v.size() * dtype_size(*dt));
  std::byte* p = h.data.data();
  for (size_t i = 0; i < c.v.size(); ++i) {
    const double x = c.v[i];
    switch (*dt) {
      case DType::f32: {
        const float f = static_cast<float>(x);
        std::memcpy(p + 4 * i, &f, 4);
        break;
      }
      case DType::f64: std::memcpy(p + 8 * i, &x, 8); break;
      case DType::f16: case DType::bf16: {
        const uint16_t b = float_to_half(static_cast<float>(x), *dt);
        std::memcpy(p + 2 * i, &b, 2);
        break;
      }
      case DType::i32: {
        if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max())
          fail(where, ": '", name, "' holds ", x, ", outside the 32-bit integers seam keeps ", elem_name(c.elem), " in");
        const auto v = static_cast<int32_t>(x);
        std::memcpy(p + 4 * i, &v, 4);
        break;
      }
      case DType::u8: p[i] = static_cast<std::byte>(static_cast<uint8_t>(x)); break;
    }
  }
  return h;
}

Var Importer::var(const std::string& name, const std::string& where) {
  if (auto it = vars.find(name); it != vars.end()) return it->second;
  auto c = consts.find(name);
  if (c == consts.end()) fail(where, ": reads '", name, "', which no earlier node, input or initializer makes");
  HostTensor h = host_tensor(c->second, name, where);
  const bool train = trainable(name);
  std::string seam_name = name;
  for (int k = 2; g.find(seam_name); ++k) seam_name = name + "_" + std::to_string(k);
  h.name = seam_name;
  Var v = train ? g.param(seam_name, h.type.shape, Init::zeros(), true, h.type.dtype)
                    : g.state(seam_name, h.type.shape, Init::zeros(), h.type.dtype);
  initial->push_back(std::move(h));
  vars.emplace(name, v);
  return v;
}

bool Importer::trainable(const std::string& name) const {
  auto c = consts.find(name);
  if (c == consts.end() || !initializers.count(name) || !differentiable.count(name)) return false;
  const std::optional<DType> t = dtype_of(c->second.elem);
  if (!t || !is_float(*t) || options.freeze) return false;
  return std::none_of(options.freeze_prefixes.begin(), options.freeze_prefixes.end(),
                      [&](const std::string& prefix) { return name.starts_with(prefix); });
}

NodeCtx::NodeCtx(Importer& i, const T::NodeProto& n, int index)
    : imp(i),
      node(n),
      where(i.source + ": " + (n.name().empty() ? "node #" + std::to_string(index) : "node '" + n.name() + "'") + " (" +
            n.op_type() + ")") {}

Var NodeCtx::in(size_t i) {
  if (!has(i)) fail("input ", i, " is missing");
  return imp.var(node.input(static_cast<int>(i)), where);
}

const Const* NodeCtx::maybe_const(size_t i) const {
  if (!has(i)) return nullptr;
  auto it = imp.consts.find(node.input(static_cast<int>(i)));
  return it == imp.consts.end() ? nullptr : &it->second;
}

const Const& NodeCtx::const_in(size_t i, const char* what) {
  const Const* c = maybe_const(i);
  if (!c) fail(what, " (input ", i, ") must be a constant (an initializer or a Constant node's value): seam's shapes are static");
  return *c;
}

namespace {
const T::AttributeProto* find_attr(const T::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}
}  // namespace

bool NodeCtx::has_attr(const std::string& name) const { return find_attr(node, name) != nullptr; }
int64_t NodeCtx::i(const std::string& name, int64_t def) const {
  const auto* a = find_attr(node, name);
  return a ? a->i() : def;
}
double NodeCtx::f(const std::string& name, double def) const {
  const auto* a = find_attr(node, name);
  return a ? a->f() : def;
}
std::string NodeCtx::s(const std::string& name, const std::string& def) const {
  const auto* a = find_attr(node, name);
  return a ? a->s() : def;
}
std::vector<int64_t> NodeCtx::ints(const std::string& name, std::vector<int64_t> def) const {
  const auto* a = find_attr(node, name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : def;
}
std::vector<double> NodeCtx::floats(const std::string& name) const {
  const auto* a = find_attr(node, name);
  return a ? std::vector<double>(a->floats().begin(), a->floats().end()) : std::vector<double>{};
}
const T::TensorProto* NodeCtx::tensor_attr(const std::string& name) const {
  const auto* a = find_attr(node, name);
  return a && a->has_t() ? &a->t() : nullptr;
}

void NodeCtx::out(size_t i, Var v) {
  if (!wants(i)) return;
  imp.vars[node.output(static_cast<int>(i))] = v;
}
void NodeCtx::out_const(size_t i, Const c) {
  if (!wants(i)) return;
  imp.consts[node.output(static_cast<int>(i))] = std::move(c);
}

}  // namespace detail

namespace {

using namespace detail;
namespace T = ::onnx;

// A graph input's type: its dtype and its shape, symbolic dims bound by the options.
TensorType input_type(const T::ValueInfoProto& v, const OnnxOptions& o, const std::string& where) {
  if (!v.type().has_tensor_type()) fail(where, ": input '", v.name(), "' is not a tensor");
  const auto& tt = v.type().tensor_type();
  const std::optional<DType> dt = dtype_of(tt.elem_type());
  if (!dt) fail(where, ": input '", v.name(), "' holds ", elem_name(tt.elem_type()), ", which seam keeps in no dtype");
  if (auto it = o.input_shapes.find(v.name()); it != o.input_shapes.end()) {
    if (tt.has_shape() && static_cast<size_t>(tt.shape().dim_size()) != it->second.size())
      fail(where, ": input '", v.name(), "' has rank ", tt.shape().dim_size(), ", --input-shape gives ",
           shape_str(it->second));
    return {*dt, it->second};
  }
  if (!tt.has_shape()) fail(where, ": input '", v.name(), "' has no shape: bind it with --input-shape ", v.name(), "=...");
  Shape s;
  for (const auto& d : tt.shape().dim()) {
    if (!d.has_dim_value() || d.dim_value() < 0)
      fail(where, ": input '", v.name(), "' has a symbolic dimension '", d.dim_param(), "': bind it with --input-shape ",
           v.name(), "=", "N1xN2x...");
    s.push_back(d.dim_value());
  }
  return {*dt, s};
}

// The values a gradient reaches from the graph's outputs, walking the nodes backwards
// through their differentiable inputs only. A float initializer outside this set (an
// attention mask compared with 0, position indices) is a constant, not a parameter: no
// loss could train it, and a comparison or index needs it folded.
std::set<std::string> differentiable_values(const T::GraphProto& g) {
  // Per op type, the inputs that carry no gradient (indices, shapes, conditions, axes);
  // -1: all of them.
  static const std::map<std::string, std::vector<int>> kNone = {
      {"Shape", {-1}}, {"Size", {-1}}, {"Equal", {-1}}, {"Less", {-1}}, {"LessOrEqual", {-1}},
      {"Greater", {-1}}, {"GreaterOrEqual", {-1}}, {"And", {-1}}, {"Or", {-1}}, {"Xor", {-1}},
      {"Not", {-1}}, {"IsNaN", {-1}}, {"IsInf", {-1}}, {"ArgMax", {-1}}, {"ArgMin", {-1}},
      {"NonZero", {-1}}, {"ConstantOfShape", {-1}}, {"Range", {-1}}, {"EyeLike", {-1}}, {"Mod", {-1}},
      {"OneHot", {-1}}, {"Where", {0}}, {"Gather", {1}}, {"GatherElements", {1}}, {"GatherND", {1}},
      {"Slice", {1, 2, 3, 4}}, {"Reshape", {1}}, {"Expand", {1}}, {"Tile", {1}}, {"Squeeze", {1}},
      {"Unsqueeze", {1}}, {"Split", {1}}, {"Pad", {1, 3}}, {"Resize", {1, 2, 3}}, {"Upsample", {1}},
      {"TopK", {1}}, {"ReduceSum", {1}}, {"ReduceMean", {1}}, {"ReduceMax", {1}}, {"ReduceMin", {1}},
      {"ReduceProd", {1}}, {"ReduceL1", {1}}, {"ReduceL2", {1}}, {"ReduceLogSumExp", {1}},
      {"ReduceSumSquare", {1}}, {"Dropout", {1, 2}}, {"CumSum", {1}}, {"Trilu", {1}}};
  std::set<std::string> reached;
  for (const auto& v : g.output()) reached.insert(v.name());
  for (int k = g.node_size() - 1; k >= 0; --k) {
    const T::NodeProto& n = g.node(k);
    if (std::none_of(n.output().begin(), n.output().end(), [&](const std::string& o) { return reached.count(o); }))
      continue;
    const auto none = kNone.find(n.op_type());
    for (int i = 0; i < n.input_size(); ++i) {
      if (none != kNone.end() &&
          std::any_of(none->second.begin(), none->second.end(), [&](int j) { return j == -1 || j == i; }))
        continue;
      reached.insert(n.input(i));
    }
  }
  return reached;
}

}  // namespace

OnnxImport import_onnx_bytes(std::span<const std::byte> bytes, const std::string& where, const OnnxOptions& o) {
  T::ModelProto m;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    fail(where, ": not an ONNX model (its protobuf does not parse)");
  OnnxImport r;
  for (const auto& op : m.opset_import())
    if (op.domain().empty() || op.domain() == "ai.onnx") r.opset = op.version();
  if (r.opset == 0) r.opset = m.opset_import_size() == 0 ? 1 : 0;
  if (r.opset < 1 || r.opset > 21)
    fail(where, ": opset ", r.opset, " of the default domain; seam imports opsets 1 to 21");
  r.producer = m.producer_name() + (m.producer_version().empty() ? "" : " " + m.producer_version());
  const T::GraphProto& gp = m.graph();
  Importer imp{r.graph, o, r.opset};
  imp.initial = &r.initial;
  imp.source = where;
  imp.differentiable = differentiable_values(gp);
  for (const auto& n : gp.node())
    for (const auto& o : n.output()) imp.producer[o] = &n;
  for (const auto& n : gp.node())
    for (const auto& i : n.input()) ++imp.readers[i];
  for (const auto& o : gp.output()) ++imp.readers[o.name()];
  for (const auto& t : gp.initializer()) {
    imp.consts[t.name()] = const_of(t, where + ": initializer '" + t.name() + "'");
    imp.initializers.insert(t.name());
  }
  for (const auto& v : gp.input()) {
    if (imp.initializers.count(v.name())) continue;  // an initializer's default, in older files
    if (auto it = o.values.find(v.name()); it != o.values.end()) {
      const int32_t elem = v.type().has_tensor_type() ? v.type().tensor_type().elem_type() : T::TensorProto::FLOAT;
      imp.consts[v.name()] = const_of(it->second, elem);
      continue;
    }
    const TensorType t = input_type(v, o, where);
    const auto renamed = o.input_names.find(v.name());
    imp.vars.emplace(v.name(), r.graph.input(renamed == o.input_names.end() ? v.name() : renamed->second, t.shape, t.dtype));
    r.inputs.push_back(v.name());
  }
  for (const auto& [name, shape] : o.input_shapes)
    if (!imp.vars.count(name)) fail(where, ": --input-shape names '", name, "', which is no input of the graph");
  for (const auto& [name, seam_name] : o.input_names)
    if (!imp.vars.count(name)) fail(where, ": no graph input is named '", name, "'");
  for (const auto& [name, value] : o.values)
    if (!imp.consts.count(name)) fail(where, ": a value is given for '", name, "', which is no input of the graph");
  const auto& table = op_importers();
  for (int k = 0; k < gp.node_size(); ++k) {
    const T::NodeProto& n = gp.node(k);
    NodeCtx c(imp, n, k);
    if (!n.domain().empty() && n.domain() != "ai.onnx")
      c.fail("its domain '", n.domain(), "' is not ONNX's default one, the only one seam imports");
    auto it = table.find(n.op_type());
    if (it == table.end()) c.fail("seam has no import for the op type ", n.op_type());
    it->second(c);
    for (size_t i = 0; i < c.outputs(); ++i)
      if (c.wants(i) && !imp.vars.count(n.output(static_cast<int>(i))) && !imp.consts.count(n.output(static_cast<int>(i))))
        c.fail("output ", i, " ('", n.output(static_cast<int>(i)), "') is not produced by seam's import");
  }
  for (const std::string& prefix : o.freeze_prefixes)
    if (std::none_of(imp.initializers.begin(), imp.initializers.end(),
                     [&](const std::string& name) { return name.starts_with(prefix); }))
      fail(where, ": freeze names '", prefix, "', which begins no initializer's name");
  for (const auto& v : gp.output()) {
    Var out = imp.var(v.name(), where + ": graph output");
    // An output no node makes (an input, a constant) is copied, so that a program can read it.
    if (r.graph.value(out.id()).kind != ValueKind::intermediate) out = copy(out);
    r.outputs.push_back(r.graph.value(out.id()).name);
    r.output_names.push_back(v.name());
  }
  return r;
}

OnnxImport import_onnx(const std::string& path, const OnnxOptions& o) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open the file");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return import_onnx_bytes(std::as_bytes(std::span(bytes)), path, o);
}

void load_initial(Model& model, const OnnxImport& imported) {
  for (const HostTensor& h : imported.initial) {
    if (model.layout().param(h.name)) model.write_param(h.name, h.data);
    else model.write_state(h.name, h.data);
  }
}

HostTensor read_tensor_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open the file");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  T::TensorProto t;
  if (!t.ParseFromString(bytes)) fail(path, ": not a serialized ONNX TensorProto");
  return host_tensor(const_of(t, path), t.name(), path);
}

}  // namespace seam::onnx
