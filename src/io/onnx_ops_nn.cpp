// The ONNX importer's op table, part two (src/io/onnx.h): linear algebra,
// normalization, softmax, reductions, convolution and pooling.
#include <algorithm>
#include <cmath>
#include <limits>

#include "io/onnx_import.h"

namespace seam::onnx::detail {

namespace {

namespace T = ::onnx;

// ---- linear algebra and normalization ----------------------------------------------------

void matmul_op(NodeCtx& c) {
  if (import_attention(c)) return;
  Var a = c.in(0), b = c.in(1);
  const Shape sa = a.shape(), sb = b.shape();
  if (sa.size() < 1 || sb.size() < 1) c.fail("needs operands of rank >= 1");
  if (sa.size() == 1) {
    Var r = matmul(reshape(a, {1, sa[0]}), sb.size() == 1 ? reshape(b, {sb[0], 1}) : b);
    const Shape rs = r.shape();
    Shape out(rs.begin() + 1, rs.end());
    return c.out(0, reshape(r, sb.size() == 1 ? Shape{} : out));
  }
  if (sb.size() == 1) {
    Var r = matmul(a, reshape(b, {sb[0], 1}));
    return c.out(0, reshape(r, Shape(sa.begin(), sa.end() - 1)));
  }
  if (sb.size() == 2) return c.out(0, matmul(a, b));  // leading dims of a fold into M
  // Batched: broadcast the batch dims, fold them into one.
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const Shape batch = broadcast_shape(c, ba, bb);
  auto to_batch = [&](Var x, const Shape& s) {  // [1.., s] broadcast to [batch, s's last two]
    Shape padded(batch.size() + 2 - s.size(), 1), target = batch;
    padded.insert(padded.end(), s.begin(), s.end());
    target.insert(target.end(), s.end() - 2, s.end());
    Var r = padded == s ? x : reshape(x, padded);
    return padded == target ? r : broadcast_to(r, target);
  };
  Var fa = to_batch(a, sa), fb = to_batch(b, sb);
  const int64_t nb = numel(batch);
  Var r = matmul(reshape(fa, {nb, sa[sa.size() - 2], sa.back()}), reshape(fb, {nb, sb[sb.size() - 2], sb.back()}));
  Shape out = batch;
  out.push_back(sa[sa.size() - 2]);
  out.push_back(sb.back());
  c.out(0, reshape(r, out));
}

void gemm_op(NodeCtx& c) {
  Var a = c.in(0), b = c.in(1);
  if (rank(a) != 2 || rank(b) != 2) c.fail("A and B must be 2-d, got ", shape_str(a.shape()), " and ", shape_str(b.shape()));
  Var y = matmul(a, b, c.i("transA", 0) != 0, c.i("transB", 0) != 0);
  const double alpha = c.f("alpha", 1.0), beta = c.f("beta", 1.0);
  if (alpha != 1.0) y = scale(y, alpha);
  if (c.has(2) && beta != 0.0) {
    Var bias = c.in(2);
    if (beta != 1.0) bias = scale(bias, beta);
    y = add(y, bias);
  }
  c.out(0, y);
}

// Per-channel operand v [C] against x [N, C, ...]: [C, 1, ...] for broadcasting.
Var per_channel(NodeCtx& c, Var v, int64_t x_rank) {
  if (rank(v) != 1) c.fail("per-channel operands must be 1-d, got ", shape_str(v.shape()));
  Shape s{v.shape()[0]};
  s.resize(static_cast<size_t>(x_rank - 1), 1);
  return reshape(v, s);
}

// Running statistics are state values: frozen whatever OnnxOptions::freeze says.
Var running_stat(NodeCtx& c, size_t i) {
  if (!c.has(i)) c.fail("input ", i, " (a running statistic) is missing");
  const std::string& name = c.node.input(static_cast<int>(i));
  if (!c.imp.vars.count(name)) c.imp.initializers.erase(name);
  return c.in(i);
}

// Training mode (opset 14's training_mode, or before it the running statistics asked for
// as outputs): x normalized by its own batch's mean and population variance over every
// axis but the channels', and outputs 1 and 2 the running statistics' update,
// input * momentum + current * (1 - momentum). As formulas of seam's ops, so their
// gradients are those ops'.
void batch_norm_training(NodeCtx& c, Var x) {
  if (c.wants(3) || c.wants(4))
    c.fail("the saved mean and variance outputs (opsets before 14) are not supported");
  const int64_t r = rank(x), channels = x.shape()[1];
  std::vector<int64_t> axes;
  for (int64_t k = 0; k < r; ++k)
    if (k != 1) axes.push_back(k);
  Var m = mean(x, axes, true), d = sub(x, m);
  Var v = mean(mul(d, d), axes, true);
  Var inv = pow(add(v, scalar(c.g(), c.f("epsilon", 1e-5), x.dtype())), -0.5);
  c.out(0, add(mul(mul(d, inv), per_channel(c, c.in(1), r)), per_channel(c, c.in(2), r)));
  const double momentum = c.f("momentum", 0.9);
  auto update = [&](size_t i, Var current) {
    return add(scale(running_stat(c, i), momentum), scale(reshape(current, {channels}), 1.0 - momentum));
  };
  if (c.wants(1)) c.out(1, update(3, m));
  if (c.wants(2)) c.out(2, update(4, v));
}

void batch_norm_op(NodeCtx& c) {
  Var x = c.in(0);
  if (rank(x) < 2) c.fail("input of rank ", rank(x), " (it needs [N, C, ...])");
  if (c.i("training_mode", 0) != 0 || c.wants(1) || c.wants(2)) return batch_norm_training(c, x);
  if (!c.maybe_const(3) || !c.maybe_const(4)) {
    // Statistics that are graph values, not constants: the formula itself,
    // (x - mean) / sqrt(var + eps) * scale + bias.
    const int64_t r = rank(x);
    Var inv = pow(add(per_channel(c, c.in(4), r), scalar(c.g(), c.f("epsilon", 1e-5), x.dtype())), -0.5);
    Var y = mul(sub(x, per_channel(c, c.in(3), r)), mul(inv, per_channel(c, c.in(1), r)));
    return c.out(0, add(y, per_channel(c, c.in(2), r)));
  }
  auto out = c.g().add(Op::batch_norm, {x.id(), c.in(1).id(), c.in(2).id(), running_stat(c, 3).id(),
                                        running_stat(c, 4).id()},
                       {{"eps", c.f("epsilon", 1e-5)}, {"momentum", 1.0 - c.f("momentum", 0.9)}, {"training", int64_t{0}}});
  c.out(0, c.g().var(out[0]));
}

// Over the dims from `axis` on: those flattened into one for seam's layer norm (which
// takes the last), and the result's shape restored.
void layer_norm_op(NodeCtx& c) {
  Var x0 = c.in(0);
  const int64_t axis = norm_axis(c, c.i("axis", -1), rank(x0));
  int64_t outer = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= x0.shape()[static_cast<size_t>(k)];
  Var x = axis == rank(x0) - 1 ? x0 : reshape(x0, {outer, numel(x0.shape()) / outer});
  const int64_t d = x.shape().back();
  Var gamma = c.in(1);
  Var beta = c.has(2) ? c.in(2) : full(c.g(), {d}, 0.0, gamma.dtype());
  if (gamma.shape() != Shape{d}) gamma = reshape(gamma, {d});
  if (beta.shape() != Shape{d}) beta = reshape(beta, {d});
  auto out = c.g().add(Op::layer_norm, {x.id(), gamma.id(), beta.id()}, {{"eps", c.f("epsilon", 1e-5)}});
  c.out(0, x.shape() == x0.shape() ? c.g().var(out[0]) : reshape(c.g().var(out[0]), x0.shape()));
  Shape kept = x0.shape();
  for (size_t k = static_cast<size_t>(axis); k < kept.size(); ++k) kept[k] = 1;
  if (c.wants(1)) c.out(1, reshape(c.g().var(out[1]), kept));
  if (c.wants(2)) c.out(2, reshape(c.g().var(out[2]), kept));
}

// Softmax and LogSoftmax: from opset 13 along one axis; before, over the flattened dims
// from `axis` on (the input seen as 2-d), which is the same where axis is the last.
template <bool Log>
void softmax_op(NodeCtx& c) {
  Var x = c.in(0);
  const int64_t axis = norm_axis(c, c.i("axis", c.opset() >= 13 ? -1 : 1), rank(x));
  auto f = [](Var v, int64_t a) { return Log ? log_softmax(v, a) : softmax(v, a); };
  if (c.opset() >= 13 || axis == rank(x) - 1) return c.out(0, f(x, axis));
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[static_cast<size_t>(d)];
  c.out(0, reshape(f(reshape(x, {outer, numel(x.shape()) / outer}), 1), x.shape()));
}

template <bool Mean>
void reduce_op(NodeCtx& c) {
  Var x = c.in(0);
  std::vector<int64_t> axes = axes_of(c, 1, Mean ? 18 : 13);
  if (axes.empty() && c.i("noop_with_empty_axes", 0) != 0) return c.out(0, copy(x));
  for (int64_t& a : axes) a = norm_axis(c, a, rank(x));
  const bool keep = c.i("keepdims", 1) != 0;
  if (axes.empty())
    for (int64_t d = 0; d < rank(x); ++d) axes.push_back(d);
  c.out(0, Mean ? mean(x, axes, keep) : sum(x, axes, keep));
}

// ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum: a sum of a function of x, and one of it.
template <int Kind>  // 0 L1, 1 L2, 2 sum of squares, 3 log of the sum
void reduce_norm_op(NodeCtx& c) {
  Var x = c.in(0);
  std::vector<int64_t> axes = axes_of(c, 1, 18);
  for (int64_t& a : axes) a = norm_axis(c, a, rank(x));
  if (axes.empty())
    for (int64_t d = 0; d < rank(x); ++d) axes.push_back(d);
  Var t = Kind == 0 ? seam::abs(x) : Kind == 3 ? x : mul(x, x);
  Var s = sum(t, axes, c.i("keepdims", 1) != 0);
  c.out(0, Kind == 1 ? seam::sqrt(s) : Kind == 3 ? seam::log(s) : s);
}

// ReduceMax / ReduceMin (of -x) / ReduceLogSumExp: the reduced axes gathered into one
// (a permute and a reshape to [outer, 1, n, inner]) and max-pooled over it, which has a
// gradient (to the first maximum); logsumexp as m + log(sum(exp(x - m))) with m a constant
// to the gradient.
template <int Kind>  // 0 max, 1 min, 2 log-sum-exp
void reduce_max_op(NodeCtx& c) {
  Var x = c.in(0);
  std::vector<int64_t> axes = axes_of(c, 1, 18);
  for (int64_t& a : axes) a = norm_axis(c, a, rank(x));
  if (axes.empty())
    for (int64_t d = 0; d < rank(x); ++d) axes.push_back(d);
  std::sort(axes.begin(), axes.end());
  const Shape s = x.shape();
  std::vector<int64_t> perm, kept_dims;
  int64_t outer = 1, n = 1;
  for (int64_t d = 0; d < rank(x); ++d)
    if (!std::binary_search(axes.begin(), axes.end(), d)) {
      perm.push_back(d);
      outer *= s[static_cast<size_t>(d)];
    }
  for (int64_t a : axes) {
    perm.push_back(a);
    n *= s[static_cast<size_t>(a)];
  }
  Var v = Kind == 1 ? neg(x) : x;
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  Var moved = identity ? v : permute(v, perm);
  Var m = reshape(max_pool2d(reshape(moved, {outer, 1, n, 1}), {n, 1}), {outer});  // [outer]
  Shape keep = s;
  for (int64_t a : axes) keep[static_cast<size_t>(a)] = 1;
  Var r = reshape(m, keep);  // broadcasts against x
  if (Kind == 2) {  // m held constant: the gradient is softmax(x), whatever m is
    Var m_fixed = stop_gradient(r);
    r = add(m_fixed, seam::log(sum(seam::exp(sub(x, m_fixed)), axes, true)));
  }
  if (Kind == 1) r = neg(r);
  if (c.i("keepdims", 1) == 0) {
    Shape out;
    for (int64_t d = 0; d < rank(x); ++d)
      if (!std::binary_search(axes.begin(), axes.end(), d)) out.push_back(s[static_cast<size_t>(d)]);
    r = reshape(r, out);
  }
  c.out(0, r);
}

// ArgMax / ArgMin (of -x): the first extreme along the axis, as seam's argmax; i32.
// With select_last_index, the argmax of the axis reversed (a gather of n-1 ... 0), whose
// index i is n - 1 - i of the original.
template <bool Max>
void arg_op(NodeCtx& c) {
  Var x = c.in(0);
  const int64_t axis = norm_axis(c, c.i("axis", 0), rank(x));
  const int64_t n = x.shape()[static_cast<size_t>(axis)];
  Var v = Max ? x : neg(x);
  const bool last = c.i("select_last_index", 0) != 0;
  if (last) {
    Var table = reshape(axis == 0 ? v : permute(v, [&] {
      std::vector<int64_t> p{axis};
      for (int64_t d = 0; d < rank(x); ++d)
        if (d != axis) p.push_back(d);
      return p;
    }()), {n, numel(x.shape()) / n});
    Const ids{{n}, {}, T::TensorProto::INT32};
    for (int64_t i = n - 1; i >= 0; --i) ids.v.push_back(static_cast<double>(i));
    c.imp.consts[c.node.name() + ".reversed"] = ids;
    Shape moved{n};
    for (int64_t d = 0; d < rank(x); ++d)
      if (d != axis) moved.push_back(x.shape()[static_cast<size_t>(d)]);
    Var rev = reshape(embedding(c.imp.var(c.node.name() + ".reversed", c.where), table), moved);
    std::vector<int64_t> back;  // the reversed axis to its place again
    for (int64_t d = 1; d <= axis; ++d) back.push_back(d);
    back.push_back(0);
    for (int64_t d = axis + 1; d < rank(x); ++d) back.push_back(d);
    v = axis == 0 ? rev : permute(rev, back);
  }
  Var r = argmax(v, axis);
  if (last)
    r = cast(sub(full(c.g(), r.shape(), static_cast<double>(n - 1), DType::f32), cast(r, DType::f32)), DType::i32);
  if (c.i("keepdims", 1) != 0) {
    Shape s = x.shape();
    s[static_cast<size_t>(axis)] = 1;
    r = reshape(r, s);
  }
  c.out(0, r);
}

// ---- convolution and pooling -------------------------------------------------------------

struct Window {
  std::vector<int64_t> kernel, stride, pad, dilation;
  std::vector<int64_t> begin, end;  // the pads at either end of each spatial dim
};

// Kernel, strides, dilations and pads of a 2-d window op, auto_pad resolved; `pad` is
// filled only where the pads are symmetric (unless `symmetric`, which requires them so).
Window window(NodeCtx& c, const Shape& x, std::vector<int64_t> kernel, bool symmetric = true) {
  const size_t sp = x.size() - 2;
  Window w{kernel, c.ints("strides", std::vector<int64_t>(sp, 1)), {}, c.ints("dilations", std::vector<int64_t>(sp, 1))};
  std::vector<int64_t> pads = c.ints("pads", std::vector<int64_t>(2 * sp, 0));
  if (pads.size() != 2 * sp || w.stride.size() != sp || w.dilation.size() != sp || w.kernel.size() != sp)
    c.fail("pads, strides, dilations and the kernel do not match the input's ", sp, " spatial dims");
  for (size_t d = 0; d < sp; ++d)
    if (w.stride[d] < 1 || w.dilation[d] < 1 || w.kernel[d] < 1)
      c.fail("strides, dilations and the kernel must be at least 1");
  const std::string auto_pad = c.s("auto_pad", "NOTSET");
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (size_t d = 0; d < sp; ++d) {
      const int64_t in = x[2 + d], out = (in + w.stride[d] - 1) / w.stride[d];
      const int64_t total = std::max<int64_t>(0, (out - 1) * w.stride[d] + (w.kernel[d] - 1) * w.dilation[d] + 1 - in);
      pads[d] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pads[d + sp] = total - pads[d];
    }
  } else if (auto_pad == "VALID") {
    std::fill(pads.begin(), pads.end(), 0);
  } else if (auto_pad != "NOTSET") {
    c.fail("auto_pad '", auto_pad, "' is not one ONNX defines");
  }
  for (size_t d = 0; d < sp; ++d) {
    if (pads[d] < 0 || pads[d + sp] < 0) c.fail("negative pads ", shape_str(Shape(pads.begin(), pads.end())));
    if (symmetric && pads[d] != pads[d + sp])
      c.fail("pads ", shape_str(Shape(pads.begin(), pads.end())), " differ at the two ends of a dim: seam pads symmetrically");
    w.pad.push_back(pads[d]);
    w.begin.push_back(pads[d]);
    w.end.push_back(pads[d + sp]);
  }
  return w;
}

// A 1-d window op as a 2-d one of height 1.
Var as_2d(Var x) {
  Shape s = x.shape();
  s.insert(s.begin() + 2, 1);
  return reshape(x, s);
}

void conv_op(NodeCtx& c) {
  Var x = c.in(0), w = c.in(1);
  if (rank(x) != 3 && rank(x) != 4) c.fail("input of rank ", rank(x), ": seam convolves 1-d and 2-d inputs");
  const bool one_d = rank(x) == 3;
  if (rank(w) != rank(x)) c.fail("W has rank ", rank(w), ", X ", rank(x));
  const Shape ws = w.shape();
  std::vector<int64_t> kernel = c.ints("kernel_shape", Shape(ws.begin() + 2, ws.end()));
  Window win = window(c, x.shape(), kernel);
  if (one_d) {
    x = as_2d(x);
    w = as_2d(w);
    win.stride.insert(win.stride.begin(), 1);
    win.pad.insert(win.pad.begin(), 0);
    win.dilation.insert(win.dilation.begin(), 1);
  }
  std::optional<Var> b;
  if (c.has(2)) b = c.in(2);
  Var y = conv2d(x, w, b, {.stride = win.stride, .padding = win.pad, .dilation = win.dilation, .groups = c.i("group", 1)});
  if (one_d) {
    Shape s = y.shape();
    s.erase(s.begin() + 2);
    y = reshape(y, s);
  }
  c.out(0, y);
}

// x with `before` and `after` slices of `value` on either side of axis a.
Var pad_axis(NodeCtx& c, Var x, int64_t a, int64_t before, int64_t after, double value) {
  if (before == 0 && after == 0) return x;
  std::vector<Var> parts;
  Shape s = x.shape();
  if (before > 0) s[static_cast<size_t>(a)] = before, parts.push_back(full(c.g(), s, value, x.dtype()));
  parts.push_back(x);
  if (after > 0) s[static_cast<size_t>(a)] = after, parts.push_back(full(c.g(), s, value, x.dtype()));
  return concat(parts, a);
}

// ConvTranspose: seam's conv2d_grad_input (the data gradient is the transposed
// convolution, and it has gradients of its own), ONNX's W [C_in, C_out/group, kh, kw]
// being the filter of the convolution it transposes. The output size: stride (in - 1) +
// output_padding + dilation (k - 1) + 1 - pads, or output_shape.
void conv_transpose_op(NodeCtx& c) {
  Var x = c.in(0), w = c.in(1);
  if (rank(x) != 3 && rank(x) != 4) c.fail("input of rank ", rank(x), ": seam convolves 1-d and 2-d inputs");
  const bool one_d = rank(x) == 3;
  const size_t sp = static_cast<size_t>(rank(x) - 2);
  if (rank(w) != rank(x)) c.fail("W has rank ", rank(w), ", X ", rank(x));
  const Shape ws = w.shape();
  const std::vector<int64_t> kernel = c.ints("kernel_shape", Shape(ws.begin() + 2, ws.end()));
  const std::vector<int64_t> stride = c.ints("strides", std::vector<int64_t>(sp, 1)),
                             dil = c.ints("dilations", std::vector<int64_t>(sp, 1)),
                             out_pad = c.ints("output_padding", std::vector<int64_t>(sp, 0)),
                             out_shape = c.ints("output_shape");
  std::vector<int64_t> pads = c.ints("pads", std::vector<int64_t>(2 * sp, 0));
  const std::string auto_pad = c.s("auto_pad", "NOTSET");
  const int64_t group = c.i("group", 1);
  if (kernel.size() != sp || stride.size() != sp || dil.size() != sp || out_pad.size() != sp || pads.size() != 2 * sp ||
      (!out_shape.empty() && out_shape.size() < sp))
    c.fail("kernel_shape, strides, dilations, output_padding, pads or output_shape do not match the input's ", sp,
           " spatial dims");
  for (size_t d = 0; d < sp; ++d)
    if (stride[d] < 1 || dil[d] < 1 || kernel[d] < 1) c.fail("strides, dilations and the kernel must be at least 1");
  if (group < 1) c.fail("group ", group, " must be at least 1");
  Shape out{x.shape()[0], ws[1] * group};
  for (size_t d = 0; d < sp; ++d) {
    const int64_t in = x.shape()[2 + d], full = stride[d] * (in - 1) + out_pad[d] + dil[d] * (kernel[d] - 1) + 1;
    int64_t target = full - pads[d] - pads[d + sp];
    if (!out_shape.empty()) target = out_shape[out_shape.size() - sp + d];
    else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") target = in * stride[d];
    const int64_t total = full - target;  // the padding both ends together
    if (!out_shape.empty() || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      pads[d] = auto_pad == "SAME_LOWER" ? total - total / 2 : total / 2;
      pads[d + sp] = total - pads[d];
    }
    if (target < 1) c.fail("pads (", pads[d], ", ", pads[d + sp], ") of spatial dim ", d, " leave no output of the full ", full);
    if (out_pad[d] != 0 && out_pad[d] >= stride[d]) c.fail("output_padding ", out_pad[d], " is not below the stride");
    out.push_back(target);
  }
  // Pads that differ at the two ends: the transposed convolution with the smaller one on
  // both, then the output cropped by the difference; a negative pad (an output_shape past
  // the full output) adds zeros there.
  std::vector<int64_t> pad, crop;
  const Shape final_shape = out;
  for (size_t d = 0; d < sp; ++d) {
    pad.push_back(std::max<int64_t>(0, std::min(pads[d], pads[d + sp])));
    crop.push_back(pads[d] - pad.back());
    out[2 + d] = final_shape[2 + d] + pads[d] + pads[d + sp] - 2 * pad.back();
  }
  std::vector<int64_t> st = stride, dl = dil;
  if (one_d) {
    x = as_2d(x);
    w = as_2d(w);
    out.insert(out.begin() + 2, 1);
    pad.insert(pad.begin(), 0);
    st.insert(st.begin(), 1);
    dl.insert(dl.begin(), 1);
  }
  Var y = c.g().add1(Op::conv2d_grad_input, {x.id(), w.id()},
                     {{"stride", st}, {"padding", pad}, {"dilation", dl}, {"groups", group}, {"shape", out}});
  for (size_t d = 0; d < sp; ++d) {
    const auto axis = static_cast<int64_t>(rank(y)) - static_cast<int64_t>(sp) + static_cast<int64_t>(d);
    const int64_t want = final_shape[2 + d], have = y.shape()[static_cast<size_t>(axis)];
    y = pad_axis(c, y, axis, std::max<int64_t>(0, -crop[d]), std::max<int64_t>(0, crop[d] + want - have), 0.0);
    const int64_t from = std::max<int64_t>(0, crop[d]);
    if (y.shape()[static_cast<size_t>(axis)] != want) y = slice(y, axis, from, from + want);
  }
  if (c.has(2)) {
    if (rank(c.in(2)) != 1) c.fail("the bias must be 1-d, got ", shape_str(c.in(2).shape()));
    Shape bs{c.in(2).shape()[0]};
    bs.resize(static_cast<size_t>(rank(y) - 1), 1);
    y = add(y, reshape(c.in(2), bs));
  }
  if (one_d) {
    Shape s = y.shape();
    s.erase(s.begin() + 2);
    y = reshape(y, s);
  }
  c.out(0, y);
}

// MaxPool and AveragePool. Symmetric pads of at most half the kernel run as seam's pooling
// ops; other pads and ceil_mode pad explicitly first (-inf for max, 0 for the average,
// whose divisor, the window's positions counted under count_include_pad, is a constant
// per output position).
template <bool Max>
void pool_op(NodeCtx& c) {
  Var x = c.in(0);
  if (rank(x) != 3 && rank(x) != 4) c.fail("input of rank ", rank(x), ": seam pools 1-d and 2-d inputs");
  if (Max && c.i("storage_order", 0) != 0) c.fail("storage_order 1 is not supported");
  if (Max && c.wants(1)) c.fail("the Indices output is not supported");
  const bool one_d = rank(x) == 3, ceil = c.i("ceil_mode", 0) != 0, with_pad = c.i("count_include_pad", 0) != 0;
  Window win = window(c, x.shape(), c.ints("kernel_shape"), false);
  for (int64_t d : win.dilation)
    if (d != 1) c.fail("dilations other than 1 are not supported in pooling");
  if (one_d) {
    x = as_2d(x);
    win.kernel.insert(win.kernel.begin(), 1);
    win.stride.insert(win.stride.begin(), 1);
    win.begin.insert(win.begin.begin(), 0);
    win.end.insert(win.end.begin(), 0);
  }
  // Each spatial dim's output size and the padding past its end that ceil_mode adds (a
  // last window starting inside the input or its begin pad: PyTorch's rule).
  std::vector<int64_t> out(2), extra(2, 0);
  bool native = true;
  for (size_t d = 0; d < 2; ++d) {
    if (win.begin[d] >= win.kernel[d] || win.end[d] >= win.kernel[d])  // a window of padding alone
      c.fail("pads ", win.begin[d], " and ", win.end[d], " of spatial dim ", d, " must be below the kernel ",
             win.kernel[d]);
    const int64_t in = x.shape()[2 + d], span = in + win.begin[d] + win.end[d] - win.kernel[d];
    if (span < 0) c.fail("the kernel ", win.kernel[d], " is larger than the padded input ", in + win.begin[d] + win.end[d]);
    out[d] = (ceil ? (span + win.stride[d] - 1) / win.stride[d] : span / win.stride[d]) + 1;
    if (ceil && (out[d] - 1) * win.stride[d] >= in + win.begin[d]) --out[d];
    extra[d] = std::max<int64_t>(0, (out[d] - 1) * win.stride[d] + win.kernel[d] - (in + win.begin[d] + win.end[d]));
    native = native && extra[d] == 0 && win.begin[d] == win.end[d] && 2 * win.begin[d] <= win.kernel[d];
  }
  Var y;
  if (native) {
    y = Max ? max_pool2d(x, win.kernel, win.stride, win.begin) : avg_pool2d(x, win.kernel, win.stride, win.begin, with_pad);
  } else {
    const double fill = Max ? -std::numeric_limits<double>::infinity() : 0.0;
    Var p = x;
    for (size_t d = 0; d < 2; ++d) p = pad_axis(c, p, static_cast<int64_t>(2 + d), win.begin[d], win.end[d] + extra[d], fill);
    y = Max ? max_pool2d(p, win.kernel, win.stride, {0, 0}) : avg_pool2d(p, win.kernel, win.stride, {0, 0}, true);
    if (!Max) {  // the mean over the window's counted positions: kernel area / count
      Const scale{{out[0], out[1]}, {}, ::onnx::TensorProto::FLOAT};
      for (int64_t i = 0; i < out[0]; ++i)
        for (int64_t j = 0; j < out[1]; ++j) {
          int64_t count = 1;
          for (size_t d = 0; d < 2; ++d) {
            const int64_t in = x.shape()[2 + d], at = (d == 0 ? i : j) * win.stride[d] - win.begin[d];
            const int64_t lo = with_pad ? -win.begin[d] : 0, hi = with_pad ? in + win.end[d] : in;
            count *= std::max<int64_t>(0, std::min(at + win.kernel[d], hi) - std::max(at, lo));
          }
          scale.v.push_back(count > 0 ? static_cast<double>(win.kernel[0] * win.kernel[1]) / static_cast<double>(count) : 0.0);
        }
      const std::string name = c.node.name() + ".divisor";
      c.imp.consts[name] = scale;
      Var sv = c.imp.var(name, c.where);
      y = mul(y, sv.dtype() == y.dtype() ? sv : cast(sv, y.dtype()));
    }
  }
  if (one_d) {
    Shape s = y.shape();
    s.erase(s.begin() + 2);
    y = reshape(y, s);
  }
  c.out(0, y);
}

void global_max_pool_op(NodeCtx& c) {
  Var x = c.in(0);
  if (rank(x) != 4) c.fail("input of rank ", rank(x), ": seam's global pooling takes [N, C, H, W]");
  c.out(0, max_pool2d(x, {x.shape()[2], x.shape()[3]}));
}

void global_avg_pool_op(NodeCtx& c) {
  Var x = c.in(0);
  if (rank(x) != 4) c.fail("input of rank ", rank(x), ": seam's global average pool takes [N, C, H, W]");
  c.out(0, reshape(global_avg_pool(x), {x.shape()[0], x.shape()[1], 1, 1}));
}

}  // namespace

