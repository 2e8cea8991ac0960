// ONNX export (src/io/onnx_export.h): each seam op of the forward computation as ONNX
// nodes; the ops ONNX 17 lacks (attention, GELU, SiLU) written with the ones it has.
#include "io/onnx_export.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "common/file.h"
#include "io/model_file.h"
#include "onnx.pb.h"
#include "seam/model.h"
#include "train/trainer.h"

namespace seam::onnx {

namespace {

namespace P = ::onnx;

int32_t elem_of(DType t, const std::string& where) {
  switch (t) {
    case DType::f32: return P::TensorProto::FLOAT;
    case DType::f64: return P::TensorProto::DOUBLE;
    case DType::bf16: return P::TensorProto::BFLOAT16;
    case DType::f16: return P::TensorProto::FLOAT16;
    case DType::i32: return P::TensorProto::INT32;
    case DType::u8: return P::TensorProto::UINT8;
  }
  fail(where, ": no ONNX element type for ", dtype_name(t));
}

class Writer {
 public:
  Writer(const Graph& g, P::GraphProto& out) : g_(g), gp_(out) {}

  // The node for seam node n, its ONNX ops appended.
  void emit(const Node& n, int index);

  P::NodeProto* node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out) {
    P::NodeProto* p = gp_.add_node();
    p->set_op_type(op);
    p->set_name(out[0] + "/" + op);
    for (const std::string& i : in) p->add_input(i);
    for (const std::string& o : out) p->add_output(o);
    return p;
  }
  // A one-output node whose output is a fresh name derived from `base`.
  std::string op(const std::string& type, std::vector<std::string> in, const std::string& base) {
    const std::string out = fresh(base);
    node(type, std::move(in), {out});
    return out;
  }
  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int k = 2; used_.count(name) || g_.find(name); ++k) name = base + "_" + std::to_string(k);
    used_.insert(name);
    return name;
  }
  std::string ints(const std::vector<int64_t>& v, const std::string& base) {
    P::TensorProto* t = gp_.add_initializer();
    t->set_name(fresh(base));
    t->set_data_type(P::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(v.size()));
    for (int64_t x : v) t->add_int64_data(x);
    return t->name();
  }
  // A constant of the value's float dtype (f32 or f64), shape `shape`: a Constant node, not
  // an initializer, which an importer would take for a parameter to train.
  std::string floats(const std::vector<double>& v, const Shape& shape, DType t, const std::string& base) {
    const std::string name = fresh(base);
    P::NodeProto* n = node("Constant", {}, {name});
    auto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(P::AttributeProto::TENSOR);
    P::TensorProto* p = a->mutable_t();
    for (int64_t d : shape) p->add_dims(d);
    if (t == DType::f64) {
      p->set_data_type(P::TensorProto::DOUBLE);
      for (double x : v) p->add_double_data(x);
    } else if (t == DType::f32) {
      p->set_data_type(P::TensorProto::FLOAT);
      for (double x : v) p->add_float_data(static_cast<float>(x));
    } else {
      fail(where_, ": a constant operand in ", dtype_name(t), "; the export writes f32 and f64 ones");
    }
    return name;
  }
  std::string scalar(double v, DType t, const std::string& base) { return floats({v}, {}, t, base); }

 private:
  const std::string& name(ValueId v) const { return g_.value(v).name; }
  const TensorType& type(ValueId v) const { return g_.value(v).type; }
  // The last two dims of v swapped.
  std::string swap_last(ValueId v) {
    std::vector<int64_t> perm;
    for (size_t i = 0; i < type(v).shape.size(); ++i) perm.push_back(static_cast<int64_t>(i));
    std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
    const std::string t = op("Transpose", {name(v)}, name(v) + "/T");
    set(t, "perm", perm);
    return t;
  }
  // Attributes on the node that made `output`.
  P::NodeProto* maker(const std::string& output) {
    for (int i = gp_.node_size() - 1; i >= 0; --i)
      if (gp_.node(i).output(0) == output) return gp_.mutable_node(i);
    fail(where_, ": no node makes ", output);
  }
  void set(const std::string& output, const std::string& key, const std::vector<int64_t>& v) {
    auto* a = maker(output)->add_attribute();
    a->set_name(key);
    a->set_type(P::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  void set(const std::string& output, const std::string& key, int64_t v) {
    auto* a = maker(output)->add_attribute();
    a->set_name(key);
    a->set_type(P::AttributeProto::INT);
    a->set_i(v);
  }
  void setf(const std::string& output, const std::string& key, double v) {
    auto* a = maker(output)->add_attribute();
    a->set_name(key);
    a->set_type(P::AttributeProto::FLOAT);
    a->set_f(static_cast<float>(v));
  }
  void activation(const Node& n, const std::string& pre, const std::string& out);
  // softmax(q k^T scale + causal mask) v on [B, H, T, D] into `out`; the probabilities'
  // dropout is off (evaluation).
  void attend(const Node& n, const std::string& q, const std::string& k, const std::string& v, int64_t tq,
              int64_t tk, int64_t d, const std::string& out);

  const Graph& g_;
  P::GraphProto& gp_;
  std::set<std::string> used_;
  std::string where_;
};

void Writer::activation(const Node& n, const std::string& pre, const std::string& out) {
  const std::string act = n.attrs.s("activation");
  if (act == "relu") node("Relu", {pre}, {out});
  else if (act == "none") node("Identity", {pre}, {out});
  else fail(where_, ": activation '", act, "' has no ONNX form here");
}

void Writer::attend(const Node& n, const std::string& q, const std::string& k, const std::string& v, int64_t tq,
                    int64_t tk, int64_t d, const std::string& out) {
  const DType t = type(n.in[0]).dtype;
  const double s = n.attrs.f("scale") != 0 ? n.attrs.f("scale") : 1.0 / std::sqrt(static_cast<double>(d));
  const std::string kt = op("Transpose", {k}, out + "/kT");
  set(kt, "perm", {0, 1, 3, 2});
  std::string scores = op("Mul", {op("MatMul", {q, kt}, out + "/qk"), scalar(s, t, out + "/scale")}, out + "/scores");
  if (n.attrs.i("causal")) {
    std::vector<double> mask(static_cast<size_t>(tq * tk), 0.0);
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t j = i + 1; j < tk; ++j) mask[static_cast<size_t>(i * tk + j)] = -std::numeric_limits<double>::infinity();
    scores = op("Add", {scores, floats(mask, {tq, tk}, t, out + "/causal_mask")}, out + "/masked");
  }
  const std::string p = op("Softmax", {scores}, out + "/probs");
  set(p, "axis", -1);
  node("MatMul", {p, v}, {out});
}

