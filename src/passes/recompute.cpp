// Activation recomputation (src/passes/fuse.h: recompute_activations).
#include <algorithm>
#include <map>

#include "passes/fuse.h"
#include "seam/error.h"
#include "seam/plan.h"

namespace seam {

namespace {

// Where a value is computed again from: inputs the backward keeps anyway, one op, and the
// output of that op that is the value.
struct Source {
  std::vector<ValueId> from;
  Op op;
  Attrs attrs;
};

struct Candidates {
  std::vector<ValueId> order;         // recomputable values, in the order a budget takes them
  std::map<ValueId, Source> sources;  // each one's source
  std::map<ValueId, std::string> kind;
};

void check_kinds(const std::vector<std::string>& what) {
  const std::vector<std::string> names = recompute_names();
  for (const std::string& w : what)
    if (std::find(names.begin(), names.end(), w) == names.end()) {
      std::string known;
      for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
      fail("compile: recompute: unknown activation '", w, "' (known: ", known, ")");
    }
}

// A forward node's output that a node after the loss's reads, and what it comes from:
// a GELU's output from the pre-activation (the GEMM epilogue's record, or the unfused op's
// input); a layer norm's output from its input, gamma and beta (the input is kept for the
// norm's gradient). Both cost two bytes moved for each byte no longer kept.
Candidates find_candidates(const Graph& g, ValueId loss, const std::vector<std::string>& kinds) {
  check_kinds(kinds);
  auto wants = [&](const char* k) { return std::find(kinds.begin(), kinds.end(), k) != kinds.end(); };
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  // The backward starts after the loss's node (the fused loss writes its gradient there).
  const int last_forward = loss >= 0 ? g.value(loss).node : nn;
  const std::vector<std::vector<int>> users = value_users(g);
  Candidates c;
  std::vector<ValueId> gelus, norms;
  for (int k = 0; k <= last_forward && k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    Source s{{}, n.op, {}};
    if (wants("gelu") && n.op == Op::linear_act_aux && n.attrs.s("act") == "gelu_tanh") s = {{n.out[1]}, Op::gelu_tanh, {}};
    else if (wants("gelu") && (n.op == Op::gelu || n.op == Op::gelu_tanh)) s.from = {n.in[0]};
    else if (wants("layer_norm") && n.op == Op::layer_norm) s = {n.in, Op::layer_norm, n.attrs};
    if (s.from.empty()) continue;
    const ValueId y = n.out[0];
    const auto& u = users[static_cast<size_t>(y)];
    if (std::none_of(u.begin(), u.end(), [&](int r) { return r > last_forward; })) continue;
    // A norm whose backward reads its output (norm_grads_from_outputs) keeps that output
    // in place of its input: recomputing it would keep the input again.
    if (std::any_of(u.begin(), u.end(), [&](int r) {
          const Node& b = nodes[static_cast<size_t>(r)];
          return b.op == Op::layer_norm_grad && b.attrs.i("from_output") == 1;
        }))
      continue;
    c.sources[y] = s;
    c.kind[y] = n.op == Op::layer_norm ? "layer_norm" : "gelu";
    (n.op == Op::layer_norm ? norms : gelus).push_back(y);
  }
  // GELUs first: the same two bytes a byte, in a quarter of the kernels.
  c.order = gelus;
  c.order.insert(c.order.end(), norms.begin(), norms.end());
  return c;
}

FuseResult rewrite(const Graph& g, ValueId loss, const Candidates& c, const std::vector<ValueId>& ys) {
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const int last_forward = loss >= 0 ? g.value(loss).node : nn;
  const std::vector<std::vector<int>> users = value_users(g);
  std::vector<std::vector<ValueId>> late(static_cast<size_t>(nn));  // node -> its recomputed inputs
  for (ValueId y : ys)
    for (int u : users[static_cast<size_t>(y)])  // a node reading y twice is listed twice
      if (u > last_forward && (late[static_cast<size_t>(u)].empty() || late[static_cast<size_t>(u)].back() != y))
        late[static_cast<size_t>(u)].push_back(y);

  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  std::map<ValueId, int> copies;  // of each y so far, for unique names
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    std::vector<ValueId> in;
    for (ValueId v : n.in) in.push_back(mapped(r, v));
    for (ValueId y : late[static_cast<size_t>(k)]) {
      // y again, from its source, just before this backward reader: y itself is then
      // dead after its forward readers, and the copy lives only until this node.
      const Source& s = c.sources.at(y);
      const Value& yv = g.value(y);
      std::vector<ValueId> from;
      for (ValueId v : s.from) from.push_back(mapped(r, v));
      const int copy = copies[y]++;
      std::string name = yv.name;
      name.append("/recompute");
      if (copy > 0) name.append("_").append(std::to_string(copy));
      if (s.op != Op::layer_norm && ng.value(from[0]).type.shape != yv.type.shape)
        from[0] = ng.add_named(Op::reshape, {from[0]}, {{"shape", yv.type.shape}}, name + "_shape")[0];
      std::vector<std::string> names{name};
      if (s.op == Op::layer_norm) names = {name, name + "_mean", name + "_rstd"};
      const ValueId again = ng.add_named(s.op, from, s.attrs, names)[0];
      for (size_t i = 0; i < n.in.size(); ++i)
        if (n.in[i] == y) in[i] = again;
      ++r.backward;
    }
    copy_node(r, g, n, in);
  }
  return r;
}

}  // namespace

