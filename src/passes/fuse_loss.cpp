// Loss fusion: cross_entropy and its gradient become one op that reads the logits once.
#include <set>

#include "passes/fuse.h"
#include "ops/registry.h"

namespace seam {

// Both values of a fused pair survive as outputs of the fused op, so `keep` asks nothing.
FuseResult fuse_losses(const Graph& g, const std::vector<ValueId>& /*keep*/) {
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const std::vector<std::vector<int>> users = value_users(g);

  // partner[k]: for a cross_entropy node, its gradient node; early[p]: a node with no
  // inputs (the loss's gradient seed) that the fused op needs before its own position.
  std::vector<int> partner(static_cast<size_t>(nn), -1);
  std::vector<bool> absorbed(static_cast<size_t>(nn), false), early(static_cast<size_t>(nn), false);
  for (int k = 0; k < nn; ++k) {
    const Node& ce = nodes[static_cast<size_t>(k)];
    if (ce.op != Op::cross_entropy) continue;
    int grad = -1, matches = 0;
    for (int u : users[static_cast<size_t>(ce.in[0])]) {
      const Node& n = nodes[static_cast<size_t>(u)];
      if (n.op == Op::cross_entropy_grad && n.in[1] == ce.in[0] && n.in[2] == ce.in[1] && n.attrs == ce.attrs)
        grad = u, ++matches;
    }
    if (matches != 1) continue;
    // The fused op runs where the forward did, so the incoming gradient must exist by
    // then: an input, a value made before, or a constant made from nothing.
    const int p = g.value(nodes[static_cast<size_t>(grad)].in[0]).node;
    if (p > k && !nodes[static_cast<size_t>(p)].in.empty()) continue;
    partner[static_cast<size_t>(k)] = grad;
    absorbed[static_cast<size_t>(grad)] = true;
    if (p > k) early[static_cast<size_t>(p)] = true;
  }

  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  auto map = [&](ValueId v) { return mapped(r, v); };
  std::vector<bool> done(static_cast<size_t>(nn), false);
  auto emit = [&](int k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    std::vector<ValueId> in;
    for (ValueId v : n.in) in.push_back(map(v));
    auto out = ng.add_named(n.op, in, n.attrs, n.name);
    for (size_t i = 0; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
    done[static_cast<size_t>(k)] = true;
  };
  for (int k = 0; k < nn; ++k) {
    if (done[static_cast<size_t>(k)] || absorbed[static_cast<size_t>(k)]) continue;
    const int grad = partner[static_cast<size_t>(k)];
    if (grad < 0) {
      emit(k);
      continue;
    }
    const Node& ce = nodes[static_cast<size_t>(k)];
    const Node& gn = nodes[static_cast<size_t>(grad)];
    const int p = g.value(gn.in[0]).node;
    if (p > k) emit(p);  // the seed, ahead of its turn
    auto out = ng.add_named(Op::cross_entropy_with_grad, {map(ce.in[0]), map(ce.in[1]), map(gn.in[0])}, ce.attrs,
                            ce.name);
    r.map[static_cast<size_t>(ce.out[0])] = out[0];
    r.map[static_cast<size_t>(gn.out[0])] = out[1];
    done[static_cast<size_t>(k)] = true;
    ++r.backward;
  }
  for (int k = 0; k < nn; ++k) SEAM_ASSERT(done[static_cast<size_t>(k)] || absorbed[static_cast<size_t>(k)]);
  return r;
}

}  // namespace seam