void Writer::emit(const Node& n, int index) {
  where_ = "export: node " + std::to_string(index) + " '" + n.name + "' (" + op_name(n.op) + ")";
  const std::string y = name(n.out[0]);
  auto in = [&](size_t i) { return name(n.in[i]); };
  const DType t = type(n.out[0]).dtype;
  auto one = [&](const char* type_name) { node(type_name, {in(0)}, {y}); };
  auto two = [&](const char* type_name) { node(type_name, {in(0), in(1)}, {y}); };
  auto pads2 = [&](const char* key) {
    const auto& p = n.attrs.ints(key);
    return std::vector<int64_t>{p[0], p[1], p[0], p[1]};
  };
  switch (n.op) {
    case Op::relu: return one("Relu");
    case Op::sigmoid: return one("Sigmoid");
    case Op::tanh: return one("Tanh");
    case Op::exp: return one("Exp");
    case Op::log: return one("Log");
    case Op::sqrt: return one("Sqrt");
    case Op::neg: return one("Neg");
    case Op::abs: return one("Abs");
    case Op::erf: return one("Erf");
    case Op::copy: case Op::stop_gradient: case Op::dropout: return one("Identity");  // evaluation
    case Op::leaky_relu: one("LeakyRelu"); return setf(y, "alpha", n.attrs.f("alpha"));
    case Op::add: return two("Add");
    case Op::sub: return two("Sub");
    case Op::mul: return two("Mul");
    case Op::div: return two("Div");
    case Op::maximum: return two("Max");
    case Op::minimum: return two("Min");
    case Op::scale: node("Mul", {in(0), scalar(n.attrs.f("factor"), t, y + "/factor")}, {y}); return;
    case Op::pow: node("Pow", {in(0), scalar(n.attrs.f("exponent"), t, y + "/exponent")}, {y}); return;
    case Op::silu: node("Mul", {in(0), op("Sigmoid", {in(0)}, y + "/sigmoid")}, {y}); return;
    case Op::gelu: {  // x/2 (1 + erf(x / sqrt 2))
      const std::string e = op("Erf", {op("Mul", {in(0), scalar(M_SQRT1_2, t, y + "/c")}, y + "/xs")}, y + "/erf");
      const std::string h = op("Mul", {in(0), scalar(0.5, t, y + "/half")}, y + "/halfx");
      node("Mul", {h, op("Add", {e, scalar(1.0, t, y + "/one")}, y + "/1p")}, {y});
      return;
    }
    case Op::gelu_tanh: {  // x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const std::string x3 = op("Pow", {in(0), scalar(3.0, t, y + "/three")}, y + "/x3");
      const std::string inner =
          op("Add", {in(0), op("Mul", {x3, scalar(0.044715, t, y + "/k")}, y + "/kx3")}, y + "/inner");
      const std::string th =
          op("Tanh", {op("Mul", {inner, scalar(std::sqrt(2.0 / M_PI), t, y + "/c")}, y + "/scaled")}, y + "/tanh");
      const std::string h = op("Mul", {in(0), scalar(0.5, t, y + "/half")}, y + "/halfx");
      node("Mul", {h, op("Add", {th, scalar(1.0, t, y + "/one")}, y + "/1p")}, {y});
      return;
    }
    case Op::cast: node("Cast", {in(0)}, {y}); return set(y, "to", elem_of(t, where_));
    case Op::full: {
      const auto& s = type(n.out[0]).shape;
      node("ConstantOfShape", {ints(s, y + "/shape")}, {y});
      auto* a = maker(y)->add_attribute();
      a->set_name("value");
      a->set_type(P::AttributeProto::TENSOR);
      P::TensorProto* v = a->mutable_t();
      v->add_dims(1);
      v->set_data_type(elem_of(t, where_));
      if (t == DType::f64) v->add_double_data(n.attrs.f("value"));
      else if (t == DType::f32) v->add_float_data(static_cast<float>(n.attrs.f("value")));
      else if (t == DType::i32) v->add_int32_data(static_cast<int32_t>(n.attrs.f("value")));
      else fail(where_, ": a ", dtype_name(t), " fill; the export writes f32, f64 and i32 ones");
      return;
    }
    case Op::reshape: case Op::flatten:
      node("Reshape", {in(0), ints(type(n.out[0]).shape, y + "/shape")}, {y});
      return;
    case Op::broadcast_to: node("Expand", {in(0), ints(type(n.out[0]).shape, y + "/shape")}, {y}); return;
    case Op::transpose: one("Transpose"); return set(y, "perm", n.attrs.ints("perm"));
    case Op::concat: {
      std::vector<std::string> xs;
      for (ValueId v : n.in) xs.push_back(name(v));
      node("Concat", xs, {y});
      return set(y, "axis", n.attrs.i("axis"));
    }
    case Op::slice:
      node("Slice", {in(0), ints({n.attrs.i("start")}, y + "/starts"), ints({n.attrs.i("end")}, y + "/ends"),
                     ints({n.attrs.i("axis")}, y + "/axes"), ints({n.attrs.i("step")}, y + "/steps")},
           {y});
      return;
    case Op::softmax: one("Softmax"); return set(y, "axis", n.attrs.i("axis"));
    case Op::log_softmax: one("LogSoftmax"); return set(y, "axis", n.attrs.i("axis"));
    case Op::sum: case Op::mean: {
      const auto& axes = n.attrs.ints("axes");
      std::vector<std::string> args{in(0)};
      if (n.op == Op::sum && !axes.empty()) args.push_back(ints(axes, y + "/axes"));
      node(n.op == Op::sum ? "ReduceSum" : "ReduceMean", args, {y});
      if (n.op == Op::mean && !axes.empty()) set(y, "axes", axes);
      return set(y, "keepdims", n.attrs.i("keepdims"));
    }
    case Op::embedding: node("Gather", {in(1), in(0)}, {y}); return;
    case Op::matmul: {
      const std::string a = n.attrs.i("transpose_a") ? swap_last(n.in[0]) : in(0);
      const std::string b = n.attrs.i("transpose_b") ? swap_last(n.in[1]) : in(1);
      node("MatMul", {a, b}, {y});
      return;
    }
    case Op::linear: {
      if (type(n.in[0]).shape.size() == 2) {
        std::vector<std::string> args{in(0), in(1)};
        if (n.in.size() > 2) args.push_back(in(2));
        node("Gemm", args, {y});
        return set(y, "transB", 1);
      }
      const std::string mm = op("MatMul", {in(0), swap_last(n.in[1])}, y + "/matmul");
      node(n.in.size() > 2 ? "Add" : "Identity", n.in.size() > 2 ? std::vector{mm, in(2)} : std::vector{mm}, {y});
      return;
    }
    case Op::layer_norm: {
      node("LayerNormalization", {in(0), in(1), in(2)}, {y});
      set(y, "axis", -1);
      return setf(y, "epsilon", n.attrs.f("eps"));
    }
    case Op::batch_norm: {
      if (n.attrs.s("layout") != "nchw") fail(where_, ": a channels-last batch norm (the export writes NCHW)");
      const std::string bn = op("BatchNormalization", {in(0), in(1), in(2), in(3), in(4)}, y + "/bn");
      setf(bn, "epsilon", n.attrs.f("eps"));
      setf(bn, "momentum", 1.0 - n.attrs.f("momentum"));  // ONNX weighs the running value
      const std::string pre = n.in.size() > 5 ? op("Add", {bn, in(5)}, y + "/residual") : bn;
      return activation(n, pre, y);
    }
    case Op::conv2d: {
      if (n.attrs.s("layout") != "nchw") fail(where_, ": a channels-last convolution (the export writes NCHW)");
      std::vector<std::string> args{in(0), in(1)};
      if (n.in.size() > 2) args.push_back(in(2));
      const std::string c = op("Conv", args, y + "/conv");
      const Shape& w = type(n.in[1]).shape;
      set(c, "kernel_shape", {w[2], w[3]});
      set(c, "strides", n.attrs.ints("stride"));
      set(c, "pads", pads2("padding"));
      set(c, "dilations", n.attrs.ints("dilation"));
      set(c, "group", n.attrs.i("groups"));
      return activation(n, c, y);
    }
    case Op::max_pool2d: case Op::avg_pool2d: {
      if (n.attrs.s("layout") != "nchw") fail(where_, ": a channels-last pooling (the export writes NCHW)");
      one(n.op == Op::max_pool2d ? "MaxPool" : "AveragePool");
      const auto& k = n.attrs.ints("kernel");
      set(y, "kernel_shape", k);
      set(y, "strides", n.attrs.ints("stride").empty() ? k : n.attrs.ints("stride"));
      set(y, "pads", pads2("padding"));
      if (n.op == Op::avg_pool2d) set(y, "count_include_pad", n.attrs.i("count_include_pad"));
      return;
    }
    case Op::global_avg_pool:  // seam's is [N, C]; ONNX's [N, C, 1, 1]
      if (n.attrs.s("layout") != "nchw") fail(where_, ": a channels-last pooling (the export writes NCHW)");
      node("Reshape", {op("GlobalAveragePool", {in(0)}, y + "/pool"), ints(type(n.out[0]).shape, y + "/shape")}, {y});
      return;
    case Op::attention: {
      const Shape& q = type(n.in[0]).shape;
      attend(n, in(0), in(1), in(2), q[2], type(n.in[1]).shape[2], q[3], y);
      return;
    }
    case Op::attention_qkv: {  // qkv [B, T, 3, H, D]: q, k, v to [B, H, T, D], o back to [B, T, H, D]
      const Shape& p = type(n.in[0]).shape;
      std::string part[3];
      for (int i = 0; i < 3; ++i) {
        const std::string g = op("Gather", {in(0), ints({i}, y + "/index")}, y + "/part");
        const std::string sq = op("Squeeze", {g, ints({2}, y + "/axis")}, y + "/part");
        part[i] = op("Transpose", {sq}, y + "/heads");
        set(part[i], "perm", {0, 2, 1, 3});
        set(g, "axis", 2);
      }
      const std::string o = fresh(y + "/o");
      attend(n, part[0], part[1], part[2], p[1], p[1], p[4], o);
      node("Transpose", {o}, {y});
      set(y, "perm", {0, 2, 1, 3});
      return;
    }
    default: fail(where_, ": no ONNX form for this op in the export");
  }
}

}  // namespace

