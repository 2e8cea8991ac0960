// Batch norm + ReLU fusion (src/passes/fuse.h).
#include <set>
#include <vector>

#include "ops/registry.h"
#include "passes/fuse.h"

namespace seam {

namespace {

struct NormFusion {
  int relu = -1;       // the relu reading the normalized value (or the residual add's result)
  int add = -1;        // the residual add between them, if any
  ValueId z = -1;      // the add's other operand
  int relu_grad = -1;  // relu_grad(dr, r) feeding only the batch norm's gradient, if any
  int norm_grad = -1;  // that batch_norm_grad
};

}  // namespace

FuseResult fuse_norm_activations(const Graph& g, const std::vector<ValueId>& keep_list) {
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const std::set<ValueId> keep(keep_list.begin(), keep_list.end());
  const std::vector<std::vector<int>> users = value_users(g);
  auto only_user = [&](ValueId v) { return seam::only_user(users, keep, v); };

  std::vector<NormFusion> found(static_cast<size_t>(nn));
  std::vector<int> fused_grad_of(static_cast<size_t>(nn), -1);  // batch_norm_grad node -> its batch_norm
  std::vector<bool> absorbed(static_cast<size_t>(nn), false);
  for (int k = 0; k < nn; ++k) {
    const Node& bn = nodes[static_cast<size_t>(k)];
    if (bn.op != Op::batch_norm || !without_activation(bn)) continue;
    NormFusion f;
    int relu = only_user(bn.out[0]);
    if (relu >= 0 && nodes[static_cast<size_t>(relu)].op == Op::add && !absorbed[static_cast<size_t>(relu)]) {
      // relu(normalized + z): z of the normalized value's type, made before this batch norm
      // (the fused step takes its place), and the sum read by the relu alone.
      const Node& add = nodes[static_cast<size_t>(relu)];
      const ValueId z = add.in[0] == bn.out[0] ? add.in[1] : add.in[0];
      const int z_node = g.value(z).node;
      f.add = relu;
      f.z = z;
      relu = only_user(add.out[0]);
      if (z == bn.out[0] || g.value(z).type.dtype != g.value(bn.out[0]).type.dtype ||
          g.value(z).type.shape != g.value(bn.out[0]).type.shape || z_node >= k)
        relu = -1;
    }
    if (relu < 0 || nodes[static_cast<size_t>(relu)].op != Op::relu) continue;
    f.relu = relu;
    // The backward: relu_grad(dr, r) feeding this batch norm's gradient. Without a
    // residual the batch norm's gradient must be its only reader; with one, the masked
    // gradient is z's too, and the fused gradient step writes it as dz for z's readers.
    const ValueId r = nodes[static_cast<size_t>(relu)].out[0];
    auto matches = [&](int bg, ValueId dr) {
      const Node& ng = nodes[static_cast<size_t>(bg)];
      return ng.op == Op::batch_norm_grad && without_activation(ng) && ng.in[0] == dr && ng.in[1] == bn.in[0] &&
             ng.in[2] == bn.in[1] && ng.in[3] == bn.out[1] && ng.in[4] == bn.out[2];
    };
    for (int u : users[static_cast<size_t>(r)]) {
      const Node& rg = nodes[static_cast<size_t>(u)];
      if (rg.op != Op::relu_grad || rg.in[1] != r || f.relu_grad >= 0) continue;
      const std::vector<int> readers =
          f.add >= 0 ? users[static_cast<size_t>(rg.out[0])] : std::vector<int>{only_user(rg.out[0])};
      for (int bg : readers)
        if (bg >= 0 && matches(bg, rg.out[0])) {
          f.relu_grad = u;
          f.norm_grad = bg;
          break;
        }
    }
    found[static_cast<size_t>(k)] = f;
    absorbed[static_cast<size_t>(relu)] = true;
    if (f.add >= 0) absorbed[static_cast<size_t>(f.add)] = true;
    if (f.relu_grad >= 0) {
      // Without a residual the fused gradient takes the batch norm gradient's place; with
      // one, relu_grad's, which z's readers may follow before the batch norm's gradient.
      absorbed[static_cast<size_t>(f.add >= 0 ? f.norm_grad : f.relu_grad)] = true;
      fused_grad_of[static_cast<size_t>(f.add >= 0 ? f.relu_grad : f.norm_grad)] = k;
    }
  }

  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  auto names_of = [&](const Node& n) {
    std::vector<std::string> names;
    for (ValueId v : n.out) names.push_back(g.value(v).name);
    return names;
  };
  auto emit = [&](const Node& n, const std::vector<ValueId>& in, const Attrs& attrs, std::vector<std::string> names) {
    return names.empty() ? ng.add_named(n.op, in, attrs, n.name) : ng.add_named(n.op, in, attrs, names);
  };
  for (int k = 0; k < nn; ++k) {
    if (absorbed[static_cast<size_t>(k)]) continue;
    const Node& n = nodes[static_cast<size_t>(k)];
    const int grad_of = fused_grad_of[static_cast<size_t>(k)];
    if (grad_of >= 0 && n.op == Op::relu_grad) {
      // relu_grad + batch_norm_grad of a residual block's closing batch norm: one step
      // writing dx, dgamma, dbeta and the masked gradient dz (relu_grad's value and name).
      const NormFusion& f = found[static_cast<size_t>(grad_of)];
      const Node& norm = nodes[static_cast<size_t>(grad_of)];
      const Node& bg = nodes[static_cast<size_t>(f.norm_grad)];
      std::vector<ValueId> in{mapped(r, n.in[0])};
      for (size_t i = 1; i < bg.in.size(); ++i) in.push_back(mapped(r, bg.in[i]));
      in.push_back(mapped(r, norm.in[2]));
      in.push_back(mapped(r, n.in[1]));
      Attrs attrs = bg.attrs;
      attrs.set("activation", std::string("relu"));
      attrs.set("residual", int64_t{1});
      std::vector<std::string> names = names_of(bg);
      names.push_back(g.value(n.out[0]).name);
      auto out = emit(bg, in, attrs, names);
      for (size_t i = 0; i < 3; ++i) r.map[static_cast<size_t>(bg.out[i])] = out[i];
      r.map[static_cast<size_t>(n.out[0])] = out[3];
      ++r.backward;
      continue;
    }
    std::vector<ValueId> in;
    for (size_t i = 0; i < n.in.size(); ++i) in.push_back(grad_of >= 0 && i == 0 ? -1 : mapped(r, n.in[i]));
    Attrs attrs = n.attrs;
    std::vector<std::string> names = names_of(n);
    const NormFusion& f = found[static_cast<size_t>(k)];
    if (f.relu >= 0) {
      // The normalized value takes relu's place (and name); it is never stored unfused.
      const Node& relu = nodes[static_cast<size_t>(f.relu)];
      attrs.set("activation", std::string("relu"));
      if (f.add >= 0) in.push_back(mapped(r, f.z));
      names[0] = g.value(relu.out[0]).name;
      auto out = emit(n, in, attrs, names);
      r.map[static_cast<size_t>(relu.out[0])] = out[0];
      for (size_t i = 1; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
      ++r.forward;
      continue;
    }
    if (grad_of >= 0) {
      // dy is relu's incoming gradient; beta and relu's output give cuDNN its mask.
      const Node& norm = nodes[static_cast<size_t>(grad_of)];
      const Node& rg = nodes[static_cast<size_t>(found[static_cast<size_t>(grad_of)].relu_grad)];
      in[0] = mapped(r, rg.in[0]);
      in.push_back(mapped(r, norm.in[2]));
      in.push_back(mapped(r, rg.in[1]));
      attrs.set("activation", std::string("relu"));
      ++r.backward;
    }
    auto out = emit(n, in, attrs, names);
    for (size_t i = 0; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
  }
  return r;
}

}  // namespace seam

namespace seam {

FuseResult sum_into_norm_grads(const Graph& g, const std::vector<ValueId>& keep_list) {
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const std::set<ValueId> keep(keep_list.begin(), keep_list.end());
  const std::vector<std::vector<int>> users = value_users(g);

  // layer_norm_grad -> the add whose other side it takes; add -> absorbed.
  std::vector<int> add_of(static_cast<size_t>(nn), -1);
  std::vector<bool> absorbed(static_cast<size_t>(nn), false);
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    if (n.op != Op::add || n.in.size() != 2 || n.in[0] == n.in[1]) continue;
    const TensorType& t = g.value(n.out[0]).type;
    // Of two sides that are layer norm gradients, the later takes the earlier, which is
    // then ready when it runs; the other side must exist by the gradient's own place.
    int best = -1;
    for (ValueId side : n.in) {
      const int p = g.value(side).node;
      if (p < 0 || only_user(users, keep, side) != k || add_of[static_cast<size_t>(p)] >= 0) continue;
      const Node& d = nodes[static_cast<size_t>(p)];
      const ValueId other = n.in[0] == side ? n.in[1] : n.in[0];
      if (d.op == Op::layer_norm_grad && d.in.size() == 5 && d.out[0] == side && g.value(other).type == t &&
          g.value(side).type == t && g.value(other).node < p && p > best)
        best = p;
    }
    if (best >= 0) {
      add_of[static_cast<size_t>(best)] = k;
      absorbed[static_cast<size_t>(k)] = true;
    }
  }

  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  for (int k = 0; k < nn; ++k) {
    if (absorbed[static_cast<size_t>(k)]) continue;
    const Node& n = nodes[static_cast<size_t>(k)];
    std::vector<ValueId> in;
    for (ValueId v : n.in) in.push_back(mapped(r, v));
    std::vector<std::string> names;
    for (ValueId v : n.out) names.push_back(g.value(v).name);
    const int add = add_of[static_cast<size_t>(k)];
    if (add >= 0) {
      // dx takes the add's value and name; dgamma and dbeta stay as they were.
      const Node& sum = nodes[static_cast<size_t>(add)];
      in.push_back(mapped(r, sum.in[0] == n.out[0] ? sum.in[1] : sum.in[0]));
      names[0] = g.value(sum.out[0]).name;
      auto out = ng.add_named(n.op, in, n.attrs, names);
      r.map[static_cast<size_t>(sum.out[0])] = out[0];
      for (size_t i = 1; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
      ++r.backward;
      continue;
    }
    copy_node(r, g, n, in);
  }
  return r;
}

}  // namespace seam
