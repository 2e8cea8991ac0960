// Ops written as gathers and masks computed at import (src/io/onnx.h): Resize and
// Upsample, GatherElements, NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
//
// Resize and Upsample. Shapes are static, so each resized axis is known
// at import: every output position's source taps (1 for nearest, 2 for linear, 4 for
// cubic) and their weights are computed here by ONNX's formulas, and the axis becomes
// sum over taps of weight_t * gather(x, index_t), the weights a constant broadcast along
// the axis. Gathers differentiate (embedding's gradient), so a resized network trains.
#include <algorithm>
#include <cmath>
#include <optional>

#include "io/onnx_import.h"

namespace seam::onnx::detail {

namespace {

struct Taps {
  std::vector<std::vector<int64_t>> index;  // [tap][output position]
  std::vector<std::vector<double>> weight;
};

// The source coordinate of output position i (ONNX's coordinate_transformation_mode).
// `length` is the resized length before rounding (in * scale), which align_corners uses.
double source_coordinate(NodeCtx& c, const std::string& mode, int64_t i, double scale, int64_t in, int64_t out,
                         double length) {
  const auto x = static_cast<double>(i);
  if (mode == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (mode == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (mode == "align_corners") return length <= 1 ? 0.0 : x * static_cast<double>(in - 1) / (length - 1);
  if (mode == "asymmetric") return x / scale;
  if (mode == "half_pixel_symmetric") {  // opset 19: half_pixel about the centre of the rounded size
    const double adjustment = static_cast<double>(out) / length, centre = static_cast<double>(in) / 2;
    return centre * (1 - adjustment) + (x + 0.5) / scale - 0.5;
  }
  if (mode == "tf_half_pixel_for_nearest" || mode == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  c.fail("coordinate_transformation_mode '", mode, "' is not supported");
}

double cubic_weight(double d, double a) {  // Keys' cubic convolution kernel
  d = std::abs(d);
  if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
  if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
  return 0;
}

Taps taps_of(NodeCtx& c, int64_t in, int64_t out, double scale, double length) {
  const std::string mode = c.s("mode", "nearest");
  // Upsample and Resize before opset 11: asymmetric coordinates, nearest by floor.
  const bool old = c.node.op_type() == "Upsample" || c.opset() < 11;
  const std::string coord = old ? "asymmetric" : c.s("coordinate_transformation_mode", "half_pixel");
  const std::string nearest = old ? "floor" : c.s("nearest_mode", "round_prefer_floor");
  const double a = c.f("cubic_coeff_a", -0.75);
  const bool exclude_outside = c.i("exclude_outside", 0) != 0;
  auto clamp = [&](int64_t k) { return std::clamp<int64_t>(k, 0, in - 1); };
  const int n_taps = mode == "nearest" ? 1 : mode == "linear" ? 2 : mode == "cubic" ? 4 : 0;
  if (n_taps == 0) c.fail("mode '", mode, "' is not supported");
  Taps t{std::vector<std::vector<int64_t>>(static_cast<size_t>(n_taps)),
         std::vector<std::vector<double>>(static_cast<size_t>(n_taps))};
  for (int64_t i = 0; i < out; ++i) {
    const double x = source_coordinate(c, coord, i, scale, in, out, length);
    if (mode == "nearest") {
      double k;
      if (nearest == "round_prefer_floor") k = x == std::floor(x) + 0.5 ? std::floor(x) : std::round(x);
      else if (nearest == "round_prefer_ceil") k = std::round(x);
      else if (nearest == "floor") k = std::floor(x);
      else if (nearest == "ceil") k = std::ceil(x);
      else c.fail("nearest_mode '", nearest, "' is not supported");
      t.index[0].push_back(clamp(static_cast<int64_t>(k)));
      t.weight[0].push_back(1.0);
      continue;
    }
    const double x0 = std::floor(x), f = x - x0;
    const auto k0 = static_cast<int64_t>(x0);
    if (mode == "linear") {
      const double xc = std::clamp(x, 0.0, static_cast<double>(in - 1));  // linear clamps the coordinate
      const double c0 = std::floor(xc), fc = xc - c0;
      t.index[0].push_back(clamp(static_cast<int64_t>(c0)));
      t.index[1].push_back(clamp(static_cast<int64_t>(c0) + 1));
      t.weight[0].push_back(1 - fc);
      t.weight[1].push_back(fc);
      continue;
    }
    double w[4], total = 0;
    for (int k = 0; k < 4; ++k) {
      const int64_t src = k0 - 1 + k;
      w[k] = cubic_weight(f - (k - 1), a);
      if (exclude_outside && (src < 0 || src >= in)) w[k] = 0;
      total += w[k];
    }
    for (int k = 0; k < 4; ++k) {
      t.index[static_cast<size_t>(k)].push_back(clamp(k0 - 1 + k));
      t.weight[static_cast<size_t>(k)].push_back(exclude_outside ? w[k] / total : w[k]);
    }
  }
  return t;
}

// x resized along `axis` to `out` positions.
Var resize_axis(NodeCtx& c, Var x, int64_t axis, int64_t out, double scale, double length) {
  const int64_t in = x.shape()[static_cast<size_t>(axis)];
  const Taps t = taps_of(c, in, out, scale, length);
  Shape wshape(static_cast<size_t>(rank(x)), 1);
  wshape[static_cast<size_t>(axis)] = out;
  std::optional<Var> sum;
  for (size_t k = 0; k < t.index.size(); ++k) {
    bool identity = static_cast<int64_t>(t.index[k].size()) == in;
    for (int64_t i = 0; identity && i < out; ++i) identity = t.index[k][static_cast<size_t>(i)] == i;
    Var g = identity ? x : gather_const(c, x, axis, t.index[k], "axis" + std::to_string(axis) + ".tap" + std::to_string(k));
    bool ones = true;
    for (double w : t.weight[k]) ones = ones && w == 1.0;
    if (!ones) {
      const std::string name = c.node.name() + ".axis" + std::to_string(axis) + ".weight" + std::to_string(k);
      c.imp.consts[name] = Const{wshape, t.weight[k], ::onnx::TensorProto::FLOAT};
      Var w = c.imp.var(name, c.where);
      g = mul(g, w.dtype() == g.dtype() ? w : cast(w, g.dtype()));
    }
    sum = sum ? add(*sum, g) : g;
  }
  return *sum;
}

// Resize (opset 10: X, scales; 11 on: X, roi, scales, sizes) and Upsample (opset 7-9:
// scales as an attribute, then an input).
void resize_op(NodeCtx& c) {
  Var x = c.in(0);
  const bool upsample = c.node.op_type() == "Upsample";
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  if (upsample) {
    scales = c.opset() < 9 ? c.floats("scales") : c.const_in(1, "scales").v;
  } else if (c.opset() < 11) {
    scales = c.const_in(1, "scales").v;
  } else {
    if (c.s("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize")
      c.fail("coordinate_transformation_mode 'tf_crop_and_resize' is not supported");
    if (c.i("antialias", 0) != 0) c.fail("antialias 1 is not supported");  // opset 18
    if (c.has_attr("axes")) c.fail("the axes attribute is not supported: give scales or sizes for every dim");
    if (c.s("keep_aspect_ratio_policy", "stretch") != "stretch")
      c.fail("keep_aspect_ratio_policy '", c.s("keep_aspect_ratio_policy", ""), "' is not supported");
    if (c.has(3)) sizes = c.const_in(3, "sizes").ints();
    else if (c.has(2)) scales = c.const_in(2, "scales").v;
  }
  const auto r = static_cast<size_t>(rank(x));
  if ((sizes.empty() && scales.size() != r) || (!sizes.empty() && sizes.size() != r))
    c.fail("scales or sizes must have one entry per dim of the rank-", r, " input");
  Var y = x;
  for (size_t d = 0; d < r; ++d) {
    const int64_t in = x.shape()[d];
    const int64_t out = sizes.empty() ? static_cast<int64_t>(std::floor(static_cast<double>(in) * scales[d])) : sizes[d];
    const double scale = sizes.empty() ? scales[d] : static_cast<double>(out) / static_cast<double>(in);
    if (out < 1 || !(scale > 0)) c.fail("dim ", d, " resized to ", out, " (scale ", scale, "): seam's values have no empty dims");
    if (out == in && scale == 1.0) continue;
    const double length = sizes.empty() ? static_cast<double>(in) * scales[d] : static_cast<double>(out);
    y = resize_axis(c, y, static_cast<int64_t>(d), out, scale, length);
  }
  c.out(0, y.id() == x.id() ? copy(x) : y);
}

// GatherElements with constant indices: each output element's flat source offset is
// known at import, so it is one gather from the flattened data.
void gather_elements_op(NodeCtx& c) {
  Var x = c.in(0);
  const Const& idx = c.const_in(1, "the indices");
  const Shape s = x.shape();
  if (idx.shape.size() != s.size()) c.fail("indices of rank ", idx.shape.size(), " for data of rank ", s.size());
  const int64_t axis = norm_axis(c, c.i("axis", 0), s.size());
  std::vector<int64_t> flat;
  const int64_t n = numel(idx.shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, off = 0, stride = 1;
    for (int64_t d = static_cast<int64_t>(s.size()) - 1; d >= 0; --d) {
      const int64_t ext = idx.shape[static_cast<size_t>(d)];
      int64_t k = rem % ext;
      rem /= ext;
      if (d == axis) {
        k = static_cast<int64_t>(idx.v[static_cast<size_t>(i)]);
        if (k < 0) k += s[static_cast<size_t>(d)];
      }
      if (k < 0 || k >= s[static_cast<size_t>(d)]) c.fail("index ", k, " is out of range for dim ", d, " of ", shape_str(s));
      off += k * stride;
      stride *= s[static_cast<size_t>(d)];
    }
    flat.push_back(off);
  }
  c.out(0, reshape(gather_const(c, reshape(x, {numel(s)}), 0, flat, "elements"), idx.shape));
}

// NegativeLogLikelihoodLoss on input [N, C, d...] (log-probabilities) and target [N, d...]:
// a mask M of input's shape holding weight[t] at each position's target class (0 where
// the target is ignore_index), so that the loss is -sum over C of input * M, reduced by
// none, sum, or mean (divided by sum of M). A constant target makes M a constant; a
// target that is a graph value (i32) makes it an embedding lookup of diag(weight).
Var nll(NodeCtx& c, Var input, size_t target_at, std::optional<Var> weight_var, const Const* weight) {
  const Shape s = input.shape();
  if (s.size() < 2) c.fail("input must be [N, C, ...], got ", shape_str(s));
  const int64_t classes = s[1];
  const std::string reduction = c.s("reduction", "mean");
  const bool has_ignore = c.has_attr("ignore_index");
  const int64_t ignore = c.i("ignore_index", 0);
  std::vector<double> w(static_cast<size_t>(classes), 1.0);
  if (weight) {
    if (weight->v.size() != static_cast<size_t>(classes)) c.fail("weight must have ", classes, " values");
    w = weight->v;
  } else if (weight_var) {
    c.fail("the weight must be a constant");
  }
  Var mask = [&] {
    const std::string name = c.node.name() + ".mask";
    if (const Const* t = c.maybe_const(target_at)) {  // M itself, at import
      Const m{s, std::vector<double>(static_cast<size_t>(numel(s)), 0.0), ::onnx::TensorProto::FLOAT};
      const int64_t inner = numel(s) / (s[0] * classes);
      if (static_cast<int64_t>(t->v.size()) != s[0] * inner) c.fail("target has ", t->v.size(), " values for ", shape_str(s));
      for (int64_t n = 0; n < s[0]; ++n)
        for (int64_t k = 0; k < inner; ++k) {
          const auto cls = static_cast<int64_t>(t->v[static_cast<size_t>(n * inner + k)]);
          if (has_ignore && cls == ignore) continue;
          if (cls < 0 || cls >= classes) c.fail("target ", cls, " is outside [0, ", classes, ")");
          m.v[static_cast<size_t>((n * classes + cls) * inner + k)] = w[static_cast<size_t>(cls)];
        }
      c.imp.consts[name] = m;
      return c.imp.var(name, c.where);
    }
    if (has_ignore && (ignore < 0 || ignore >= classes))
      c.fail("with ignore_index ", ignore, " outside [0, ", classes, ") the target must be a constant: a graph value is "
             "looked up in a table of ", classes, " rows");
    Const table{{classes, classes}, std::vector<double>(static_cast<size_t>(classes * classes), 0.0),
                ::onnx::TensorProto::FLOAT};
    for (int64_t k = 0; k < classes; ++k)
      if (!(has_ignore && k == ignore)) table.v[static_cast<size_t>(k * classes + k)] = w[static_cast<size_t>(k)];
    c.imp.consts[name] = table;
    Var onehot = embedding(c.in(target_at), c.imp.var(name, c.where));  // [N, d..., C]
    std::vector<int64_t> perm{0, rank(onehot) - 1};
    for (int64_t d = 1; d < rank(onehot) - 1; ++d) perm.push_back(d);
    return rank(onehot) == 2 ? onehot : permute(onehot, perm);
  }();
  if (mask.dtype() != input.dtype()) mask = cast(mask, input.dtype());
  Var picked = neg(sum(mul(input, mask), {1}));  // [N, d...]
  if (reduction == "none") return picked;
  Var total = sum(picked);
  if (reduction == "sum") return total;
  if (reduction != "mean") c.fail("reduction '", reduction, "' is not one ONNX defines");
  return div(total, sum(mask));
}

void nll_op(NodeCtx& c) {
  c.out(0, nll(c, c.in(0), 1, c.has(2) && !c.maybe_const(2) ? std::optional<Var>(c.in(2)) : std::nullopt,
               c.maybe_const(2)));
}

void softmax_cross_entropy_op(NodeCtx& c) {
  Var logp = log_softmax(c.in(0), 1);
  c.out(0, nll(c, logp, 1, c.has(2) && !c.maybe_const(2) ? std::optional<Var>(c.in(2)) : std::nullopt,
               c.maybe_const(2)));
  c.out(1, logp);
}

}  // namespace

void add_resize_importers(std::map<std::string, OpImporter>& t) {
  t.insert({{"Resize", resize_op},
            {"Upsample", resize_op},
            {"GatherElements", gather_elements_op},
            {"NegativeLogLikelihoodLoss", nll_op},
            {"SoftmaxCrossEntropyLoss", softmax_cross_entropy_op}});
}

}  // namespace seam::onnx::detail