std::string export_onnx(const Graph& g, ValueId output, const std::vector<HostTensor>& values,
                        const std::string& output_name) {
  // The nodes the output needs, in the graph's (topological) order.
  std::vector<bool> needed(g.nodes().size(), false), read(g.values().size(), false);
  std::vector<ValueId> stack{output};
  while (!stack.empty()) {
    const ValueId v = stack.back();
    stack.pop_back();
    if (read[static_cast<size_t>(v)]) continue;
    read[static_cast<size_t>(v)] = true;
    const int k = g.value(v).node;
    if (k < 0 || needed[static_cast<size_t>(k)]) continue;
    needed[static_cast<size_t>(k)] = true;
    for (ValueId i : g.nodes()[static_cast<size_t>(k)].in) stack.push_back(i);
  }
  P::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("seam");
  m.add_opset_import()->set_version(17);
  P::GraphProto& gp = *m.mutable_graph();
  gp.set_name("seam");
  std::map<std::string, const HostTensor*> by_name;
  for (const HostTensor& h : values) by_name[h.name] = &h;
  auto type_of = [&](P::ValueInfoProto* info, ValueId v) {
    const TensorType& t = g.value(v).type;
    auto* tt = info->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem_of(t.dtype, "export: value '" + g.value(v).name + "'"));
    tt->mutable_shape();
    for (int64_t d : t.shape) tt->mutable_shape()->add_dim()->set_dim_value(d);
  };
  for (size_t i = 0; i < g.values().size(); ++i) {
    const Value& v = g.values()[i];
    if (!read[i] || v.kind == ValueKind::intermediate) continue;
    if (v.kind == ValueKind::input) {
      P::ValueInfoProto* info = gp.add_input();
      info->set_name(v.name);
      type_of(info, static_cast<ValueId>(i));
      continue;
    }
    auto it = by_name.find(v.name);
    if (it == by_name.end()) fail("export: no value given for the ", v.kind == ValueKind::param ? "parameter" : "state value",
                                  " '", v.name, "'");
    const HostTensor& h = *it->second;
    if (h.type.dtype != v.type.dtype || h.type.shape != v.type.shape)
      fail("export: '", v.name, "' is ", h.type.str(), ", the graph's is ", v.type.str());
    P::TensorProto* t = gp.add_initializer();
    t->set_name(v.name);
    t->set_data_type(elem_of(v.type.dtype, "export: '" + v.name + "'"));
    for (int64_t d : v.type.shape) t->add_dims(d);
    t->set_raw_data(std::string(reinterpret_cast<const char*>(h.data.data()), h.data.size()));
  }
  Writer w(g, gp);
  for (size_t k = 0; k < g.nodes().size(); ++k)
    if (needed[k]) w.emit(g.nodes()[k], static_cast<int>(k));
  if (g.value(output).node < 0) fail("export: the output '", g.value(output).name, "' is computed by no node");
  std::string out = g.value(output).name;
  if (out != output_name && !g.find(output_name)) {
    w.node("Identity", {out}, {output_name});
    out = output_name;
  }
  P::ValueInfoProto* info = gp.add_output();
  info->set_name(out);
  type_of(info, output);
  return m.SerializeAsString();
}

