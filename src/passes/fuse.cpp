// Epilogue fusion over a whole (forward + backward) graph.
#include "passes/fuse.h"

#include <set>

#include "ops/registry.h"

namespace seam {

namespace {

struct BackwardFusion {
  int grad = -1;     // the act_grad node
  int matmul = -1;   // the input-gradient matmul it absorbs
  int reshape = -1;  // a view between them, if any
};

struct ForwardFusion {
  int linear = -1, act = -1;
  std::string act_name;  // "relu" | "gelu_tanh"
  std::vector<int> grads;  // act_grad nodes left unfused
  std::vector<BackwardFusion> fused;
  bool aux() const { return !fused.empty() || (act_name == "gelu_tanh" && !grads.empty()); }
};

}  // namespace

FuseResult start_rebuild(const Graph& g) {
  FuseResult r;
  r.map.assign(g.values().size(), -1);
  for (size_t v = 0; v < g.values().size(); ++v) {
    const Value& val = g.values()[v];
    Graph& ng = r.graph;
    if (val.kind == ValueKind::input) r.map[v] = ng.input(val.name, val.type.shape, val.type.dtype).id();
    if (val.kind == ValueKind::param) r.map[v] = ng.param(val.name, val.type.shape, val.init, val.decay, val.type.dtype).id();
    if (val.kind == ValueKind::state) r.map[v] = ng.state(val.name, val.type.shape, val.init, val.type.dtype).id();
    if (r.map[v] >= 0) ng.value(r.map[v]).type.layout = val.type.layout;  // a filter stored channels-last stays so
  }
  return r;
}

std::vector<ValueId> copy_node(FuseResult& r, const Graph& g, const Node& n, const std::vector<ValueId>& in) {
  std::vector<std::string> names;  // as they are: a fused step's outputs may carry absorbed steps' names
  for (ValueId v : n.out) names.push_back(g.value(v).name);
  Graph& ng = r.graph;
  auto out = names.empty() ? ng.add_named(n.op, in, n.attrs, n.name) : ng.add_named(n.op, in, n.attrs, names);
  for (size_t i = 0; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
  return out;
}

std::vector<std::vector<int>> value_users(const Graph& g) {
  std::vector<std::vector<int>> users(g.values().size());
  for (size_t k = 0; k < g.nodes().size(); ++k)
    for (ValueId v : g.nodes()[k].in) users[static_cast<size_t>(v)].push_back(static_cast<int>(k));
  return users;
}

int only_user(const std::vector<std::vector<int>>& users, const std::set<ValueId>& keep, ValueId v) {
  const auto& u = users[static_cast<size_t>(v)];
  return u.size() == 1 && !keep.count(v) ? u[0] : -1;
}

bool without_activation(const Node& n) { return !n.attrs.has("activation") || n.attrs.s("activation") == "none"; }

ValueId mapped(const FuseResult& r, ValueId old) {
  const ValueId m = r.map[static_cast<size_t>(old)];
  SEAM_ASSERT(m >= 0);
  return m;
}

FuseResult fuse_epilogues(const Graph& g, const std::vector<ValueId>& keep_list) {
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  std::set<ValueId> keep(keep_list.begin(), keep_list.end());
  const std::vector<std::vector<int>> users = value_users(g);
  auto node_of = [&](ValueId v) { return g.value(v).node; };
  auto only_user = [&](ValueId v, int k) {
    auto& u = users[static_cast<size_t>(v)];
    return u.size() == 1 && u[0] == k && !keep.count(v);
  };

  // Find the patterns.
  std::vector<ForwardFusion> found;
  std::vector<int> role(static_cast<size_t>(nn), -1);  // node -> index into found
  for (int k = 0; k < nn; ++k) {
    const Node& lin = nodes[static_cast<size_t>(k)];
    if (lin.op != Op::linear) continue;
    ValueId pre = lin.out[0];
    if (keep.count(pre)) continue;
    ForwardFusion f;
    f.linear = k;
    bool ok = true;
    for (int u : users[static_cast<size_t>(pre)]) {
      const Node& n = nodes[static_cast<size_t>(u)];
      if ((n.op == Op::relu || n.op == Op::gelu_tanh) && n.in[0] == pre && f.act < 0) {
        f.act = u;
        f.act_name = n.op == Op::relu ? "relu" : "gelu_tanh";
      } else if (n.op == Op::gelu_tanh_grad && n.in[1] == pre) {
        f.grads.push_back(u);
      } else {
        ok = false;
      }
    }
    if (!ok || f.act < 0) continue;
    const int64_t out = g.value(pre).type.shape.back();
    if (f.act_name == "gelu_tanh" && out % 8 != 0) continue;  // the record must be exactly pre
    if (f.act_name == "relu") {
      if (!f.grads.empty()) continue;
      for (int u : users[static_cast<size_t>(nodes[static_cast<size_t>(f.act)].out[0])])
        if (nodes[static_cast<size_t>(u)].op == Op::relu_grad && nodes[static_cast<size_t>(u)].in[1] == nodes[static_cast<size_t>(f.act)].out[0])
          f.grads.push_back(u);
    }
    // Each activation gradient whose incoming gradient is a plain input-gradient GEMM
    // (dy [M, N] times w [N, K]) folds into that GEMM's epilogue.
    std::vector<int> left;
    for (int gk : f.grads) {
      const Node& gn = nodes[static_cast<size_t>(gk)];
      BackwardFusion b{gk, -1, -1};
      ValueId d = gn.in[0];
      int p = node_of(d);
      if (p >= 0 && nodes[static_cast<size_t>(p)].op == Op::reshape && only_user(d, gk)) {
        b.reshape = p;
        d = nodes[static_cast<size_t>(p)].in[0];
        p = node_of(d);
      }
      bool fuse = p >= 0 && only_user(d, b.reshape >= 0 ? b.reshape : gk);
      if (fuse) {
        const Node& mm = nodes[static_cast<size_t>(p)];
        fuse = mm.op == Op::matmul && mm.in.size() == 2 && mm.attrs.i("transpose_a") == 0 && mm.attrs.i("transpose_b") == 0 &&
               g.value(mm.in[0]).type.shape.size() == 2 && g.value(mm.in[1]).type.shape.size() == 2 &&
               g.value(d).type.numel() == g.value(gn.out[0]).type.numel();
      }
      if (fuse) {
        b.matmul = p;
        f.fused.push_back(b);
      } else {
        left.push_back(gk);
      }
    }
    f.grads = left;
    int idx = static_cast<int>(found.size());
    role[static_cast<size_t>(f.linear)] = idx;
    role[static_cast<size_t>(f.act)] = idx;
    for (auto& b : f.fused) {
      role[static_cast<size_t>(b.grad)] = idx;
      role[static_cast<size_t>(b.matmul)] = idx;
      if (b.reshape >= 0) role[static_cast<size_t>(b.reshape)] = idx;
    }
    found.push_back(std::move(f));
  }

  // Rebuild, keeping every name.
  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  auto map = [&](ValueId v) { return mapped(r, v); };
  std::vector<ValueId> aux_of(found.size(), -1);
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    int f_idx = role[static_cast<size_t>(k)];
    if (f_idx < 0) {
      std::vector<ValueId> in;
      for (ValueId v : n.in) in.push_back(map(v));
      auto out = ng.add_named(n.op, in, n.attrs, n.name);
      for (size_t i = 0; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
      continue;
    }
    ForwardFusion& f = found[static_cast<size_t>(f_idx)];
    if (k == f.linear) {
      const Node& act = nodes[static_cast<size_t>(f.act)];
      std::vector<ValueId> in;
      for (ValueId v : n.in) in.push_back(map(v));
      auto out = ng.add_named(f.aux() ? Op::linear_act_aux : Op::linear_act, in, {{"act", f.act_name}}, act.name);
      r.map[static_cast<size_t>(act.out[0])] = out[0];
      if (f.aux()) {
        aux_of[static_cast<size_t>(f_idx)] = out[1];
        if (f.act_name == "gelu_tanh") r.map[static_cast<size_t>(n.out[0])] = out[1];  // the record is pre itself
      }
      ++r.forward;
      continue;
    }
    for (auto& b : f.fused) {
      if (k != b.grad) continue;  // the absorbed matmul and view emit nothing
      const Node& mm = nodes[static_cast<size_t>(b.matmul)];
      Shape want = g.value(n.out[0]).type.shape;
      ValueId in_dy = map(mm.in[0]), in_w = map(mm.in[1]);
      std::string name = g.value(mm.out[0]).type.shape == want ? n.name : n.name + "/gemm";
      ValueId dx = ng.add_named(Op::matmul_act_grad, {in_dy, in_w, aux_of[static_cast<size_t>(f_idx)]},
                                {{"act", f.act_name}}, name)[0];
      if (name != n.name) dx = ng.add_named(Op::reshape, {dx}, {{"shape", want}}, n.name)[0];
      r.map[static_cast<size_t>(n.out[0])] = dx;
      ++r.backward;
    }
  }
  return r;
}

}  // namespace seam
