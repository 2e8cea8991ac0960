// A linear layer's bias gradient from the backward op that makes its output gradient:
// bias_grads_into_norm_grads (layer_norm_grad) and bias_grads_into_act_grads
// (matmul_act_grad); else from the one that reads it for the input gradient:
// bias_grads_into_data_grads (linear_grad_input_bias). See passes/fuse.h.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "passes/fuse.h"

namespace seam {
namespace {

// dw = dy^T x alone, in the dtype linear_grad_weight_bias wrote it in, at n's place; db is
// the caller's to map.
void weight_grad_alone(FuseResult& r, const Graph& g, const Node& n, const std::vector<ValueId>& in) {
  r.map[static_cast<size_t>(n.out[0])] =
      r.graph.add_named(Op::matmul, in,
                        {{"transpose_a", int64_t{1}}, {"transpose_b", int64_t{0}}, {"dtype", n.attrs.s("dtype")}},
                        std::vector<std::string>{g.value(n.out[0]).name})[0];
}

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
      weight_grad_alone(r, g, n, in);  // db: mapped at the op that makes dy, which came first
    } else {
      copy_node(r, g, n, in);
    }
  }
  return r;
}

// A matmul that can take db: dy w as linear's gradient rule writes it, nothing added, its
// result in dy's dtype.
bool plain_data_grad(const Graph& g, const Node& d, ValueId dy) {
  return d.op == Op::matmul && d.in.size() == 2 && d.in[0] == dy && d.attrs.i("transpose_a") == 0 &&
         d.attrs.i("transpose_b") == 0 && d.attrs.s("dtype").empty() && g.value(d.in[0]).type.shape.size() == 2 &&
         g.value(d.in[1]).type.shape.size() == 2 && g.value(d.in[0]).type.dtype == g.value(d.in[1]).type.dtype;
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

FuseResult bias_grads_into_data_grads(const Graph& g, const std::vector<ValueId>& keep_list) {
  (void)keep_list;  // no value disappears: db is written by the input gradient's GEMM instead
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const auto users = value_users(g);
  std::vector<int> data_of(static_cast<size_t>(nn), -1);  // linear_grad_weight_bias -> its matmul
  std::vector<int> bias_of(static_cast<size_t>(nn), -1);  // matmul -> its linear_grad_weight_bias
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    if (n.op != Op::linear_grad_weight_bias) continue;
    for (int u : users[static_cast<size_t>(n.in[0])]) {
      if (bias_of[static_cast<size_t>(u)] >= 0 || !plain_data_grad(g, nodes[static_cast<size_t>(u)], n.in[0])) continue;
      // db moves to the matmul's place: where that is later, nothing before it may read db.
      const auto& readers = users[static_cast<size_t>(n.out[1])];
      if (std::any_of(readers.begin(), readers.end(), [&](int c) { return c < u; })) continue;
      bias_of[static_cast<size_t>(u)] = k;
      data_of[static_cast<size_t>(k)] = u;
      break;
    }
  }

  FuseResult r = start_rebuild(g);
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    std::vector<ValueId> in;
    for (ValueId v : n.in) in.push_back(mapped(r, v));
    if (const int lin = bias_of[static_cast<size_t>(k)]; lin >= 0) {
      const ValueId db = nodes[static_cast<size_t>(lin)].out[1];
      const auto out = r.graph.add_named(Op::linear_grad_input_bias, in,
                                         {{"sums_dtype", std::string(dtype_name(g.value(db).type.dtype))}},
                                         std::vector<std::string>{g.value(n.out[0]).name, g.value(db).name});
      r.map[static_cast<size_t>(n.out[0])] = out[0];
      r.map[static_cast<size_t>(db)] = out[1];
      ++r.backward;
    } else if (data_of[static_cast<size_t>(k)] >= 0) {
      weight_grad_alone(r, g, n, in);  // db: the matmul's, at its place before or after this one
    } else {
      copy_node(r, g, n, in);
    }
  }
  return r;
}

}  // namespace seam