int run_export(const ExportOptions& o) {
  if (o.model.empty() && o.checkpoint.empty()) fail("export: give a model file, a checkpoint, or both");
  io::ModelSpec spec;
  std::vector<HostTensor> stored;
  if (!o.checkpoint.empty()) {
    auto [s, tensors] = train::read_checkpoint_model(
        o.checkpoint, o.model.empty() ? std::nullopt : std::optional<std::string>(o.model));
    spec = std::move(s);
    stored = std::move(tensors);
  } else {
    spec = io::load_model_spec(o.model);
  }
  const io::BuiltGraph bg = io::build_graph(spec, o.batch);
  Model model(bg.graph, {.seed = spec.seed});
  io::load_initial(model, bg);
  if (!stored.empty()) {
    try {
      model.load_tensors(stored);
    } catch (const Error& e) {
      fail(o.checkpoint, " does not fit ", spec.source, ": ", e.what());
    }
  }
  const std::string bytes = export_onnx(bg.graph, bg.logits, model.save_tensors());
  write_file_atomically(o.out, std::as_bytes(std::span(bytes)));
  const TensorType &x = bg.graph.value(bg.x).type, &y = bg.graph.value(bg.logits).type;
  std::printf("export: %s -> %s (ONNX opset 17; x %s -> logits %s; %s)\n", spec.source.c_str(), o.out.c_str(),
              x.str().c_str(), y.str().c_str(),
              o.checkpoint.empty() ? "initial values" : ("values of " + o.checkpoint).c_str());
  return 0;
}

}  // namespace seam::onnx
