// Transposes folded into GEMMs (src/passes/fuse.h): a matmul operand that a transpose of
// its last two dims made is read in place, with the matmul's transpose flag flipped; and
// such a transpose of a matmul's result is the matmul of the operands swapped,
// (A B)^T = B^T A^T.
#include <string>

#include "passes/fuse.h"

namespace seam {

namespace {

// perm swaps the last two dims and keeps the others in place.
bool swaps_last_two(const std::vector<int64_t>& perm) {
  const size_t r = perm.size();
  if (r < 2 || perm[r - 1] != static_cast<int64_t>(r - 2) || perm[r - 2] != static_cast<int64_t>(r - 1)) return false;
  for (size_t i = 0; i + 2 < r; ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

}  // namespace

FuseResult fold_matmul_transposes(const Graph& g, const std::vector<ValueId>& keep_list) {
  const auto& nodes = g.nodes();
  const std::set<ValueId> keep(keep_list.begin(), keep_list.end());
  const auto users = value_users(g);
  auto swap_node = [&](int k) {
    return k >= 0 && nodes[static_cast<size_t>(k)].op == Op::transpose &&
           swaps_last_two(nodes[static_cast<size_t>(k)].attrs.ints("perm"));
  };
  auto made_by_swap = [&](ValueId v) { return swap_node(g.value(v).node); };
  // absorbed[k]: matmul k, whose one reader is such a transpose, is emitted there instead,
  // its operands swapped.
  std::vector<bool> absorbed(nodes.size(), false);
  for (size_t k = 0; k < nodes.size(); ++k)
    if (nodes[k].op == Op::matmul && nodes[k].in.size() == 2)  // (a b + c)^T is no swap of a and b
      absorbed[k] = swap_node(only_user(users, keep, nodes[k].out[0]));
  // A transpose every reader of which folds it (and that no one keeps) is dropped.
  std::vector<size_t> folded_reads(nodes.size(), 0);
  for (size_t k = 0; k < nodes.size(); ++k)
    if (nodes[k].op == Op::matmul)
      for (size_t i = 0; i < 2; ++i)
        if (made_by_swap(nodes[k].in[i])) ++folded_reads[static_cast<size_t>(g.value(nodes[k].in[i]).node)];

  FuseResult r = start_rebuild(g);
  // Matmul mm's operands, read through the transposes that fold, into in and attrs.
  auto operands = [&](const Node& mm, std::vector<ValueId>& in, Attrs& attrs) {
    for (size_t i = 0; i < 2; ++i) {
      ValueId v = mm.in[i];
      if (made_by_swap(v)) {
        const char* flag = i == 0 ? "transpose_a" : "transpose_b";
        attrs.set(flag, int64_t{1} - attrs.i(flag));
        v = nodes[static_cast<size_t>(g.value(v).node)].in[0];
        ++r.forward;
      }
      in.push_back(mapped(r, v));
    }
  };
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    if (absorbed[k]) continue;  // at its transpose's place
    std::vector<ValueId> in;
    Attrs attrs = n.attrs;
    Op op = n.op;
    const int from = n.op == Op::transpose ? g.value(n.in[0]).node : -1;
    if (from >= 0 && absorbed[static_cast<size_t>(from)]) {
      const Node& mm = nodes[static_cast<size_t>(from)];
      Attrs mm_attrs = mm.attrs;
      std::vector<ValueId> ab;
      operands(mm, ab, mm_attrs);
      op = Op::matmul;
      attrs = mm_attrs;
      attrs.set("transpose_a", int64_t{1} - mm_attrs.i("transpose_b"));
      attrs.set("transpose_b", int64_t{1} - mm_attrs.i("transpose_a"));
      in = {ab[1], ab[0]};
      ++r.backward;
    } else if (n.op == Op::transpose && folded_reads[k] > 0 && !keep.count(n.out[0]) &&
               folded_reads[k] == users[static_cast<size_t>(n.out[0])].size()) {
      continue;  // its readers read its input instead
    } else if (n.op == Op::matmul) {
      operands(n, in, attrs);
      for (size_t i = 2; i < n.in.size(); ++i) in.push_back(mapped(r, n.in[i]));  // the addend
    } else {
      for (ValueId v : n.in) in.push_back(mapped(r, v));
    }
    std::vector<std::string> names;
    for (ValueId v : n.out) names.push_back(g.value(v).name);
    const auto out = n.out.empty() ? r.graph.add_named(op, in, attrs, n.name) : r.graph.add_named(op, in, attrs, names);
    for (size_t i = 0; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
  }
  return r;
}

}  // namespace seam
