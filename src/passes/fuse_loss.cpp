// Loss fusion: the slice of padded logits absorbed into the loss, then cross_entropy and
// its gradient as one op that reads the logits once.
#include <set>

#include "passes/fuse.h"
#include "ops/registry.h"

namespace seam {

// Both values of a fused pair survive as outputs of the fused op; `keep` only holds back
// an argmax whose predictions are asked for.
FuseResult fuse_losses(const Graph& g, const std::vector<ValueId>& keep_list) {
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const std::set<ValueId> keep(keep_list.begin(), keep_list.end());
  const std::vector<std::vector<int>> users = value_users(g);

  // The count_equal(argmax(logits), labels) that a fused loss of those logits and labels
  // can count itself, or -1: the argmax along the classes (the loss's), its predictions
  // read by that count alone, ignored rows' labels negative (never counted either way),
  // and the count read only after the loss's place.
  auto counter_of = [&](const Node& ce, int k) {
    if (ce.attrs.i("ignore_index") >= 0) return -1;
    for (int u : users[static_cast<size_t>(ce.in[0])]) {
      const Node& am = nodes[static_cast<size_t>(u)];
      const size_t rank = g.value(ce.in[0]).type.shape.size();
      if (am.op != Op::argmax || am.in[0] != ce.in[0] ||
          normalize_axis(am.attrs.i("axis"), rank) != static_cast<int>(rank) - 1 ||
          am.attrs.i("classes") != ce.attrs.i("classes") || keep.count(am.out[0]))
        continue;
      const int c = only_user(users, keep, am.out[0]);
      if (c < 0) continue;
      const Node& eq = nodes[static_cast<size_t>(c)];
      const bool reads = eq.op == Op::count_equal && ((eq.in[0] == am.out[0] && eq.in[1] == ce.in[1]) ||
                                                      (eq.in[1] == am.out[0] && eq.in[0] == ce.in[1]));
      bool later = true;
      for (int v : users[static_cast<size_t>(eq.out[0])]) later = later && v > k;
      if (reads && later) return c;
    }
    return -1;
  };

  // partner[k]: for a cross_entropy node, its gradient node; early[p]: a node with no
  // inputs (the loss's gradient seed) that the fused op needs before its own position.
  std::vector<int> partner(static_cast<size_t>(nn), -1), counter(static_cast<size_t>(nn), -1);
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
    if (const int c = counter_of(ce, k); c >= 0) {
      counter[static_cast<size_t>(k)] = c;
      const Node& eq = nodes[static_cast<size_t>(c)];
      absorbed[static_cast<size_t>(c)] = true;
      absorbed[static_cast<size_t>(g.value(eq.in[eq.in[0] == ce.in[1] ? 1 : 0]).node)] = true;  // the argmax
    }
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
    Attrs attrs = ce.attrs;
    const int c = counter[static_cast<size_t>(k)];
    if (c >= 0) attrs.set("count_correct", int64_t{1});
    const std::vector<ValueId> in{map(ce.in[0]), map(ce.in[1]), map(gn.in[0])};
    // The count keeps count_equal's name, by which it is read.
    auto out = c < 0 ? ng.add_named(Op::cross_entropy_with_grad, in, attrs, ce.name)
                     : ng.add_named(Op::cross_entropy_with_grad, in, attrs,
                                    std::vector<std::string>{g.value(ce.out[0]).name, g.value(gn.out[0]).name,
                                                             g.value(nodes[static_cast<size_t>(c)].out[0]).name});
    r.map[static_cast<size_t>(ce.out[0])] = out[0];
    r.map[static_cast<size_t>(gn.out[0])] = out[1];
    if (c >= 0) {
      r.map[static_cast<size_t>(nodes[static_cast<size_t>(c)].out[0])] = out[2];
      ++r.forward;
    }
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
