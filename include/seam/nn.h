// Layers: builder functions that create their parameters (named "<name>.weight",
// "<name>.bias", ...) with PyTorch's default initialization, then add the op.
#pragma once
#include <string>

#include "seam/ops.h"

namespace seam::nn {

Var linear(Var x, int64_t out_features, const std::string& name, bool bias = true);
// A linear layer on another layer's weight [out, in] (an embedding's, for a language
// model's output projection): one parameter, whose gradient sums both uses. Its own bias,
// if any, is "<name>.bias".
Var linear_tied(Var x, Var weight, const std::string& name, bool bias = true);
Var conv2d(Var x, int64_t out_channels, int64_t kernel, const std::string& name,
           const Conv2dOptions& options = {}, bool bias = true);
// gamma = 1, beta = 0, running mean 0 and variance 1; gamma and beta get no weight decay.
Var batch_norm(Var x, const std::string& name, double momentum = 0.1, double eps = 1e-5);
Var layer_norm(Var x, const std::string& name, double eps = 1e-5);
// weight ~ N(0, 1), as torch.nn.Embedding.
Var embedding(Var ids, int64_t num, int64_t dim, const std::string& name);

// Learned positions: x [B, T, C] plus rows 0..T-1 of a table "<name>.weight" [num, C]
// (T <= num), N(0, 0.02) as GPT-2's, with weight decay.
Var position_embedding(Var x, int64_t num, const std::string& name);

// A GPT (GPT-2's structure): token and learned position embeddings, n_layer pre-norm
// blocks (layer norm, causal self-attention of n_head heads, residual add; layer norm,
// a 4x MLP with GELU (tanh), residual add), a final layer norm and the output projection,
// tied to the token embedding or a weight of its own. Parameters are named as GPT-2's
// ("wte.weight", "h.0.attn.c_attn.weight", ...) and initialized as GPT-2: weights
// N(0, 0.02), the residual projections' scaled by 1/sqrt(2 n_layer), biases zero, layer
// norms one and zero. The vocabulary may be padded for GEMM-friendly shapes: the
// embedding and projection have padded_vocab rows, and the padded logits are cut off.
struct GptConfig {
  int64_t n_layer = 6, n_head = 6, n_embd = 384;
  int64_t vocab = 256;
  int64_t padded_vocab = 0;  // 0: vocab
  int64_t block_size = 256;  // the longest sequence (rows of the position embedding)
  // Dropout after the embeddings, of the attention probabilities, and after the attention
  // projection and the MLP (GPT-2's embd_pdrop, attn_pdrop and resid_pdrop, all one p).
  double dropout = 0.0;
  bool tie_weights = true;
  double ln_eps = 1e-5;
  DType dtype = DType::f32;  // the parameters' (f64 for gradient checks)
  int64_t rows() const { return padded_vocab ? padded_vocab : vocab; }
  // Throws seam::Error naming the setting that is out of range.
  void validate() const;
};
// tokens: i32 [B, T] with T <= block_size; returns logits [B, T, vocab].
Var gpt(Var tokens, const GptConfig& c);
// Multiply-adds of one token's forward pass at sequence length T, times 2 (FLOPs): the
// weights' GEMMs and attention's two T x T products (counted in full, as PyTorch's and
// llm.c's MFU figures count them). A training step costs three times this per token.
double gpt_forward_flops_per_token(const GptConfig& c, int64_t T);

}  // namespace seam::nn
