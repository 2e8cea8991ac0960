// Resize and Upsample (src/io/onnx.h). Shapes are static, so each resized axis is known
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
  Shape wshape(static_cast<size_t>(x.rank()), 1);
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
    if (c.has(3)) sizes = c.const_in(3, "sizes").ints();
    else if (c.has(2)) scales = c.const_in(2, "scales").v;
  }
  const auto r = static_cast<size_t>(x.rank());
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

}  // namespace

void add_resize_importers(std::map<std::string, OpImporter>& t) {
  t.insert({{"Resize", resize_op}, {"Upsample", resize_op}});
}

}  // namespace seam::onnx::detail
