// The precision pass and the folding of its casts (src/passes/precision.h).
#include "passes/precision.h"

#include <map>

#include "ops/registry.h"
#include "ops/shapes.h"

namespace seam {

namespace {

// gemm: reads and writes the policy's dtype. f32: computes in f32 and reads any float
// dtype. follow: computes in its operands' widest dtype. keep: untouched (casts the user
// wrote, constants, integer ops, accumulators of f32 state).
enum class Kind { gemm, f32, follow, keep };

Kind kind_of(Op op) {
  switch (op) {
    case Op::matmul: case Op::linear: case Op::conv2d: case Op::attention: case Op::attention_qkv:
      return Kind::gemm;
    case Op::softmax: case Op::log_softmax: case Op::cross_entropy: case Op::mse: case Op::layer_norm:
    case Op::batch_norm: case Op::sum: case Op::mean:
      return Kind::f32;
    case Op::cast: case Op::full: case Op::argmax: case Op::count_equal: case Op::accumulate: return Kind::keep;
    default: return Kind::follow;
  }
}

// The longest override covering a node (its name, or a scope above it), or null.
const PrecisionOverride* override_for(const std::string& node, const std::vector<PrecisionOverride>& overrides) {
  const PrecisionOverride* best = nullptr;
  for (const PrecisionOverride& o : overrides) {
    const bool covers = node == o.node || (node.size() > o.node.size() && node.compare(0, o.node.size(), o.node) == 0 &&
                                           node[o.node.size()] == '/');
    if (covers && (!best || o.node.size() > best->node.size())) best = &o;
  }
  return best;
}

int rank(DType t) { return t == DType::f64 ? 3 : t == DType::f32 ? 2 : 1; }

// The wider of two float dtypes; bf16 and f16 meet in f32.
DType widest(DType a, DType b) {
  if (a == b) return a;
  if (rank(a) == rank(b)) return DType::f32;
  return rank(a) > rank(b) ? a : b;
}

bool has_float_io(const Node& n, const Graph& g) {
  for (const auto* list : {&n.in, &n.out})
    for (ValueId v : *list)
      if (is_float(g.value(v).type.dtype)) return true;
  return false;
}

// Adds node n of g to ng with new operands and attributes, keeping its names.
std::vector<ValueId> emit(Graph& ng, const Graph& g, const Node& n, const std::vector<ValueId>& in, const Attrs& attrs) {
  if (n.out.empty()) return ng.add_named(n.op, in, attrs, n.name);
  std::vector<std::string> names;
  for (ValueId v : n.out) names.push_back(g.value(v).name);
  return ng.add_named(n.op, in, attrs, names);
}

}  // namespace

FuseResult params_in(const Graph& g, DType low) {
  FuseResult r;
  r.map.assign(g.values().size(), -1);
  Graph& ng = r.graph;
  for (size_t v = 0; v < g.values().size(); ++v) {
    const Value& val = g.values()[v];
    if (val.kind == ValueKind::input) r.map[v] = ng.input(val.name, val.type.shape, val.type.dtype).id();
    if (val.kind == ValueKind::state) r.map[v] = ng.state(val.name, val.type.shape, val.init, val.type.dtype).id();
    if (val.kind != ValueKind::param) continue;
    Var p = ng.param(val.name, val.type.shape, val.init, val.decay, is_float(val.type.dtype) ? low : val.type.dtype);
    r.map[v] = p.dtype() == val.type.dtype
                   ? p.id()
                   : ng.add_named(Op::cast, {p.id()}, {{"dtype", std::string(dtype_name(val.type.dtype))}},
                                  val.name + "." + dtype_name(val.type.dtype)).at(0);
  }
  for (const Node& n : g.nodes()) {
    std::vector<ValueId> in;
    for (ValueId v : n.in) in.push_back(mapped(r, v));
    auto out = emit(ng, g, n, in, n.attrs);
    for (size_t i = 0; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
  }
  return r;
}

void check_overrides(const Graph& g, const std::vector<PrecisionOverride>& overrides) {
  for (const PrecisionOverride& o : overrides) {
    if (o.precision == Precision::tf32)
      fail("precision override '", o.node, "': tf32 is a policy for a whole model's f32 GEMMs and convolutions; a node or layer takes f32, bf16 or f16");
    bool any = false, has = false;
    std::string why;
    for (const Node& n : g.nodes()) {
      if (override_for(n.name, {o}) == nullptr) continue;
      any = true;
      const Kind k = kind_of(n.op);
      if (!has_float_io(n, g)) {
        why = std::string(op_name(n.op)) + " node '" + n.name + "' has no floating-point operands";
      } else if (low_dtype(o.precision) && (k == Kind::f32 || k == Kind::keep)) {
        why = std::string(op_name(n.op)) + " node '" + n.name + "' computes in " +
              (k == Kind::f32 ? "f32 at every precision" : "the dtypes it was given");
      } else {
        has = true;
      }
    }
    if (!any) fail("precision override '", o.node, "': the graph has no node or scope of that name");
    if (!has) fail("precision override '", o.node, "' (", precision_name(o.precision), "): ", why);
  }
}

FuseResult apply_precision(const Graph& g, Precision policy, const std::vector<PrecisionOverride>& overrides) {
  check_overrides(g, overrides);
  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  std::map<std::pair<ValueId, DType>, ValueId> casts;  // new value, dtype -> its cast
  // One cast per value and dtype, named after the value: "fc1.weight.bf16".
  auto as = [&](ValueId v, DType t) {
    if (ng.value(v).type.dtype == t) return v;
    // A value widened from t by a cast goes back to t exactly: read the original.
    if (const int k = ng.value(v).node; k >= 0 && ng.node(k).op == Op::cast) {
      const ValueId u = ng.node(k).in[0];
      if (ng.value(u).type.dtype == t && is_float(t) && rank(ng.value(v).type.dtype) > rank(t)) return u;
    }
    auto [it, fresh] = casts.try_emplace({v, t}, -1);
    if (fresh) {
      std::string name = ng.value(v).name + "." + dtype_name(t);
      for (int k = 2; ng.find(name); ++k) name = ng.value(v).name + "." + dtype_name(t) + "_" + std::to_string(k);
      it->second = ng.add_named(Op::cast, {v}, {{"dtype", std::string(dtype_name(t))}}, name).at(0);
      ++r.forward;
    }
    return it->second;
  };
  for (const Node& n : g.nodes()) {
    const PrecisionOverride* o = override_for(n.name, overrides);
    const Precision p = o ? o->precision : policy;
    const std::optional<DType> low = low_dtype(p);
    std::vector<ValueId> in;
    for (ValueId v : n.in) in.push_back(mapped(r, v));
    auto is_f = [&](size_t i) { return is_float(ng.value(in[i]).type.dtype); };
    auto type = [&](size_t i) { return ng.value(in[i]).type.dtype; };
    Attrs attrs = n.attrs;
    switch (kind_of(n.op)) {
      case Kind::gemm:
        for (size_t i = 0; i < in.size(); ++i)
          if (is_f(i)) in[i] = as(in[i], low ? *low : widest(compute_dtype(type(i)), DType::f32));
        break;
      case Kind::follow: {
        std::optional<DType> t;
        for (size_t i = 0; i < in.size(); ++i) {
          if (!is_f(i)) continue;
          // A parameter, or one stored in 16 bits and read through its cast (params_in).
          const Value& val = ng.value(in[i]);
          const bool param = val.kind == ValueKind::param ||
                             (val.node >= 0 && ng.node(val.node).op == Op::cast &&
                              ng.value(ng.node(val.node).in[0]).kind == ValueKind::param);
          const DType d = param && low ? *low : type(i);
          t = t ? widest(*t, d) : d;
        }
        for (size_t i = 0; i < in.size(); ++i)
          if (is_f(i)) in[i] = as(in[i], *t);
        break;
      }
      case Kind::f32:
        if (n.op == Op::mse) {
          const DType t = widest(type(0), type(1));
          in[0] = as(in[0], t), in[1] = as(in[1], t);
        } else if (n.op == Op::layer_norm || n.op == Op::batch_norm) {
          // gamma, beta (and running statistics) in x's dtype or the one it computes in;
          // batch norm's residual z (input 5) in x's.
          for (size_t i = 1; i < in.size(); ++i)
            if (n.op == Op::batch_norm && i == 5)
              in[i] = as(in[i], type(0));
            else if (type(i) != type(0) && type(i) != compute_dtype(type(0)))
              in[i] = as(in[i], compute_dtype(type(0)));
        } else if ((n.op == Op::sum || n.op == Op::mean) && attrs.s("dtype").empty() && is_half(type(0))) {
          attrs.set("dtype", std::string("f32"));
        }
        break;
      case Kind::keep: break;
    }
    auto out = emit(ng, g, n, in, attrs);
    for (size_t i = 0; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
  }
  return r;
}

FuseResult fold_casts(const Graph& g, const std::vector<ValueId>& keep) {
  const auto& nodes = g.nodes();
  std::vector<std::vector<int>> users(g.values().size());
  for (size_t k = 0; k < nodes.size(); ++k)
    for (ValueId v : nodes[k].in) users[static_cast<size_t>(v)].push_back(static_cast<int>(k));
  std::vector<bool> kept(g.values().size(), false);
  for (ValueId v : keep) kept[static_cast<size_t>(v)] = true;

  // folded[k]: the dtype node k's outputs take in place of their casts' (k: a GEMM or a
  // reduction); absorbed[c]: a cast that is now its producer's output.
  std::vector<std::optional<DType>> folded(nodes.size());
  std::vector<bool> absorbed(nodes.size(), false);
  std::map<ValueId, std::string> renamed;
  // squeezed[k]: a sum or mean kept its reduced axes only for a reshape that drops them
  // and feeds the cast (a broadcast bias's gradient, sum_to): it drops them itself.
  std::vector<bool> squeezed(nodes.size(), false);
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    if (n.op != Op::sum && n.op != Op::mean) continue;
    const ValueId v = n.out[0];
    const auto& u = users[static_cast<size_t>(v)];
    if (n.attrs.i("keepdims") == 0 || kept[static_cast<size_t>(v)] || u.size() != 1) continue;
    const Node& re = nodes[static_cast<size_t>(u[0])];
    const ValueId w = re.out.empty() ? -1 : re.out[0];
    if (re.op != Op::reshape || kept[static_cast<size_t>(w)] || users[static_cast<size_t>(w)].size() != 1 ||
        nodes[static_cast<size_t>(users[static_cast<size_t>(w)][0])].op != Op::cast)
      continue;
    const Shape& in = g.value(n.in[0]).type.shape;
    squeezed[k] = g.value(w).type.shape == reduced_shape(in, reduce_axes(n.attrs.ints("axes"), in.size(), nullptr), false);
  }
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    if (n.op != Op::matmul && n.op != Op::linear_grad_weight_bias && n.op != Op::conv2d_grad_weight &&
        n.op != Op::sum && n.op != Op::mean)
      continue;
    if (n.op == Op::matmul && n.in.size() > 2) continue;  // its addend has its output's dtype
    std::optional<DType> to;
    std::vector<int> casts;
    bool ok = true;
    if (squeezed[k]) {
      const int re = users[static_cast<size_t>(n.out[0])][0];
      const int c = users[static_cast<size_t>(nodes[static_cast<size_t>(re)].out[0])][0];
      const auto t = parse_dtype(nodes[static_cast<size_t>(c)].attrs.s("dtype"));
      const DType in = g.value(n.in[0]).type.dtype;
      if (!t || *t == in || *t != compute_dtype(in)) continue;
      folded[k] = *t;
      absorbed[static_cast<size_t>(re)] = absorbed[static_cast<size_t>(c)] = true;
      renamed[n.out[0]] = g.value(nodes[static_cast<size_t>(c)].out[0]).name;
      continue;
    }
    for (ValueId v : n.out) {
      ok = ok && !kept[static_cast<size_t>(v)] && !users[static_cast<size_t>(v)].empty();
      for (int u : users[static_cast<size_t>(v)]) {
        const Node& c = nodes[static_cast<size_t>(u)];
        auto t = c.op == Op::cast ? parse_dtype(c.attrs.s("dtype")) : std::nullopt;
        ok = ok && t && (!to || *to == *t) && users[static_cast<size_t>(v)].size() == 1;
        if (ok) to = *t, casts.push_back(u);
      }
    }
    // Only a dtype the op's rule allows: the one its inputs compute in.
    const DType in = g.value(n.in[0]).type.dtype;
    if (!ok || !to || *to == in || *to != compute_dtype(in)) continue;
    folded[k] = *to;
    for (int c : casts) absorbed[static_cast<size_t>(c)] = true;
    // Each output takes its cast's name: a requested value keeps the name it is read by.
    for (size_t i = 0; i < n.out.size(); ++i) renamed[n.out[i]] = g.value(nodes[static_cast<size_t>(casts[i])].out[0]).name;
  }

  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    if (absorbed[k]) {
      r.map[static_cast<size_t>(n.out[0])] = mapped(r, n.in[0]);
      continue;
    }
    std::vector<ValueId> in;
    for (ValueId v : n.in) in.push_back(mapped(r, v));
    Attrs attrs = n.attrs;
    std::vector<ValueId> out;
    if (folded[k]) {
      attrs.set("dtype", std::string(dtype_name(*folded[k])));
      if (squeezed[k]) attrs.set("keepdims", int64_t{0});
      ++r.backward;
      std::vector<std::string> names;
      for (ValueId v : n.out) names.push_back(renamed.at(v));
      out = ng.add_named(n.op, in, attrs, names);
    } else {
      out = emit(ng, g, n, in, attrs);
    }
    for (size_t i = 0; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
  }
  return r;
}

}  // namespace seam
