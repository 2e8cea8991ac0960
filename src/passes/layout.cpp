// The layout pass (src/passes/layout.h).
#include "passes/layout.h"

#include <map>

#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/registry.h"
#include "seam/ops.h"

namespace seam {

namespace {

bool has_nhwc_op(const Graph& g) {
  for (const Node& n : g.nodes())
    if (is_nhwc(n.attrs)) return true;
  return false;
}

// Ops that run in either layout and follow their input's: their schema has `layout`.
bool follows_input(Op op) {
  return op == Op::batch_norm || op == Op::max_pool2d || op == Op::avg_pool2d || op == Op::global_avg_pool;
}

// Forward elementwise ops, whose result at an element depends only on the operands'
// elements at the same (broadcast) index. Dropout is not one here: its mask is a function
// of the element's index, so running it channels-last would drop other elements.
bool elementwise(Op op) {
  if (const UnaryInfo* u = unary_info(op)) return u->op == op;
  if (const BinaryInfo* b = binary_info(op)) return b->op == op;
  return op == Op::cast || op == Op::copy || op == Op::stop_gradient;
}

// perm keeps the dims of size > 1 in their order: the data's memory order is unchanged.
bool moves_only_ones(const Shape& s, const std::vector<int64_t>& perm) {
  int64_t last = -1;
  for (int64_t p : perm) {
    if (s[static_cast<size_t>(p)] == 1) continue;
    if (p < last) return false;
    last = p;
  }
  return true;
}

class Rewriter {
 public:
  explicit Rewriter(const Graph& g) : g_(g), r_(start_rebuild(g)), nhwc_(g.values().size(), false) {
    for (const std::string& name : channels_last_params(g)) {
      const ValueId old = *g.find(name);
      Value& v = ng().value(mapped(r_, old));
      v.type.shape = nhwc_order(v.type.shape);
      v.type.layout = DataLayout::nhwc;
      nhwc_[static_cast<size_t>(old)] = true;
    }
  }

  FuseResult run() {
    for (const Node& n : g_.nodes()) rewrite(n);
    return std::move(r_);
  }

 private:
  Graph& ng() { return r_.graph; }
  const Shape& shape(ValueId old) const { return g_.value(old).type.shape; }

  // "<value>.<suffix>", or with _2, _3... where that name is taken.
  std::string fresh_name(ValueId nv, const char* suffix) {
    const std::string base = ng().value(nv).name + "." + suffix;
    std::string name = base;
    for (int k = 2; ng().find(name); ++k) name = base + "_" + std::to_string(k);
    return name;
  }

  // The new value reordered by perm: a view where the memory order stays, else one
  // transpose (cached, named after the value).
  ValueId reorder(ValueId nv, const std::vector<int64_t>& perm, const char* suffix) {
    auto [it, fresh] = cache_.try_emplace({nv, suffix}, -1);
    if (!fresh) return it->second;
    const Shape s = ng().value(nv).type.shape;
    const std::string name = fresh_name(nv, suffix);
    if (moves_only_ones(s, perm)) {
      Shape to;
      for (int64_t p : perm) to.push_back(s[static_cast<size_t>(p)]);
      it->second = ng().add_named(Op::reshape, {nv}, {{"shape", to}}, name).at(0);
    } else {
      it->second = ng().add_named(Op::transpose, {nv}, {{"perm", perm}}, name).at(0);
    }
    return it->second;
  }

  ValueId as_nchw(ValueId old) {
    const ValueId nv = mapped(r_, old);
    return nhwc_[static_cast<size_t>(old)] ? reorder(nv, to_nchw_perm(), "nchw") : nv;
  }
  ValueId as_nhwc(ValueId old) {
    const ValueId nv = mapped(r_, old);
    return nhwc_[static_cast<size_t>(old)] ? nv : reorder(nv, to_nhwc_perm(), "nhwc");
  }
  // An operand broadcast against a channels-last result of rank 4: written as a 4-d
  // shape (leading 1s), then in channels-last order.
  ValueId as_nhwc_operand(ValueId old) {
    if (nhwc_[static_cast<size_t>(old)] || shape(old).size() == 4) return as_nhwc(old);
    const ValueId nv = mapped(r_, old);
    auto [it, fresh] = cache_.try_emplace({nv, "4d"}, -1);
    if (fresh) {
      Shape s4(4 - shape(old).size(), 1);
      s4.insert(s4.end(), shape(old).begin(), shape(old).end());
      it->second = ng().add_named(Op::reshape, {nv}, {{"shape", s4}}, fresh_name(nv, "4d")).at(0);
    }
    return reorder(it->second, to_nhwc_perm(), "nhwc");
  }

