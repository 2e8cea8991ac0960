// A tied weight's two gradients summed by the embedding's gradient (src/passes/fuse.h).
#include <set>
#include <vector>

#include "ops/registry.h"
#include "passes/fuse.h"

namespace seam {

namespace {

struct TiedSum {
  int embedding = -1;  // e = embedding_grad(dy, ids), read by the add alone
  ValueId other = -1;  // the add's other operand
  int add = -1;        // the add, where a cast is the match (emitted there)
  DType to{};          // the sum's dtype: the add's, or its cast's
};

}  // namespace

FuseResult sums_into_embedding_grads(const Graph& g, const std::vector<ValueId>& keep_list) {
  const std::set<ValueId> keep(keep_list.begin(), keep_list.end());
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const auto users = value_users(g);
  auto producer = [&](ValueId v) { return g.value(v).node; };

  // At node k: add(a, e) or add(e, a) of one type, e made by a two-input embedding_grad
  // and read by the add alone; or a cast of such an add's sum (read by the cast alone) to
  // the dtype its operands compute in, the mixed policy's rounding of a 16-bit weight's
  // gradient to its f32 master's.
  std::vector<TiedSum> at(static_cast<size_t>(nn));
  std::vector<bool> gone(static_cast<size_t>(nn), false);
  auto match_add = [&](int k) {
    const Node& a = nodes[static_cast<size_t>(k)];
    TiedSum f;
    if (a.op != Op::add || a.in.size() != 2 || a.in[0] == a.in[1]) return f;
    const TensorType& t = g.value(a.out[0]).type;
    if (g.value(a.in[0]).type != t || g.value(a.in[1]).type != t) return f;
    for (int side = 0; side < 2; ++side) {
      const ValueId e = a.in[static_cast<size_t>(side)];
      const int p = producer(e);
      if (p < 0 || gone[static_cast<size_t>(p)] || only_user(users, keep, e) != k) continue;
      const Node& eg = nodes[static_cast<size_t>(p)];
      if (eg.op != Op::embedding_grad || eg.in.size() != 2) continue;
      f.embedding = p;
      f.other = a.in[static_cast<size_t>(1 - side)];
      f.to = t.dtype;
      return f;
    }
    return f;
  };
  // Casts first: their adds come before them and would match alone.
  for (int pass = 0; pass < 2; ++pass)
    for (int k = 0; k < nn; ++k) {
      const Node& n = nodes[static_cast<size_t>(k)];
      if (gone[static_cast<size_t>(k)] || n.op != (pass == 0 ? Op::cast : Op::add)) continue;
      TiedSum f;
      if (pass == 0) {
        const ValueId s = n.in[0];
        const int a = producer(s);
        const DType from = g.value(s).type.dtype, to = g.value(n.out[0]).type.dtype;
        if (a < 0 || gone[static_cast<size_t>(a)] || !is_half(from) || to != compute_dtype(from) ||
            only_user(users, keep, s) != k)
          continue;
        f = match_add(a);
        if (f.embedding < 0) continue;
        f.add = a;
        f.to = to;
        gone[static_cast<size_t>(a)] = true;
      } else {
        f = match_add(k);
        if (f.embedding < 0) continue;
      }
      gone[static_cast<size_t>(f.embedding)] = true;
      at[static_cast<size_t>(k)] = f;
    }

  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    if (gone[static_cast<size_t>(k)]) continue;  // emitted at its add or cast
    const TiedSum& f = at[static_cast<size_t>(k)];
    std::vector<ValueId> in;
    if (f.embedding < 0) {
      for (ValueId v : n.in) in.push_back(mapped(r, v));
      copy_node(r, g, n, in);
      continue;
    }
    const Node& eg = nodes[static_cast<size_t>(f.embedding)];
    // The other gradient in the sum's dtype: a cast that fold_casts takes into the GEMM
    // that makes it, which then writes f32.
    ValueId acc = mapped(r, f.other);
    if (ng.value(acc).type.dtype != f.to) {
      std::string name = g.value(f.other).name + "." + dtype_name(f.to);
      for (int i = 2; ng.find(name); ++i) name = g.value(f.other).name + "." + dtype_name(f.to) + "_" + std::to_string(i);
      acc = ng.add_named(Op::cast, {acc}, {{"dtype", std::string(dtype_name(f.to))}}, name)[0];
    }
    const ValueId sum = ng.add_named(Op::embedding_grad, {mapped(r, eg.in[0]), mapped(r, eg.in[1]), acc}, eg.attrs,
                                     g.value(n.out[0]).name)[0];
    r.map[static_cast<size_t>(n.out[0])] = sum;
    if (f.add >= 0) r.map[static_cast<size_t>(nodes[static_cast<size_t>(f.add)].out[0])] = -1;
    ++r.backward;
  }
  return r;
}

}  // namespace seam