void add_nn_importers(std::map<std::string, OpImporter>& t) {
  t.insert({
      {"MatMul", matmul_op},
      {"Gemm", gemm_op},
      {"BatchNormalization", batch_norm_op},
      {"LayerNormalization", layer_norm_op},
      {"Softmax", softmax_op<false>},
      {"LogSoftmax", softmax_op<true>},
      {"ReduceMean", reduce_op<true>},
      {"ReduceSum", reduce_op<false>},
      {"Conv", conv_op},
      {"ConvTranspose", conv_transpose_op},
      {"MaxPool", pool_op<true>},
      {"AveragePool", pool_op<false>},
      {"GlobalAveragePool", global_avg_pool_op},
      {"GlobalMaxPool", global_max_pool_op},
      {"ReduceL1", reduce_norm_op<0>},
      {"ReduceL2", reduce_norm_op<1>},
      {"ReduceSumSquare", reduce_norm_op<2>},
      {"ReduceLogSum", reduce_norm_op<3>},
      {"ReduceMax", reduce_max_op<0>},
      {"ReduceMin", reduce_max_op<1>},
      {"ReduceLogSumExp", reduce_max_op<2>},
      {"ArgMax", arg_op<true>},
      {"ArgMin", arg_op<false>},
  });
}

}  // namespace seam::onnx::detail