  void emit(const Node& n, const std::vector<ValueId>& in, const Attrs& attrs, bool nhwc) {
    std::vector<std::string> names;
    for (ValueId v : n.out) names.push_back(g_.value(v).name);
    const std::vector<ValueId> out =
        names.empty() ? ng().add_named(n.op, in, attrs, n.name) : ng().add_named(n.op, in, attrs, names);
    for (size_t i = 0; i < out.size(); ++i) {
      r_.map[static_cast<size_t>(n.out[i])] = out[i];
      nhwc_[static_cast<size_t>(n.out[i])] = nhwc && shape(n.out[i]).size() == 4;
    }
  }

  void rewrite(const Node& n) {
    std::vector<ValueId> in;
    Attrs attrs = n.attrs;
    const bool image = !n.in.empty() && shape(n.in[0]).size() == 4;
    if ((n.op == Op::conv2d && image) || (follows_input(n.op) && image && nhwc_[static_cast<size_t>(n.in[0])])) {
      for (size_t i = 0; i < n.in.size(); ++i) in.push_back(shape(n.in[i]).size() == 4 ? as_nhwc(n.in[i]) : mapped(r_, n.in[i]));
      attrs.set("layout", std::string("nhwc"));
      return emit(n, in, attrs, true);
    }
    if (elementwise(n.op) && !n.out.empty() && shape(n.out[0]).size() == 4) {
      const Shape& out = shape(n.out[0]);
      bool nhwc = false;
      for (ValueId v : n.in) nhwc = nhwc || (nhwc_[static_cast<size_t>(v)] && shape(v) == out);
      if (nhwc) {
        for (ValueId v : n.in) in.push_back(shape(v) == out ? as_nhwc(v) : as_nhwc_operand(v));
        return emit(n, in, attrs, true);
      }
    }
    for (ValueId v : n.in) in.push_back(as_nchw(v));
    emit(n, in, attrs, false);
  }

  const Graph& g_;
  FuseResult r_;
  std::vector<bool> nhwc_;  // by old value: its new value is channels-last
  std::map<std::pair<ValueId, std::string>, ValueId> cache_;
};

}  // namespace

std::set<std::string> channels_last_params(const Graph& g) {
  std::set<std::string> out;
  if (has_nhwc_op(g)) return out;
  for (const Node& n : g.nodes()) {
    if (n.op != Op::conv2d || n.in.size() < 2 || g.value(n.in[0]).type.shape.size() != 4) continue;
    ValueId w = n.in[1];
    while (g.value(w).kind == ValueKind::intermediate && g.node(g.value(w).node).op == Op::cast)
      w = g.node(g.value(w).node).in[0];
    const Value& v = g.value(w);
    if (v.kind == ValueKind::param && v.type.shape.size() == 4) out.insert(v.name);
  }
  return out;
}

FuseResult apply_layout(const Graph& g, DataLayout conv_layout) {
  if (conv_layout == DataLayout::plain || has_nhwc_op(g)) {
    FuseResult r = start_rebuild(g);
    for (const Node& n : g.nodes()) {
      std::vector<ValueId> in;
      for (ValueId v : n.in) in.push_back(mapped(r, v));
      std::vector<std::string> names;
      for (ValueId v : n.out) names.push_back(g.value(v).name);
      auto out = names.empty() ? r.graph.add_named(n.op, in, n.attrs, n.name) : r.graph.add_named(n.op, in, n.attrs, names);
      for (size_t i = 0; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
    }
    return r;
  }
  return Rewriter(g).run();
}

}  // namespace seam
