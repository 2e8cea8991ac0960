// Residual adds into GEMMs (src/passes/fuse.h).
#include <set>
#include <vector>

#include "ops/registry.h"
#include "passes/fuse.h"

namespace seam {

namespace {

struct ResidualFusion {
  int linear = -1;  // y = linear(x, w, b?)
  int view = -1;    // a reshape of y between the linear and the add, if any
  ValueId r = -1;   // the add's other operand
};

}  // namespace

FuseResult residual_adds_into_linears(const Graph& g, const std::vector<ValueId>& keep_list) {
  const std::set<ValueId> keep(keep_list.begin(), keep_list.end());
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const auto users = value_users(g);
  auto node_of = [&](ValueId v) { return g.value(v).node; };

  // add(y, r) or add(r, y), no broadcast, y read by the add alone (through one reshape at
  // most), made by a linear: the linear moves to the add's place (its inputs exist by
  // then, and nothing else reads y) and takes r as its addend.
  std::vector<ResidualFusion> at(static_cast<size_t>(nn));
  std::vector<bool> gone(static_cast<size_t>(nn), false);
  for (int k = 0; k < nn; ++k) {
    const Node& a = nodes[static_cast<size_t>(k)];
    if (a.op != Op::add || a.in.size() != 2 || a.in[0] == a.in[1]) continue;
    const TensorType& t = g.value(a.out[0]).type;
    if (g.value(a.in[0]).type != t || g.value(a.in[1]).type != t) continue;
    for (int side = 0; side < 2; ++side) {
      ResidualFusion f;
      ValueId y = a.in[static_cast<size_t>(side)];
      int p = node_of(y);
      if (p < 0 || only_user(users, keep, y) != k || gone[static_cast<size_t>(p)]) continue;
      if (nodes[static_cast<size_t>(p)].op == Op::reshape) {
        f.view = p;
        y = nodes[static_cast<size_t>(p)].in[0];
        p = node_of(y);
        if (p < 0 || only_user(users, keep, y) != f.view || gone[static_cast<size_t>(p)]) continue;
      }
      if (nodes[static_cast<size_t>(p)].op != Op::linear) continue;
      f.linear = p;
      f.r = a.in[static_cast<size_t>(1 - side)];
      gone[static_cast<size_t>(p)] = true;
      if (f.view >= 0) gone[static_cast<size_t>(f.view)] = true;
      at[static_cast<size_t>(k)] = f;
      break;
    }
  }

  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    if (gone[static_cast<size_t>(k)]) continue;  // emitted at its add
    const ResidualFusion& f = at[static_cast<size_t>(k)];
    std::vector<ValueId> in;
    if (f.linear < 0) {
      for (ValueId v : n.in) in.push_back(mapped(r, v));
      copy_node(r, g, n, in);
      continue;
    }
    const Node& lin = nodes[static_cast<size_t>(f.linear)];
    const ValueId y = lin.out[0];
    const Shape& shape = g.value(y).type.shape;
    // r in y's shape (a view where the add's shape is another folding of the rows).
    ValueId addend = mapped(r, f.r);
    if (f.view >= 0) addend = ng.add(Op::reshape, {addend}, {{"shape", shape}})[0];
    in = {mapped(r, lin.in[0]), mapped(r, lin.in[1]), addend};
    if (lin.in.size() == 3) in.push_back(mapped(r, lin.in[2]));
    const ValueId sum = ng.add_named(Op::linear_add, in, {}, g.value(f.view >= 0 ? y : n.out[0]).name)[0];
    r.map[static_cast<size_t>(y)] = sum;
    if (f.view >= 0) {
      const Node& v = nodes[static_cast<size_t>(f.view)];
      r.map[static_cast<size_t>(v.out[0])] = r.map[static_cast<size_t>(n.out[0])] =
          ng.add_named(Op::reshape, {sum}, v.attrs, g.value(n.out[0]).name)[0];
    } else {
      r.map[static_cast<size_t>(n.out[0])] = sum;
    }
    ++r.forward;
  }
  return r;
}

}  // namespace seam
