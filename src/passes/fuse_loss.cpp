// Loss fusion: the slice of padded logits absorbed into the loss, then cross_entropy and
// its gradient as one op that reads the logits once.
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

FuseResult absorb_class_slices(const Graph& g, const std::vector<ValueId>& keep_list) {
  const auto& nodes = g.nodes();
  const size_t nn = nodes.size();
  const std::set<ValueId> keep(keep_list.begin(), keep_list.end());
  const std::vector<std::vector<int>> users = value_users(g);
  auto last_axis = [&](const Node& n, ValueId v) {
    return normalize_axis(n.attrs.i("axis"), g.value(v).type.shape.size()) ==
           static_cast<int>(g.value(v).type.shape.size()) - 1;
  };
  // classes_of[v]: a slice's value that its readers take as x with `classes` columns.
  // grad_slice[k]: for such a reader's gradient node, the slice_grad it makes redundant.
  std::vector<int64_t> classes_of(g.values().size(), 0);
  std::vector<int> grad_slice(nn, -1);
  std::vector<bool> gone(nn, false);
  for (size_t k = 0; k < nn; ++k) {
    const Node& sl = nodes[k];
    if (sl.op != Op::slice) continue;
    const ValueId x = sl.in[0], v = sl.out[0];
    if (!last_axis(sl, x) || sl.attrs.i("start") != 0 || sl.attrs.i("step") != 1 || keep.count(v)) continue;
    const int64_t classes = g.value(v).type.shape.back();
    bool ok = !users[static_cast<size_t>(v)].empty();
    std::vector<std::pair<int, int>> grads;  // (cross_entropy_grad, slice_grad)
    for (int u : users[static_cast<size_t>(v)]) {
      const Node& n = nodes[static_cast<size_t>(u)];
      if (n.attrs.has("classes") && n.attrs.i("classes") != 0) ok = false;
      if (n.op == Op::cross_entropy || n.op == Op::argmax) {
        ok = ok && n.in[0] == v && (n.op != Op::argmax || last_axis(n, v));  // labels are i32, never v
      } else if (n.op == Op::cross_entropy_grad && n.in[1] == v && n.in[0] != v && n.in[2] != v) {
        const ValueId d = n.out[0];
        const std::vector<int>& du = users[static_cast<size_t>(d)];
        const Node* sg = du.size() == 1 ? &nodes[static_cast<size_t>(du[0])] : nullptr;
        ok = ok && !keep.count(d) && sg && sg->op == Op::slice_grad && sg->in[0] == d &&
             sg->attrs.i("size") == g.value(x).type.shape.back() && sg->attrs.i("start") == 0 &&
             sg->attrs.i("step") == 1 && last_axis(*sg, d) && g.value(sg->out[0]).type == g.value(x).type;
        if (ok) grads.emplace_back(u, du[0]);
      } else {
        ok = false;
      }
    }
    if (!ok) continue;
    classes_of[static_cast<size_t>(v)] = classes;
    gone[k] = true;
    for (auto [u, sg] : grads) {
      grad_slice[static_cast<size_t>(u)] = sg;
      gone[static_cast<size_t>(sg)] = true;
    }
  }

  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  for (size_t k = 0; k < nn; ++k) {
    if (gone[k]) continue;
    const Node& n = nodes[k];
    std::vector<ValueId> in;
    Attrs attrs = n.attrs;
    for (ValueId v : n.in) {
      const int64_t classes = classes_of[static_cast<size_t>(v)];
      if (classes == 0) {
        in.push_back(mapped(r, v));
        continue;
      }
      in.push_back(mapped(r, nodes[static_cast<size_t>(g.value(v).node)].in[0]));  // the slice's input
      attrs.set("classes", classes);
    }
    auto out = ng.add_named(n.op, in, attrs, n.name);
    for (size_t i = 0; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
    if (const int sg = grad_slice[k]; sg >= 0) {
      r.map[static_cast<size_t>(nodes[static_cast<size_t>(sg)].out[0])] = out[0];
      r.map[static_cast<size_t>(n.out[0])] = -1;
      ++r.backward;
    }
    if (attrs.has("classes") && attrs.i("classes") != 0 && n.attrs.i("classes") == 0) ++r.forward;
  }
  return r;
}

}  // namespace seam
