// layer_norm (over the last dim) and batch_norm (per channel: axis 1, or the last axis of a
// 4-d value with layout nhwc). Both save the
// mean and reciprocal standard deviation as extra outputs for their backward nodes.
#include "ops/registry.h"

namespace seam {

namespace {
// batch_norm's `activation`: "none" or "relu"; true for relu.
bool expect_activation(const InferCtx& c) {
  const std::string& a = c.attrs.s("activation");
  if (a != "none" && a != "relu") c.fail("activation must be \"none\" or \"relu\", got \"", a, "\"");
  return a == "relu";
}
}  // namespace

void register_norm(OpTable& t) {
  {
    OpDef& d = def(t, Op::layer_norm);
    d.name = "layer_norm";
    d.inputs = {"x", "gamma", "beta"};
    d.outputs = {"y", "mean", "rstd"};
    d.attrs = {{"eps", 1e-5}};
    d.doc = "y = (x - mean) * rstd * gamma + beta over the last dim; gamma, beta, mean and rstd "
            "in x's dtype or the one it computes in (f32 for 16-bit x)";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      c.expect_dtype_or_compute(0, {1, 2});
      if (c.type(1).dtype != c.type(2).dtype) c.fail("gamma and beta must share one dtype");
      if (c.shape(0).empty()) c.fail("x needs rank >= 1");
      Shape dim{c.shape(0).back()};
      if (c.shape(1) != dim || c.shape(2) != dim)
        c.fail("gamma and beta must have shape ", shape_str(dim));
      Shape rows(c.shape(0).begin(), c.shape(0).end() - 1);
      DType t = compute_dtype(c.type(0).dtype);
      return std::vector<TensorType>{c.type(0), {t, rows}, {t, rows}};
    };
    d.flops = [](const OpCostCtx& c) { return 8.0 * static_cast<double>(c.in[0].numel()); };
    d.grad = [](GradCtx& c) {
      auto out = c.g.add(Op::layer_norm_grad,
                         {c.dy().id(), c.x(0).id(), c.y(1).id(), c.y(2).id(), c.x(1).id()}, c.attrs());
      for (size_t i = 0; i < 3; ++i) c.set(i, c.g.var(out[i]));
    };
  }
  {
    OpDef& d = def(t, Op::layer_norm_grad);
    d.name = "layer_norm_grad";
    d.inputs = {"dy", "x", "mean", "rstd", "gamma", "dr?"};
    d.outputs = {"dx", "dgamma", "dbeta", "dx_sums?"};
    d.attrs = {{"eps", 1e-5}, {"dx_sums", int64_t{0}}, {"from_output", int64_t{0}}};
    d.doc = "gradients of layer_norm; with dr (x's other gradient, of x's dtype and shape: "
            "sum_into_norm_grads), dx = layer norm's own input gradient + dr, added as dx is stored; "
            "dx_sums 1: also dx's column sums (of dx as stored, in gamma's dtype: the bias gradient of "
            "a linear layer whose output gradient dx is, bias_grads_into_norm_grads); from_output 1: "
            "x is the norm's output y and mean is beta, xhat = (y - beta) / gamma (norm_grads_from_outputs)";
    d.infer = [](const InferCtx& c) {
      c.expect_float(1);
      if (c.type(0).dtype != c.type(1).dtype) c.fail("dy and x must share one dtype");
      c.expect_dtype_or_compute(1, {4});
      const int64_t from_output = c.attrs.i("from_output");
      if (from_output != 0 && from_output != 1) c.fail("from_output must be 0 or 1, got ", from_output);
      if (from_output && c.type(2) != c.type(4))
        c.fail("beta must be gamma's type ", c.type(4).str(), ", got ", c.type(2).str());
      for (size_t i : {2, 3})
        if ((i == 3 || !from_output) && c.type(i).dtype != compute_dtype(c.type(1).dtype))
          c.fail("mean and rstd must be ", dtype_name(compute_dtype(c.type(1).dtype)));
      if (c.shape(0) != c.shape(1)) c.fail("dy and x differ in shape");
      if (c.in.size() == 6 && c.type(5) != c.type(1))
        c.fail("dr must be x's dtype and shape ", c.type(1).str(), ", got ", c.type(5).str());
      const int64_t sums = c.attrs.i("dx_sums");
      if (sums != 0 && sums != 1) c.fail("dx_sums must be 0 or 1, got ", sums);
      std::vector<TensorType> out{c.type(1), c.type(4), c.type(4)};
      if (sums) out.push_back(c.type(4));
      return out;
    };
    d.flops = [](const OpCostCtx& c) { return 10.0 * static_cast<double>(c.in[0].numel()); };
  }
  {
    OpDef& d = def(t, Op::batch_norm);
    d.name = "batch_norm";
    d.inputs = {"x", "gamma", "beta", "running_mean", "running_var", "z?"};
    d.outputs = {"y", "mean", "invstd"};
    d.attrs = {{"momentum", 0.1},
               {"eps", 1e-5},
               {"training", int64_t{1}},
               {"layout", std::string("nchw")},
               {"activation", std::string("none")}};
    d.doc = "per-channel normalization of [N, C, ...]; training uses batch statistics and "
            "updates the running ones (unbiased variance), evaluation uses the running ones; "
            "activation relu: y = relu(normalized), or relu(normalized + z) with a residual z of x's "
            "dtype and shape (fuse_norm_activations)";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      const bool act = expect_activation(c);
      if (c.in.size() == 6) {
        if (!act) c.fail("a residual z is given with activation relu only");
        if (c.type(5).dtype != c.type(0).dtype || c.shape(5) != c.shape(0))
          c.fail("z must be x's dtype and shape ", c.type(0).str(), ", got ", c.type(5).str());
      }
      c.expect_dtype_or_compute(0, {1, 2, 3, 4});
      for (size_t i = 2; i < 5; ++i)
        if (c.type(i).dtype != c.type(1).dtype) c.fail("gamma, beta and the running statistics must share one dtype");
      const Shape& x = c.shape(0);
      if (x.size() < 2) c.fail("x needs rank >= 2 ([N, C, ...])");
      if (c.nhwc() && x.size() != 4) c.fail("x must be [N, H, W, C] (layout nhwc), got ", shape_str(x));
      Shape ch{c.nhwc() ? x[3] : x[1]};
      for (size_t i = 1; i < 5; ++i)
        if (c.shape(i) != ch) c.fail("input ", i, " must have shape ", shape_str(ch));
      for (size_t i = 3; i < 5; ++i)
        if (c.g.value(c.in[i]).kind != ValueKind::state)
          c.fail(i == 3 ? "running_mean" : "running_var", " must be a state value (Graph::state)");
      DType t = compute_dtype(c.type(0).dtype);
      return std::vector<TensorType>{c.type(0), {t, ch}, {t, ch}};
    };
    d.flops = [](const OpCostCtx& c) { return 8.0 * static_cast<double>(c.in[0].numel()); };
    d.grad = [](GradCtx& c) {
      std::vector<ValueId> in{c.dy().id(), c.x(0).id(), c.x(1).id(), c.y(1).id(), c.y(2).id()};
      const std::string act = c.attrs().s("activation");
      const bool residual = c.node.in.size() == 6;
      if (act != "none") in.insert(in.end(), {c.x(2).id(), c.y(0).id()});  // beta, y: the activation's mask
      // With a residual, relu's masked gradient reaches z as it reaches the normalized
      // value: the gradient step writes it as dz.
      auto out = c.g.add(Op::batch_norm_grad, in,
                         {{"training", c.attrs().i("training")},
                          {"layout", c.attrs().s("layout")},
                          {"activation", act},
                          {"residual", int64_t{residual}}});
      for (size_t i = 0; i < out.size(); ++i) c.set(i == 3 ? 5 : i, c.g.var(out[i]));
    };
  }
  {
    OpDef& d = def(t, Op::batch_norm_grad);
    d.name = "batch_norm_grad";
    d.inputs = {"dy", "x", "gamma", "mean", "invstd", "beta?", "y?"};
    d.outputs = {"dx", "dgamma", "dbeta", "dz?"};
    d.attrs = {{"training", int64_t{1}},
               {"layout", std::string("nchw")},
               {"activation", std::string("none")},
               {"residual", int64_t{0}}};
    d.doc = "gradients of batch_norm (through the batch statistics when training); activation relu: "
            "dy is the gradient of relu's output y, and beta and y are given; residual 1 (with relu): "
            "also dz, relu's masked gradient, which the forward's residual z receives";
    d.infer = [](const InferCtx& c) {
      c.expect_float(1);
      const bool act = expect_activation(c);
      if (act != (c.in.size() == 7)) c.fail("beta and y are given with an activation, and only then");
      const int64_t residual = c.attrs.i("residual");
      if (residual != 0 && residual != 1) c.fail("residual must be 0 or 1, got ", residual);
      if (residual && !act) c.fail("residual 1 needs activation relu");
      // Layout tags may differ (a user's [N, H, W, C] input beside a layout pass's nhwc value).
      if (act && (c.type(6).dtype != c.type(1).dtype || c.shape(6) != c.shape(1)))
        c.fail("y must be x's dtype and shape ", c.type(1).str(), ", got ", c.type(6).str());
      if (act && c.type(5).dtype != c.type(2).dtype) c.fail("beta must share gamma's dtype");
      if (act && c.shape(5) != c.shape(2)) c.fail("beta must have gamma's shape ", shape_str(c.shape(2)));
      if (c.type(0).dtype != c.type(1).dtype) c.fail("dy and x must share one dtype");
      c.expect_dtype_or_compute(1, {2});
      for (size_t i : {3, 4})
        if (c.type(i).dtype != compute_dtype(c.type(1).dtype)) c.fail("mean and invstd must be ", dtype_name(compute_dtype(c.type(1).dtype)));
      if (c.shape(0) != c.shape(1)) c.fail("dy and x differ in shape");
      if (c.nhwc() && c.shape(1).size() != 4) c.fail("x must be [N, H, W, C] (layout nhwc), got ", shape_str(c.shape(1)));
      std::vector<TensorType> out{c.type(1), c.type(2), c.type(2)};
      if (residual) out.push_back(c.type(0));
      return out;
    };
    d.flops = [](const OpCostCtx& c) { return 10.0 * static_cast<double>(c.in[0].numel()); };
  }
}

Var layer_norm(Var x, Var gamma, Var beta, double eps) {
  return x.graph().add1(Op::layer_norm, {x.id(), gamma.id(), beta.id()}, {{"eps", eps}});
}

Var batch_norm(Var x, Var gamma, Var beta, Var running_mean, Var running_var, double momentum,
               double eps) {
  return x.graph().add1(Op::batch_norm,
                        {x.id(), gamma.id(), beta.id(), running_mean.id(), running_var.id()},
                        {{"momentum", momentum}, {"eps", eps}});
}

}  // namespace seam
