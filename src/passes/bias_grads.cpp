// A linear layer's bias gradient from the backward op that makes its output gradient:
// bias_grads_into_norm_grads (layer_norm_grad) and bias_grads_into_act_grads
// (matmul_act_grad). See passes/fuse.h.
#include <functional>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "passes/fuse.h"

namespace seam {
namespace {

// linear_grad_weight_bias(dy, x) whose dy is out[0] of a node `takes` accepts (or out[0]
// with its rows folded by reshapes) becomes a matmul for dw alone, while that node, with
// the attributes `sums` gives it, writes db as one more output (under db's name).
FuseResult bias_grads_into(const Graph& g, const std::function<bool(const Node& maker, const Node& linear)>& takes,
                           const std::function<Attrs(const Node& maker, const Node& linear)>& sums) {
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  std::vector<int> bias_of(static_cast<size_t>(nn), -1);
  std::vector<bool> weight_only(static_cast<size_t>(nn), false);
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    if (n.op != Op::linear_grad_weight_bias) continue;
    ValueId dx = n.in[0];
    int p = g.value(dx).node;
    while (p >= 0 && nodes[static_cast<size_t>(p)].op == Op::reshape) {
      dx = nodes[static_cast<size_t>(p)].in[0];
      p = g.value(dx).node;
    }
    if (p < 0 || bias_of[static_cast<size_t>(p)] >= 0) continue;
    const Node& d = nodes[static_cast<size_t>(p)];
    // dx's columns are dy's: reshapes between them that keep the last dimension only fold rows.
    if (d.out[0] != dx || g.value(dx).type.shape.back() != g.value(n.in[0]).type.shape.back() || !takes(d, n))
      continue;
    bias_of[static_cast<size_t>(p)] = k;
    weight_only[static_cast<size_t>(k)] = true;
  }

  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    std::vector<ValueId> in;
    for (ValueId v : n.in) in.push_back(mapped(r, v));
    if (const int lin = bias_of[static_cast<size_t>(k)]; lin >= 0) {
      const Node& l = nodes[static_cast<size_t>(lin)];
      std::vector<std::string> names;
      for (ValueId v : n.out) names.push_back(g.value(v).name);
      names.push_back(g.value(l.out[1]).name);
      auto out = ng.add_named(n.op, in, sums(n, l), names);
      for (size_t i = 0; i < n.out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
      r.map[static_cast<size_t>(l.out[1])] = out[n.out.size()];
      ++r.backward;
    } else if (weight_only[static_cast<size_t>(k)]) {
      // dw = dy^T x alone, in the dtype linear_grad_weight_bias wrote it in (db: mapped at
      // the op that makes dy, which came first).
      r.map[static_cast<size_t>(n.out[0])] =
          ng.add_named(Op::matmul, in,
                       {{"transpose_a", int64_t{1}}, {"transpose_b", int64_t{0}}, {"dtype", n.attrs.s("dtype")}},
                       std::vector<std::string>{g.value(n.out[0]).name})[0];
    } else {
      copy_node(r, g, n, in);
    }
  }
  return r;
}

}  // namespace

FuseResult bias_grads_into_norm_grads(const Graph& g, const std::vector<ValueId>& keep_list) {
  (void)keep_list;  // no value disappears: db is written by the layer norm's gradient instead
  return bias_grads_into(
      g,
      [&](const Node& d, const Node& n) {  // db takes gamma's gradient's dtype
        return d.op == Op::layer_norm_grad && d.attrs.i("dx_sums") == 0 &&
               g.value(n.out[1]).type.dtype == g.value(d.out[1]).type.dtype;
      },
      [](const Node& d, const Node&) {
        Attrs attrs = d.attrs;
        attrs.set("dx_sums", int64_t{1});
        return attrs;
      });
}

FuseResult bias_grads_into_act_grads(const Graph& g, const std::vector<ValueId>& keep_list) {
  (void)keep_list;  // no value disappears: db is written by the activation's gradient instead
  return bias_grads_into(
      g, [](const Node& d, const Node&) { return d.op == Op::matmul_act_grad && d.attrs.i("dx_sums") == 0; },
      [&](const Node& d, const Node& n) {
        Attrs attrs = d.attrs;
        attrs.set("dx_sums", int64_t{1});
        attrs.set("sums_dtype", std::string(dtype_name(g.value(n.out[1]).type.dtype)));
        return attrs;
      });
}

}  // namespace seam
