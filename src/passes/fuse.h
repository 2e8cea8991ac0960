// Epilogue fusion: a linear layer followed by relu or gelu_tanh becomes one GEMM with the
// activation in its epilogue (linear_act), and in backward the next layer's input
// gradient GEMM absorbs the activation's derivative (matmul_act_grad), reading the
// record the forward epilogue kept (linear_act_aux). Bias gradients already come out of
// the weight-gradient GEMM (linear_grad_weight_bias). The pass only rewrites the graph;
// every backend runs the fused ops, so fused and unfused plans can be compared anywhere.
#pragma once
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "seam/graph.h"

namespace seam {

struct FuseResult {
  Graph graph;
  std::vector<ValueId> map;  // old value id -> new value id (-1: absorbed into a fused op)
  int forward = 0, backward = 0;  // fusions made
};

// The start of a pass's rebuild of `g`: a result whose graph holds g's inputs, parameters
// and states under their names, mapped; nodes are the pass's to add.
FuseResult start_rebuild(const Graph& g);
// The new id of an old value that has one by now.
ValueId mapped(const FuseResult& r, ValueId old);
// Node n of g as it is, reading `in` (its inputs' new ids), its outputs under their names
// and mapped; returns the new output ids.
std::vector<ValueId> copy_node(FuseResult& r, const Graph& g, const Node& n, const std::vector<ValueId>& in);
// For each value of g, the nodes that read it, in node order.
std::vector<std::vector<int>> value_users(const Graph& g);
// The one node that reads v, or -1 where none, several, or the caller (v is kept) do.
int only_user(const std::vector<std::vector<int>>& users, const std::set<ValueId>& keep, ValueId v);
// A node without an `activation`, or with "none".
bool without_activation(const Node& n);

// `keep`: values that must survive as they are (requested outputs, pinned gradients).
FuseResult fuse_epilogues(const Graph& g, const std::vector<ValueId>& keep);

// Residual adds into GEMMs: add(r, y) where y = linear(x, w, b) is read by nothing else
// (directly or through one reshape) and r has the sum's type becomes linear_add(x, w, r,
// b): the GEMM reads r as its C (beta = 1) and stores the sum, the add's kernel and its
// pass over three tensors gone. (src/passes/fuse_residual.cpp)
FuseResult residual_adds_into_linears(const Graph& g, const std::vector<ValueId>& keep);

// A tied weight's gradients summed by the embedding's: add(a, e), the two gradients of a
// weight read by an embedding and by a GEMM (a language model's tied output projection),
// e = embedding_grad(dy, ids) read by the add alone, becomes embedding_grad(dy, ids, a):
// the rows are added into a, in place, in a's dtype. Under a mixed policy, where a cast
// rounds the 16-bit sum to the f32 master's gradient, a is cast to f32 instead (a cast
// fold_casts takes into the GEMM that makes it) and the rows go into that in f32. No add
// pass, no 16-bit [vocabulary, width] copy of either gradient, no rounding of the
// embedding's sums before they meet the GEMM's. Runs before fold_casts.
// (src/passes/fuse_embedding.cpp)
FuseResult sums_into_embedding_grads(const Graph& g, const std::vector<ValueId>& keep);

// Transposes into GEMMs: a matmul operand made by a transpose of its last two dims (and
// no other dim moved) is read in place with the matmul's transpose flag flipped, and a
// transpose no other step reads is gone: one copy of the operand less each time.
// Exported attention (q k^T) and the backward of any matmul whose operand was transposed
// leave these. (src/passes/fold_transposes.cpp)
FuseResult fold_matmul_transposes(const Graph& g, const std::vector<ValueId>& keep);

// Padded classes: where logits are sliced to their first c columns along the last axis
// and only cross_entropy, argmax and cross_entropy_grad read the slice (the gradient only
// by the slice's own slice_grad), they read the unsliced logits with classes = c instead
// and the gradient writes the padding's zeros itself: the slice and its gradient, two
// copies of the logits, are gone. (src/passes/fuse_loss.cpp)
FuseResult absorb_class_slices(const Graph& g, const std::vector<ValueId>& keep);

// Loss fusion: cross_entropy and its cross_entropy_grad (same logits, labels and
// attributes) become one cross_entropy_with_grad at the forward's place, when the
// incoming gradient exists by then (an input, an earlier value, or a constant such as
// the loss's seed, which moves ahead). One read of the logits instead of two, one kernel
// instead of four on the GPU. (src/passes/fuse_loss.cpp)
FuseResult fuse_losses(const Graph& g, const std::vector<ValueId>& keep);

// The output layer in chunks of rows: linear(x, w) (a language model's head, bias-free:
// a bias's gradient would be one more sum over the chunks) -> logits read by a fused loss alone,
// whose gradient only GEMMs read (dx = dlogits w, dw = dlogits^T x, maybe through
// reshapes), becomes, for each of `chunks` row ranges, a slice of x, its logits, the loss
// over them (row_offset: divided by every row's count, the chunks before added) and the
// GEMMs of its gradient: dx's rows joined by a concat, dw summed in place (matmul's
// addend). Only one chunk's logits exist at a time: a language model's [tokens,
// vocabulary] logits, its largest buffer, shrink by the chunk count. Runs after the other
// fusions. (src/passes/chunk_loss.cpp)
FuseResult chunk_output_layer(const Graph& g, const std::vector<ValueId>& keep, int chunks);

// Batch norm + ReLU fusion: a batch_norm whose normalized value only a relu reads
// becomes batch_norm with activation relu, which writes relu's output (and name); its
// gradient, where relu_grad(dr, r) feeds only the batch norm's gradient, becomes one
// batch_norm_grad with activation relu reading dr, beta and r. Batch norm + residual add
// + ReLU (relu(add(normalized, z)), the sum read by the relu alone, z made earlier)
// becomes batch_norm with activation relu and input z; its relu_grad and batch_norm_grad
// become one batch_norm_grad with activation relu and residual 1, which also writes the
// masked gradient dz that z's readers take (at relu_grad's place and under its name).
// cuDNN runs each fused step as one kernel (CUDNN_BATCHNORM_OPS_BN_ACTIVATION,
// ..._BN_ADD_ACTIVATION); the CPU as its plain batch norm with the add, relu's value and
// its mask applied in place, so fused and unfused compute the same values.
// (src/passes/fuse_norm.cpp)
FuseResult fuse_norm_activations(const Graph& g, const std::vector<ValueId>& keep);

// Residual gradients into layer norm's: add(a, b), a value's two gradients (a residual
// stream read by a layer norm and by the next residual add), where a side is the dx of a
// layer_norm_grad that nothing else reads and the other side exists before that gradient
// runs, becomes that layer_norm_grad with the other side as input dr, added as dx is
// stored (at the gradient's place, under the add's name): one pass over the residual
// stream's gradient instead of two, a transformer's backward having one such add a layer
// norm. The CPU rounds dx and then adds, as the add did; the GPU kernels add in float
// before rounding to a 16-bit dx once. (src/passes/fuse_norm.cpp)
FuseResult sum_into_norm_grads(const Graph& g, const std::vector<ValueId>& keep);

// Bias gradients from layer norm's: linear_grad_weight_bias(dy, x) whose dy is the dx of a
// layer_norm_grad (or dx with its rows folded by a reshape), db in gamma's dtype, becomes
// a matmul for dw alone while that layer_norm_grad, with dx_sums 1, writes db as the
// column sums of the dx it stores. In a pre-norm transformer every residual projection's
// output gradient is such a dx (the residual stream's gradient out of the next layer
// norm's backward): its bias gradient costs no second read of the stream's gradient.
// (src/passes/bias_grads.cpp)
FuseResult bias_grads_into_norm_grads(const Graph& g, const std::vector<ValueId>& keep);

// The same from an activation's gradient: linear_grad_weight_bias(dy, x) whose dy is the
// dx of a matmul_act_grad (or dx with its rows folded) becomes a matmul for dw alone while
// that matmul_act_grad, with dx_sums 1, writes db (in linear_grad_weight_bias's dtype for
// it, sums_dtype) as the column sums of the dx it stores. A transformer MLP's first layer
// takes its bias gradient this way, from the DGELU GEMM of the layer after it, where the
// weight gradient's GEMM had summed dy again (cuBLASLt's BGRADB: a second pass over it).
// (src/passes/bias_grads.cpp)
FuseResult bias_grads_into_act_grads(const Graph& g, const std::vector<ValueId>& keep);

// Else from the input gradient's GEMM: linear_grad_weight_bias(dy, x) left by the two
// passes above and the plain matmul(dy, w) that reads the same dy for the layer's input
// gradient (no transposes, no addend, dx in dy's dtype) become linear_grad_input_bias(dy,
// w), at the matmul's place, writing dx and db (sums_dtype: db's dtype), and a matmul for
// dw alone. The input gradient's GEMM reads dy anyway; summing it there leaves the weight
// gradient a plain GEMM, without BGRADB's second pass over dy. Where the matmul comes
// after the weight gradient, a pair whose db is read in between is left alone.
// (src/passes/bias_grads.cpp)
FuseResult bias_grads_into_data_grads(const Graph& g, const std::vector<ValueId>& keep);

// Activation recomputation, for memory: a GELU's or a layer norm's output that the
// backward reads (a weight gradient's input) is not kept from the forward; just before
// each backward reader (a node after the loss's), it is computed again from what the
// backward keeps anyway (the GELU from linear_act_aux's record or the unfused op's input;
// the layer norm from its input, gamma and beta), and the copy lives until that reader.
// `what` names the kinds: "gelu", "layer_norm". A transformer's MLP keeps its 4x-wide GELU
// output (a third of a GPT-2 layer's activations) no longer, and neither of its two norms'
// outputs; each costs one elementwise pass of two bytes moved for each byte not kept.
// (src/passes/recompute.cpp)
FuseResult recompute_activations(const Graph& g, ValueId loss, const std::vector<std::string>& what);
std::vector<std::string> recompute_names();

// Layer norm's backward from its output, for memory: layer_norm_grad reads the norm's
// output y and beta in place of its input x and mean (from_output: xhat = (y - beta) /
// gamma, as Apex's memory-efficient layer norm does), where the backward reads y anyway
// (the next GEMM's weight gradient). x, a transformer's residual stream, is then not kept
// from the forward: W6's step 8598 -> 7824 MiB in the CPU's plan, for no extra pass (the
// division and beta's loads cost ~4 us of layer norm's ~40 us backward on an H100). A
// zero in gamma leaves y without x's information; the kernels report it. Layer norm
// outputs so read are no recompute candidates any more (recomputing y would keep x again).
// (src/passes/recompute.cpp)
FuseResult norm_grads_from_outputs(const Graph& g, ValueId loss);

// Recomputation chosen for a memory budget: what `what` names, then as many more of the
// candidates (GELU outputs, then layer norm outputs, each in forward order) as the step
// needs to fit `budget` bytes as bytes_of measures a rewritten graph (the model's buffers
// and the arena); the fewest that fit, found by bisection. Fails, naming what the step
// needs with everything recomputed, where nothing fits.
struct RecomputeChoice {
  FuseResult result;
  size_t bytes = 0;                // bytes_of(result)
  std::vector<std::string> added;  // the kind of each value recomputed beyond `what`
};
RecomputeChoice recompute_within(const Graph& g, ValueId loss, const std::vector<std::string>& what, size_t budget,
                                 const std::function<size_t(const FuseResult&)>& bytes_of);
// Kinds counted, in name order: {"gelu", "layer_norm", "gelu"} -> "2 gelu, 1 layer_norm".
std::string count_kinds(const std::vector<std::string>& kinds);

// Convolution + ReLU fusion, for convolutions that no batch norm follows: a conv2d whose
// result only a relu reads becomes conv2d with activation relu, writing relu's value (and
// name); relu_grad(dr, r) whose dr is a conv2d_grad_input that nothing else reads becomes
// that conv2d_grad_input with activation relu and input r, its result masked by r > 0 as
// it is stored. add(a, b), two gradients of one value, where a side is a
// conv2d_grad_input that nothing else reads, becomes that conv2d_grad_input with residual
// 1 and the other side as input z, added as it is stored (a residual block's input
// gradient, without an add kernel reading and writing it again). On CUDA, cuDNN's graph
// API runs each as one graph (the convolution and a pointwise relu forward or backward,
// or add); the CPU applies relu's value or mask, or z, to each image's result.
// (src/passes/fuse_conv.cpp)
FuseResult fuse_conv_activations(const Graph& g, const std::vector<ValueId>& keep);

// Elementwise fusion: chains of elementwise ops (ops.def's unary and binary ops and their
// gradients) whose outputs have one shape, operands broadcasting to it, become one
// fused_elementwise node; values read outside the chain (or kept) are its outputs and
// keep their names, the others never reach memory. (src/passes/fuse_elementwise.cpp)
FuseResult fuse_elementwise(const Graph& g, const std::vector<ValueId>& keep);

}  // namespace seam
