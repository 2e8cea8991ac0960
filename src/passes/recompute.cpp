// Activation recomputation (src/passes/fuse.h: recompute_activations).
#include <algorithm>
#include <map>

#include "passes/fuse.h"
#include "seam/error.h"

namespace seam {

std::vector<std::string> recompute_names() { return {"gelu"}; }

FuseResult recompute_activations(const Graph& g, ValueId loss, const std::vector<std::string>& what) {
  const std::vector<std::string> names = recompute_names();
  for (const std::string& w : what)
    if (std::find(names.begin(), names.end(), w) == names.end()) {
      std::string known;
      for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
      fail("compile: recompute: unknown activation '", w, "' (known: ", known, ")");
    }
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const bool gelu = std::find(what.begin(), what.end(), "gelu") != what.end();
  // The backward starts after the loss's node (the fused loss writes its gradient there).
  const int last_forward = loss >= 0 ? g.value(loss).node : nn;
  const std::vector<std::vector<int>> users = value_users(g);

  // A GELU's output y -> where it is recomputed from: the pre-activation the backward
  // keeps anyway (the GEMM epilogue's record, or the unfused op's input).
  struct Source {
    ValueId from;
    Op op;
  };
  std::map<ValueId, Source> sources;
  std::vector<std::vector<ValueId>> late(static_cast<size_t>(nn));  // node -> its recomputed inputs
  for (int k = 0; gelu && k <= last_forward && k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    Source s{-1, Op::gelu_tanh};
    if (n.op == Op::linear_act_aux && n.attrs.s("act") == "gelu_tanh") s.from = n.out[1];
    else if (n.op == Op::gelu || n.op == Op::gelu_tanh) s = {n.in[0], n.op};
    if (s.from < 0) continue;
    const ValueId y = n.out[0];
    bool any = false;
    for (int u : users[static_cast<size_t>(y)])  // a node reading y twice is listed twice
      if (u > last_forward && (late[static_cast<size_t>(u)].empty() || late[static_cast<size_t>(u)].back() != y)) {
        late[static_cast<size_t>(u)].push_back(y);
        any = true;
      }
    if (any) sources[y] = s;
  }

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
      const Source& s = sources.at(y);
      const Value& yv = g.value(y);
      ValueId from = mapped(r, s.from);
      const int c = copies[y]++;
      std::string name = yv.name;
      name.append("/recompute");
      if (c > 0) name.append("_").append(std::to_string(c));
      if (ng.value(from).type.shape != yv.type.shape)
        from = ng.add_named(Op::reshape, {from}, {{"shape", yv.type.shape}}, name + "_shape")[0];
      const ValueId again = ng.add_named(s.op, {from}, {}, name)[0];
      for (size_t i = 0; i < n.in.size(); ++i)
        if (n.in[i] == y) in[i] = again;
      ++r.backward;
    }
    copy_node(r, g, n, in);
  }
  return r;
}

}  // namespace seam
