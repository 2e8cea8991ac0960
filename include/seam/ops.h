// Builder functions: each adds one node to the graph its operands belong to and returns
// the node's (first) output. Shapes are checked immediately. The op each function adds,
// its schema and its gradient live in src/ops/<family>.cpp; `seam ops` lists them all.
#pragma once
#include <optional>
#include <vector>

#include "seam/graph.h"

namespace seam {

// Elementwise, unary.
Var relu(Var x);
Var leaky_relu(Var x, double alpha = 0.01);
Var sigmoid(Var x);
Var tanh(Var x);
Var gelu(Var x, bool tanh_approximation = false);
Var silu(Var x);
Var exp(Var x);
Var log(Var x);
Var sqrt(Var x);
Var pow(Var x, double exponent);
Var scale(Var x, double factor);
Var neg(Var x);
Var abs(Var x);
Var erf(Var x);  // the error function

// Elementwise, binary, with numpy broadcasting.
Var add(Var a, Var b);
Var sub(Var a, Var b);
Var mul(Var a, Var b);
Var div(Var a, Var b);
Var maximum(Var a, Var b);
Var minimum(Var a, Var b);
inline Var operator+(Var a, Var b) { return add(a, b); }
inline Var operator-(Var a, Var b) { return sub(a, b); }
inline Var operator*(Var a, Var b) { return mul(a, b); }
inline Var operator/(Var a, Var b) { return div(a, b); }
inline Var operator-(Var a) { return neg(a); }
inline Var operator*(Var a, double s) { return scale(a, s); }
inline Var operator*(double s, Var a) { return scale(a, s); }

// Constants, types, gradient control.
Var full(Graph& g, Shape shape, double value, DType dtype = DType::f32);
Var cast(Var x, DType to);
Var copy(Var x);
Var stop_gradient(Var x);
Var argmax(Var x, int64_t axis = -1);  // i32, no gradient
Var count_equal(Var a, Var b);         // i32 scalar: positions where a == b and b >= 0
// acc[i] += xs[i] in every training step (acc: an f32 state of one entry per scalar).
void accumulate(Var acc, const std::vector<Var>& xs);

// Linear algebra. matmul: a [..., M, K] x b [K, N] (leading dims of a folded into M), or
// a [B, M, K] x b [B, M, K] batched; transposes apply to the last two dims.
// linear: y = x w^T + b with w [out, in], as torch.nn.functional.linear.
Var matmul(Var a, Var b, bool transpose_a = false, bool transpose_b = false);
Var linear(Var x, Var w, std::optional<Var> b = std::nullopt);

// Reductions. Empty axes = all axes.
Var sum(Var x, std::vector<int64_t> axes = {}, bool keepdims = false);
Var mean(Var x, std::vector<int64_t> axes = {}, bool keepdims = false);
Var broadcast_to(Var x, Shape shape);

// Shape ops. reshape accepts one -1.
Var reshape(Var x, Shape shape);
Var flatten(Var x, int64_t start_dim = 1, int64_t end_dim = -1);
Var permute(Var x, std::vector<int64_t> perm);
Var transpose(Var x, int64_t dim0 = -2, int64_t dim1 = -1);
Var concat(const std::vector<Var>& xs, int64_t axis);
Var slice(Var x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);

// Normalized exponentials.
Var softmax(Var x, int64_t axis = -1);
Var log_softmax(Var x, int64_t axis = -1);

// Losses (mean over the batch). labels: i32, one per row of logits [..., C].
Var cross_entropy(Var logits, Var labels, int64_t ignore_index = -100,
                  double label_smoothing = 0.0);
Var mse(Var prediction, Var target);

// Normalization. layer_norm normalizes over the last dim; batch_norm over all but axis 1
// of [N, C] or [N, C, H, W], updating the running statistics (state values) in training.
Var layer_norm(Var x, Var gamma, Var beta, double eps = 1e-5);
Var batch_norm(Var x, Var gamma, Var beta, Var running_mean, Var running_var,
               double momentum = 0.1, double eps = 1e-5);

// Scaled dot-product attention on q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv]:
// softmax(scale * q k^T) v, [B, H, Tq, Dv]; causal masks the keys after each query
// (Tq = Tk); scale defaults to 1 / sqrt(D); dropout zeroes probabilities with that
// probability in training and scales the rest by 1 / (1 - dropout).
Var attention(Var q, Var k, Var v, bool causal = false, std::optional<double> scale = std::nullopt,
              double dropout = 0.0);
// The same with q, k and v packed token by token as qkv [B, T, 3, H, D], as a
// transformer's one projection to all three writes them, and o [B, T, H, D], as the
// output projection reads it: the head split and merge copy nothing (the kernels read
// and write through strides), and the gradient is one tensor in qkv's layout.
Var attention_qkv(Var qkv, bool causal = false, std::optional<double> scale = std::nullopt, double dropout = 0.0);

// Convolution and pooling, NCHW. w: [C_out, C_in / groups, kh, kw].
struct Conv2dOptions {
  std::vector<int64_t> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};
Var conv2d(Var x, Var w, std::optional<Var> b = std::nullopt, const Conv2dOptions& o = {});
Var max_pool2d(Var x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
               std::vector<int64_t> padding = {0, 0});
Var avg_pool2d(Var x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
               std::vector<int64_t> padding = {0, 0}, bool count_include_pad = true);
Var global_avg_pool(Var x);  // [N, C, H, W] -> [N, C]

// Dropout: zeroes each element with probability p and scales the rest by 1/(1-p) in
// training; the identity in evaluation. The mask is a pure function of (seed, step,
// node, element): reproducible and recomputed in backward, never stored.
Var dropout(Var x, double p);

// Embedding lookup: ids (i32, any shape) into weight [num, dim] -> [..., dim].
Var embedding(Var ids, Var weight);

}  // namespace seam
