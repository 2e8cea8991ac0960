// Reverse-mode differentiation.
#include "autodiff/autodiff.h"

#include "ops/registry.h"

namespace seam {

std::vector<ValueId> autodiff(Graph& g, ValueId loss, const std::vector<ValueId>& wrt, std::optional<ValueId> seed) {
  const Value& lv = g.value(loss);
  if (!is_float(lv.type.dtype) || lv.type.numel() != 1)
    fail("the loss must be a floating-point scalar, got ", g.describe(loss));

  // Which values depend on a value of wrt (only those can carry a gradient).
  const size_t nvalues = g.values().size();
  const int nnodes = static_cast<int>(g.nodes().size());
  std::vector<bool> requires_grad(nvalues, false);
  for (ValueId w : wrt) requires_grad[static_cast<size_t>(w)] = is_float(g.value(w).type.dtype);
  for (int k = 0; k < nnodes; ++k) {
    const Node& n = g.node(k);
    if (!op_def(n.op).grad) continue;
    bool any = false;
    for (ValueId i : n.in) any = any || requires_grad[static_cast<size_t>(i)];
    if (!any) continue;
    for (ValueId o : n.out) requires_grad[static_cast<size_t>(o)] = is_float(g.value(o).type.dtype);
  }

  std::vector<ValueId> grad(nvalues, -1);
  if (!requires_grad[static_cast<size_t>(loss)]) return std::vector<ValueId>(wrt.size(), -1);
  grad[static_cast<size_t>(loss)] = seed ? *seed : full(g, lv.type.shape, 1.0, lv.type.dtype).id();

  for (int k = nnodes - 1; k >= 0; --k) {
    const Node& n = g.node(k);
    const OpDef& d = op_def(n.op);
    if (!d.grad) continue;
    GradCtx c{g, n, {}, {}, {}};
    bool any_dy = false;
    for (ValueId o : n.out) {
      c.dys.push_back(grad[static_cast<size_t>(o)]);
      any_dy = any_dy || grad[static_cast<size_t>(o)] >= 0;
    }
    if (!any_dy) continue;
    bool any_want = false;
    for (ValueId i : n.in) {
      c.wants.push_back(requires_grad[static_cast<size_t>(i)]);
      any_want = any_want || c.wants.back();
    }
    if (!any_want) continue;
    // Only the first output of an op is differentiable; the others are saved statistics.
    for (size_t o = 1; o < n.out.size(); ++o)
      if (c.dys[o] >= 0)
        fail("gradient through output ", g.describe(n.out[o]), " of ", op_name(n.op), " node '",
             n.name, "' is not supported: only its first output is differentiable");
    c.dxs.assign(n.in.size(), -1);
    d.grad(c);
    for (size_t i = 0; i < c.node.in.size(); ++i) {
      ValueId dx = c.dxs[i];
      if (dx < 0) continue;
      ValueId x = c.node.in[i];
      // An op that computes in f32 on 16-bit inputs (a sum into f32, a loss) gives an f32
      // gradient; a value's gradient has the value's own dtype.
      if (g.value(dx).type.shape == g.value(x).type.shape && g.value(dx).type.dtype != g.value(x).type.dtype &&
          is_float(g.value(x).type.dtype))
        dx = cast(g.var(dx), g.value(x).type.dtype).id();
      // The layout tag may differ: a gradient made by broadcasting has no operand to take
      // channels-last order from, and the tag only describes (src/ops/layout.h).
      if (g.value(dx).type.shape != g.value(x).type.shape || g.value(dx).type.dtype != g.value(x).type.dtype)
        fail("internal error: gradient rule of ", op_name(c.node.op), " gave ", g.describe(dx),
             " for ", g.describe(x));
      ValueId& acc = grad[static_cast<size_t>(x)];
      acc = acc < 0 ? dx : add(g.var(acc), g.var(dx)).id();
    }
  }

  std::vector<ValueId> out;
  for (ValueId w : wrt) out.push_back(grad[static_cast<size_t>(w)]);
  return out;
}

}  // namespace seam
