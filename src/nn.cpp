// Layers with their parameters.
#include "seam/nn.h"

#include "seam/error.h"

namespace seam::nn {

Var linear(Var x, int64_t out_features, const std::string& name, bool bias) {
  Graph& g = x.graph();
  int64_t in = x.dim(-1);
  Var w = g.param(name + ".weight", {out_features, in}, Init::fan_in_uniform(in));
  if (!bias) return seam::linear(x, w);
  Var b = g.param(name + ".bias", {out_features}, Init::fan_in_uniform(in), /*decay=*/false);
  return seam::linear(x, w, b);
}

Var linear_tied(Var x, Var weight, const std::string& name, bool bias) {
  Graph& g = x.graph();
  const int64_t in = x.dim(-1);
  if (g.value(weight.id()).kind != ValueKind::param || weight.rank() != 2 || weight.dim(1) != in)
    fail("linear layer '", name, "': a tied weight must be a parameter [out, ", in, "], got ", g.describe(weight.id()));
  if (!bias) return seam::linear(x, weight);
  Var b = g.param(name + ".bias", {weight.dim(0)}, Init::fan_in_uniform(in), /*decay=*/false, weight.dtype());
  return seam::linear(x, weight, b);
}

Var conv2d(Var x, int64_t out_channels, int64_t kernel, const std::string& name,
           const Conv2dOptions& o, bool bias) {
  Graph& g = x.graph();
  if (x.rank() != 4) fail("conv2d layer '", name, "': input ", g.describe(x.id()), " is not [N, C, H, W]");
  int64_t in = x.dim(1) / o.groups;
  int64_t fan_in = in * kernel * kernel;
  Var w = g.param(name + ".weight", {out_channels, in, kernel, kernel}, Init::fan_in_uniform(fan_in));
  std::optional<Var> b;
  if (bias) b = g.param(name + ".bias", {out_channels}, Init::fan_in_uniform(fan_in), /*decay=*/false);
  return seam::conv2d(x, w, b, o);
}

Var batch_norm(Var x, const std::string& name, double momentum, double eps) {
  Graph& g = x.graph();
  if (x.rank() < 2) fail("batch_norm layer '", name, "': input ", g.describe(x.id()), " is not [N, C, ...]");
  int64_t c = x.dim(1);
  Var gamma = g.param(name + ".weight", {c}, Init::ones(), false);
  Var beta = g.param(name + ".bias", {c}, Init::zeros(), false);
  Var rm = g.state(name + ".running_mean", {c}, Init::zeros());
  Var rv = g.state(name + ".running_var", {c}, Init::ones());
  return seam::batch_norm(x, gamma, beta, rm, rv, momentum, eps);
}

Var layer_norm(Var x, const std::string& name, double eps) {
  Graph& g = x.graph();
  int64_t d = x.dim(-1);
  Var gamma = g.param(name + ".weight", {d}, Init::ones(), false);
  Var beta = g.param(name + ".bias", {d}, Init::zeros(), false);
  return seam::layer_norm(x, gamma, beta, eps);
}

Var embedding(Var ids, int64_t num, int64_t dim, const std::string& name) {
  Var w = ids.graph().param(name + ".weight", {num, dim}, Init::normal(0, 1));
  return seam::embedding(ids, w);
}

}  // namespace seam::nn
