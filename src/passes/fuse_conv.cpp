// Convolution + ReLU fusion, and input gradients that take a second gradient into their sum
// (src/passes/fuse.h).
#include <set>
#include <vector>

#include "ops/registry.h"
#include "passes/fuse.h"

namespace seam {

FuseResult fuse_conv_activations(const Graph& g, const std::vector<ValueId>& keep_list) {
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const std::set<ValueId> keep(keep_list.begin(), keep_list.end());
  const std::vector<std::vector<int>> users = value_users(g);
  auto only_user = [&](ValueId v) { return seam::only_user(users, keep, v); };

  std::vector<int> relu_of(static_cast<size_t>(nn), -1);   // conv2d -> the relu it absorbs
  std::vector<int> conv_of(static_cast<size_t>(nn), -1);   // evaluation batch norm -> the conv2d it absorbs
  std::vector<int> dgrad_of(static_cast<size_t>(nn), -1);  // relu_grad -> the conv2d_grad_input it becomes
  std::vector<int> summed_by(static_cast<size_t>(nn), -1);  // add -> the conv2d_grad_input that takes the other side
  std::vector<bool> absorbed(static_cast<size_t>(nn), false);
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    if (n.op == Op::conv2d && without_activation(n)) {
      const int u = only_user(n.out[0]);
      const Node* user = u >= 0 ? &nodes[static_cast<size_t>(u)] : nullptr;
      if (user && user->op == Op::relu) {
        relu_of[static_cast<size_t>(k)] = u;
        absorbed[static_cast<size_t>(u)] = true;
      }
      // A batch norm with its running statistics after a convolution without a bias,
      // whose saved statistics nothing reads: what an evaluation plan runs.
      if (user && user->op == Op::batch_norm && user->in[0] == n.out[0] && user->attrs.i("training") == 0 &&
          n.in.size() == 2 && users[static_cast<size_t>(user->out[1])].empty() &&
          users[static_cast<size_t>(user->out[2])].empty() && !keep.count(user->out[1]) &&
          !keep.count(user->out[2])) {
        conv_of[static_cast<size_t>(u)] = k;  // at the batch norm's place: its z may come after the convolution
        absorbed[static_cast<size_t>(k)] = true;
      }
    }
    // relu_grad(dr, r) whose dr is an input gradient that nothing else reads: the mask
    // applies as the gradient is stored (cuDNN: dgrad with a pointwise relu backward).
    if (n.op == Op::relu_grad) {
      const int p = g.value(n.in[0]).node;
      if (p < 0 || only_user(n.in[0]) != k) continue;
      const Node& d = nodes[static_cast<size_t>(p)];
      const Value& r = g.value(n.in[1]);
      if (d.op == Op::conv2d_grad_input && d.in.size() == 2 && without_activation(d) &&
          r.type.shape == g.value(n.in[0]).type.shape &&
          r.type.dtype == g.value(n.in[0]).type.dtype) {
        dgrad_of[static_cast<size_t>(k)] = p;
        absorbed[static_cast<size_t>(p)] = true;
      }
    }
    // add(a, b), a value's two gradients (a residual block's input, read by a convolution
    // and by the shortcut), where a side is an input gradient nothing else reads: that
    // gradient adds the other side as it is stored. Of two such sides, the later one
    // takes the earlier, which is then ready when it runs.
    if (n.op == Op::add && n.in.size() == 2 && n.in[0] != n.in[1]) {
      const TensorType& t = g.value(n.out[0]).type;
      auto same = [&](ValueId v) { return g.value(v).type.shape == t.shape && g.value(v).type.dtype == t.dtype; };
      int best = -1;
      for (ValueId side : n.in) {
        const int p = g.value(side).node;
        if (p < 0 || only_user(side) != k) continue;
        const Node& d = nodes[static_cast<size_t>(p)];
        if (d.op == Op::conv2d_grad_input && d.in.size() == 2 && without_activation(d) &&
            same(n.in[0]) && same(n.in[1]) && p > best)
          best = p;
      }
      if (best >= 0) {
        summed_by[static_cast<size_t>(k)] = best;
        absorbed[static_cast<size_t>(best)] = true;
      }
    }
  }

  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  for (int k = 0; k < nn; ++k) {
    if (absorbed[static_cast<size_t>(k)]) continue;
    const Node& n = nodes[static_cast<size_t>(k)];
    if (const int p = dgrad_of[static_cast<size_t>(k)]; p >= 0) {
      const Node& d = nodes[static_cast<size_t>(p)];
      Attrs attrs = d.attrs;
      attrs.set("activation", std::string("relu"));
      const std::vector<ValueId> fused_in{mapped(r, d.in[0]), mapped(r, d.in[1]), mapped(r, n.in[1])};
      r.map[static_cast<size_t>(n.out[0])] =
          ng.add_named(d.op, fused_in, attrs, std::vector<std::string>{g.value(n.out[0]).name})[0];
      ++r.backward;
      continue;
    }
    if (const int p = summed_by[static_cast<size_t>(k)]; p >= 0) {
      const Node& d = nodes[static_cast<size_t>(p)];
      Attrs attrs = d.attrs;
      attrs.set("residual", int64_t{1});
      const ValueId z = n.in[0] == d.out[0] ? n.in[1] : n.in[0];
      const std::vector<ValueId> fused_in{mapped(r, d.in[0]), mapped(r, d.in[1]), mapped(r, z)};
      r.map[static_cast<size_t>(n.out[0])] =
          ng.add_named(d.op, fused_in, attrs, std::vector<std::string>{g.value(n.out[0]).name})[0];
      ++r.backward;
      continue;
    }
    if (const int c = conv_of[static_cast<size_t>(k)]; c >= 0) {
      const Node& conv = nodes[static_cast<size_t>(c)];
      Attrs attrs;
      for (const auto& [name, value] : conv.attrs.items())
        if (name != "activation") attrs.set(name, value);
      attrs.set("eps", n.attrs.f("eps"));
      attrs.set("activation", n.attrs.s("activation"));
      std::vector<ValueId> in{mapped(r, conv.in[0]), mapped(r, conv.in[1])};
      for (size_t i = 1; i < n.in.size(); ++i) in.push_back(mapped(r, n.in[i]));  // gamma ... running_var, z?
      r.map[static_cast<size_t>(n.out[0])] =
          ng.add_named(Op::conv2d_bn, in, attrs, std::vector<std::string>{g.value(n.out[0]).name})[0];
      ++r.forward;
      continue;
    }
    std::vector<ValueId> in;
    for (ValueId v : n.in) in.push_back(mapped(r, v));
    if (const int relu = relu_of[static_cast<size_t>(k)]; relu >= 0) {
      // The convolution writes relu's value under relu's name; its own is never stored.
      const ValueId out = nodes[static_cast<size_t>(relu)].out[0];
      Attrs attrs = n.attrs;
      attrs.set("activation", std::string("relu"));
      r.map[static_cast<size_t>(out)] = ng.add_named(n.op, in, attrs, std::vector<std::string>{g.value(out).name})[0];
      ++r.forward;
      continue;
    }
    copy_node(r, g, n, in);
  }
  return r;
}

}  // namespace seam
