// Layers with their parameters.
#include "seam/nn.h"

#include <cmath>

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
  Var gamma = g.param(name + ".weight", {d}, Init::ones(), false, x.dtype());
  Var beta = g.param(name + ".bias", {d}, Init::zeros(), false, x.dtype());
  return seam::layer_norm(x, gamma, beta, eps);
}

Var position_embedding(Var x, int64_t num, const std::string& name) {
  Graph& g = x.graph();
  if (x.rank() != 3) fail("position_embedding layer '", name, "': input ", g.describe(x.id()), " is not [B, T, C]");
  const int64_t T = x.dim(1);
  if (num < 1 || T > num)
    fail("position_embedding layer '", name, "': a sequence of ", T, " positions is longer than its ", num, " rows");
  Var w = g.param(name + ".weight", {num, x.dim(2)}, Init::normal(0, 0.02), true, x.dtype());
  return add(x, T == num ? w : slice(w, 0, 0, T));
}

Var embedding(Var ids, int64_t num, int64_t dim, const std::string& name) {
  Var w = ids.graph().param(name + ".weight", {num, dim}, Init::normal(0, 1));
  return seam::embedding(ids, w);
}

void GptConfig::validate() const {
  auto positive = [](const char* what, int64_t v) {
    if (v < 1) fail("gpt: ", what, " must be >= 1, got ", v);
  };
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  positive("vocab", vocab);
  positive("block_size", block_size);
  if (n_embd % n_head != 0) fail("gpt: n_embd ", n_embd, " is not divisible by n_head ", n_head);
  if (padded_vocab != 0 && padded_vocab < vocab)
    fail("gpt: padded_vocab ", padded_vocab, " is smaller than vocab ", vocab);
  if (!(dropout >= 0 && dropout < 1)) fail("gpt: dropout must be in [0, 1), got ", dropout);
  if (!(ln_eps > 0)) fail("gpt: ln_eps must be > 0, got ", ln_eps);
}

namespace {

// GPT-2's linear layer: weight N(0, std), bias zero (and no weight decay on it).
Var gpt_linear(Var x, int64_t out, const std::string& name, double std) {
  Graph& g = x.graph();
  Var w = g.param(name + ".weight", {out, x.dim(-1)}, Init::normal(0, std), true, x.dtype());
  Var b = g.param(name + ".bias", {out}, Init::zeros(), /*decay=*/false, x.dtype());
  return seam::linear(x, w, b);
}

Var maybe_dropout(Var x, double p) { return p > 0 ? dropout(x, p) : x; }

// Causal self-attention on x [B, T, C]: one projection to q, k and v, attention on its
// heads where the projection wrote them, the output projection.
Var self_attention(Var x, const GptConfig& c, const std::string& name, double proj_std) {
  const int64_t B = x.dim(0), T = x.dim(1), C = c.n_embd, H = c.n_head, D = C / H;
  Var qkv = gpt_linear(x, 3 * C, name + ".c_attn", 0.02);
  // [B, T, 3, H, D] in, [B, T, H, D] out: no copy splits or merges the heads.
  Var y = attention_qkv(reshape(qkv, {B, T, 3, H, D}), /*causal=*/true, std::nullopt, c.dropout);  // GPT-2's attn_pdrop
  y = reshape(y, {B, T, C});
  return gpt_linear(y, C, name + ".c_proj", proj_std);
}

}  // namespace

Var gpt(Var tokens, const GptConfig& c) {
  c.validate();
  Graph& g = tokens.graph();
  if (tokens.rank() != 2 || tokens.dtype() != DType::i32)
    fail("gpt: tokens must be i32 [batch, time], got ", g.describe(tokens.id()));
  const int64_t T = tokens.dim(1), C = c.n_embd;
  if (T > c.block_size) fail("gpt: a sequence of ", T, " tokens is longer than block_size ", c.block_size);
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  Var wte = g.param("wte.weight", {c.rows(), C}, Init::normal(0, 0.02), true, c.dtype);
  Var x = maybe_dropout(position_embedding(seam::embedding(tokens, wte), c.block_size, "wpe"), c.dropout);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l);
    auto scope = g.scope(h);
    x = add(x, maybe_dropout(self_attention(layer_norm(x, h + ".ln_1", c.ln_eps), c, h + ".attn", proj_std), c.dropout));
    Var m = gelu(gpt_linear(layer_norm(x, h + ".ln_2", c.ln_eps), 4 * C, h + ".mlp.c_fc", 0.02), true);
    x = add(x, maybe_dropout(gpt_linear(m, C, h + ".mlp.c_proj", proj_std), c.dropout));
  }
  x = layer_norm(x, "ln_f", c.ln_eps);
  Var logits = c.tie_weights ? seam::linear(x, wte)
                             : seam::linear(x, g.param("lm_head.weight", {c.rows(), C}, Init::normal(0, 0.02), true, c.dtype));
  return c.rows() == c.vocab ? logits : slice(logits, 2, 0, c.vocab);
}

double gpt_forward_flops_per_token(const GptConfig& c, int64_t T) {
  const auto L = static_cast<double>(c.n_layer), C = static_cast<double>(c.n_embd);
  const double weights = L * 12.0 * C * C + static_cast<double>(c.rows()) * C;  // per layer: qkv 3, proj 1, MLP 8
  const double attention = L * 2.0 * static_cast<double>(T) * C;               // q k^T and p v, per query
  return 2.0 * (weights + attention);
}

}  // namespace seam::nn