std::vector<std::string> recompute_names() { return {"gelu", "layer_norm"}; }

FuseResult recompute_activations(const Graph& g, ValueId loss, const std::vector<std::string>& what) {
  const Candidates c = find_candidates(g, loss, what);
  return rewrite(g, loss, c, c.order);
}

FuseResult norm_grads_from_outputs(const Graph& g, ValueId loss) {
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const int last_forward = loss >= 0 ? g.value(loss).node : nn;
  const std::vector<std::vector<int>> users = value_users(g);
  FuseResult r = start_rebuild(g);
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    std::vector<ValueId> in;
    for (ValueId v : n.in) in.push_back(mapped(r, v));
    const Node* f = nullptr;  // the forward layer_norm whose statistics n reads
    if (n.op == Op::layer_norm_grad && n.attrs.i("from_output") == 0 && g.value(n.in[2]).node >= 0) {
      f = &nodes[static_cast<size_t>(g.value(n.in[2]).node)];
      if (f->op != Op::layer_norm || f->out[1] != n.in[2] || f->out[2] != n.in[3] || f->in[0] != n.in[1]) f = nullptr;
    }
    // Only where the backward reads the output anyway (a weight gradient's input): there
    // it costs no byte, and the input need not be kept for this node.
    const std::vector<int>* u = f ? &users[static_cast<size_t>(f->out[0])] : nullptr;
    if (!u || std::none_of(u->begin(), u->end(), [&](int x) { return x > last_forward && x != k; })) {
      copy_node(r, g, n, in);
      continue;
    }
    in[1] = mapped(r, f->out[0]);
    in[2] = mapped(r, f->in[2]);  // beta
    Node m = n;
    m.attrs.set("from_output", int64_t{1});
    copy_node(r, g, m, in);
    ++r.backward;
  }
  return r;
}

std::string count_kinds(const std::vector<std::string>& kinds) {
  std::map<std::string, int> n;
  for (const std::string& k : kinds) ++n[k];
  std::string list;
  for (auto& [k, c] : n) list += (list.empty() ? "" : ", ") + std::to_string(c) + " " + k;
  return list;
}

RecomputeChoice recompute_within(const Graph& g, ValueId loss, const std::vector<std::string>& what, size_t budget,
                                 const std::function<size_t(const FuseResult&)>& bytes_of) {
  const Candidates asked = find_candidates(g, loss, what);
  const Candidates all = find_candidates(g, loss, recompute_names());
  std::vector<ValueId> order = asked.order;  // what was asked for, then the rest in the budget's order
  for (ValueId y : all.order)
    if (!asked.sources.count(y)) order.push_back(y);
  auto attempt = [&](size_t n) {
    RecomputeChoice ch{rewrite(g, loss, all, {order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n)}), 0, {}};
    ch.bytes = bytes_of(ch.result);
    for (size_t i = asked.order.size(); i < n; ++i) ch.added.push_back(all.kind.at(order[i]));
    return ch;
  };
  RecomputeChoice best = attempt(asked.order.size());
  if (best.bytes <= budget) return best;
  RecomputeChoice most = attempt(order.size());
  if (most.bytes > budget) {
    std::vector<std::string> kinds;  // what could be recomputed
    for (ValueId y : order) kinds.push_back(all.kind.at(y));
    fail("compile: memory budget of ", bytes_str(budget), ": the step needs ", bytes_str(most.bytes),
         " even with every output the backward could compute again recomputed (",
         kinds.empty() ? std::string("none") : count_kinds(kinds), ")");
  }
  // The fewest extra values, in order, that fit (by bisection: a plan's peak falls as
  // values go, give or take the placement's slack).
  size_t lo = asked.order.size(), hi = order.size();
  best = std::move(most);
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    RecomputeChoice ch = attempt(mid);
    if (ch.bytes <= budget) hi = mid, best = std::move(ch);
    else lo = mid;
  }
  return best;
}

}  // namespace seam
