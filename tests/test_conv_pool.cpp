// conv2d and pooling: forward against direct loops written here, gradients against
// finite differences, and the shape errors of their schemas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "grad_check.h"
#include "seam/seam.h"

using namespace seam;
using seam::testing::check_gradients;
using seam::testing::GradCase;

namespace {

std::vector<double> random_values(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& e : v) e = d(rng);
  return v;
}

struct Feed {
  std::string name;
  Shape shape;
  std::vector<double> values;
};

// Builds inputs for the feeds, applies f, and runs the graph once in evaluation mode
// in the given dtype; returns y as doubles and its shape.
std::pair<std::vector<double>, Shape> run_forward(const std::vector<Feed>& feeds,
                                                   const std::function<Var(const std::vector<Var>&)>& f,
                                                   DType dtype = DType::f64) {
  Graph g;
  std::vector<Var> vars;
  for (auto& fd : feeds) vars.push_back(g.input(fd.name, fd.shape, dtype));
  Var y = f(vars);
  Model m(g);
  CompileOptions o;
  o.mode = Mode::eval;
  o.outputs = {y.id()};
  Program p = m.compile(o);
  for (auto& fd : feeds) {
    if (dtype == DType::f64) {
      p.set_input(fd.name, std::span<const double>(fd.values));
    } else {
      std::vector<float> v(fd.values.begin(), fd.values.end());
      p.set_input(fd.name, std::span<const float>(v));
    }
  }
  p.run();
  if (dtype == DType::f64) return {p.read_as<double>(y.name()), y.shape()};
  auto v = p.read_as<float>(y.name());
  return {std::vector<double>(v.begin(), v.end()), y.shape()};
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rtol * std::max(1.0, std::abs(want[i]))) << "element " << i;
}

// --- References: direct loops in double, as torch.nn.functional ---

struct ConvCase {
  int64_t n, c, h, w;   // x
  int64_t o, kh, kw;    // w: [o, c / groups, kh, kw]
  int64_t sh, sw, ph, pw, dh, dw, groups;
  bool bias;

  Shape x_shape() const { return {n, c, h, w}; }
  Shape w_shape() const { return {o, c / groups, kh, kw}; }
  Conv2dOptions options() const { return {{sh, sw}, {ph, pw}, {dh, dw}, groups}; }
  int64_t oh() const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t ow() const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
  std::string str() const {
    return "x " + shape_str(x_shape()) + " w " + shape_str(w_shape()) + " stride " + std::to_string(sh) + "," +
           std::to_string(sw) + " pad " + std::to_string(ph) + "," + std::to_string(pw) + " dilation " +
           std::to_string(dh) + "," + std::to_string(dw) + " groups " + std::to_string(groups) +
           (bias ? " bias" : "");
  }
};

std::vector<double> ref_conv(const ConvCase& k, const std::vector<double>& x, const std::vector<double>& w,
                             const std::vector<double>& b) {
  const int64_t oh = k.oh(), ow = k.ow(), cg = k.c / k.groups, og = k.o / k.groups;
  std::vector<double> y(static_cast<size_t>(k.n * k.o * oh * ow));
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t o = 0; o < k.o; ++o)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double s = k.bias ? b[static_cast<size_t>(o)] : 0.0;
          for (int64_t ci = 0; ci < cg; ++ci) {
            int64_t c = (o / og) * cg + ci;
            for (int64_t i = 0; i < k.kh; ++i)
              for (int64_t j = 0; j < k.kw; ++j) {
                int64_t iy = oy * k.sh - k.ph + i * k.dh, ix = ox * k.sw - k.pw + j * k.dw;
                if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
                s += x[static_cast<size_t>(((n * k.c + c) * k.h + iy) * k.w + ix)] *
                     w[static_cast<size_t>(((o * cg + ci) * k.kh + i) * k.kw + j)];
              }
          }
          y[static_cast<size_t>(((n * k.o + o) * oh + oy) * ow + ox)] = s;
        }
  return y;
}

struct PoolCase {
  Shape x;
  int64_t kh, kw;
  std::vector<int64_t> stride;  // empty: the kernel
  int64_t ph, pw;
  std::string str() const {
    return "x " + shape_str(x) + " kernel " + std::to_string(kh) + "x" + std::to_string(kw) + " stride " +
           (stride.empty() ? "=kernel" : std::to_string(stride[0]) + "," + std::to_string(stride[1])) + " pad " +
           std::to_string(ph) + "," + std::to_string(pw);
  }
  int64_t sh() const { return stride.empty() ? kh : stride[0]; }
  int64_t sw() const { return stride.empty() ? kw : stride[1]; }
  int64_t oh() const { return (x[2] + 2 * ph - kh) / sh() + 1; }
  int64_t ow() const { return (x[3] + 2 * pw - kw) / sw() + 1; }
};

enum class PoolKind { max, avg_include_pad, avg_exclude_pad };

// Visits the in-bounds elements of each window in row-major order:
// f(output index, input index).
void for_each_window(const PoolCase& k, const std::function<void(size_t, size_t)>& f) {
  const int64_t planes = k.x[0] * k.x[1], h = k.x[2], w = k.x[3], oh = k.oh(), ow = k.ow();
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox)
        for (int64_t i = 0; i < k.kh; ++i)
          for (int64_t j = 0; j < k.kw; ++j) {
            int64_t iy = oy * k.sh() - k.ph + i, ix = ox * k.sw() - k.pw + j;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            f(static_cast<size_t>((pl * oh + oy) * ow + ox), static_cast<size_t>((pl * h + iy) * w + ix));
          }
}

std::vector<double> ref_pool(const PoolCase& k, PoolKind kind, const std::vector<double>& x) {
  const size_t ny = static_cast<size_t>(k.x[0] * k.x[1] * k.oh() * k.ow());
  std::vector<double> y(ny, kind == PoolKind::max ? -std::numeric_limits<double>::infinity() : 0.0);
  std::vector<double> count(ny, 0.0);
  for_each_window(k, [&](size_t o, size_t i) {
    y[o] = kind == PoolKind::max ? std::max(y[o], x[i]) : y[o] + x[i];
    count[o] += 1;
  });
  if (kind == PoolKind::avg_include_pad)
    for (auto& v : y) v /= static_cast<double>(k.kh * k.kw);
  if (kind == PoolKind::avg_exclude_pad)
    for (size_t o = 0; o < ny; ++o) y[o] /= count[o];
  return y;
}

Var apply_pool(const PoolCase& k, PoolKind kind, Var x) {
  if (kind == PoolKind::max) return max_pool2d(x, {k.kh, k.kw}, k.stride, {k.ph, k.pw});
  return avg_pool2d(x, {k.kh, k.kw}, k.stride, {k.ph, k.pw}, kind == PoolKind::avg_include_pad);
}

// Awkward sizes: batch 1 and 3, channels 1/3/4, H and W of 1, 5, 7, 9.
const ConvCase kConvCases[] = {
    //n c h w  o kh kw sh sw ph pw dh dw g  bias
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, false},  // everything 1
    {3, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},   // "same" 3x3
    {1, 4, 7, 9, 6, 2, 3, 2, 2, 0, 1, 1, 1, 2, true},   // non-square kernel, stride 2, groups 2
    {3, 4, 9, 7, 4, 3, 3, 1, 2, 2, 1, 2, 2, 4, false},  // depthwise, dilation 2
    {1, 3, 5, 7, 6, 3, 3, 2, 1, 1, 0, 2, 1, 3, true},   // depthwise with channel multiplier 2
    {3, 4, 7, 7, 8, 1, 1, 1, 1, 0, 0, 1, 1, 2, true},   // pointwise, groups 2
    {1, 4, 5, 5, 3, 1, 1, 2, 2, 0, 0, 1, 1, 1, false},  // 1x1 with stride 2
    {1, 3, 1, 1, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},   // 1x1 input, padding 1: 1x1 output
    {3, 1, 9, 5, 3, 2, 3, 1, 1, 2, 2, 2, 1, 1, true},   // padding 2 wider than the input's edge
    {1, 3, 7, 5, 2, 3, 2, 2, 2, 0, 0, 1, 1, 1, false},  // stride leaves the last rows unread
};

const PoolCase kPoolCases[] = {
    {{3, 3, 5, 5}, 3, 3, {2, 2}, 1, 1},  // overlapping, padded
    {{1, 4, 7, 9}, 2, 3, {}, 0, 0},      // non-square, stride = kernel, leftover rows
    {{1, 1, 1, 1}, 1, 1, {}, 0, 0},
    {{3, 1, 9, 7}, 3, 3, {1, 1}, 1, 1},
    {{1, 3, 5, 5}, 2, 2, {1, 1}, 1, 1},
    {{1, 3, 1, 1}, 2, 2, {1, 1}, 1, 1},  // every window mostly padding
    {{3, 4, 7, 5}, 4, 2, {3, 1}, 2, 0},
};

}  // namespace

// --- Forward ---

TEST(ConvForward, MatchesDirectLoops) {
  uint64_t seed = 1;
  for (const ConvCase& k : kConvCases) {
    SCOPED_TRACE(k.str());
    std::vector<Feed> feeds{{"x", k.x_shape(), random_values(numel(k.x_shape()), seed++)},
                            {"w", k.w_shape(), random_values(numel(k.w_shape()), seed++)}};
    if (k.bias) feeds.push_back({"b", {k.o}, random_values(k.o, seed++)});
    auto [y, shape] = run_forward(feeds, [&](const std::vector<Var>& v) {
      return conv2d(v[0], v[1], k.bias ? std::optional<Var>(v[2]) : std::nullopt, k.options());
    });
    EXPECT_EQ(shape, (Shape{k.n, k.o, k.oh(), k.ow()}));
    expect_close(y, ref_conv(k, feeds[0].values, feeds[1].values, k.bias ? feeds[2].values : std::vector<double>{}),
                 1e-12);
  }
}

TEST(ConvForward, Float32) {
  const ConvCase k{3, 4, 9, 7, 6, 3, 2, 2, 1, 1, 1, 1, 2, 2, true};
  std::vector<Feed> feeds{{"x", k.x_shape(), random_values(numel(k.x_shape()), 21)},
                          {"w", k.w_shape(), random_values(numel(k.w_shape()), 22)},
                          {"b", {k.o}, random_values(k.o, 23)}};
  // The reference sees the same float-rounded inputs.
  for (auto& f : feeds)
    for (auto& v : f.values) v = static_cast<float>(v);
  auto [y, shape] = run_forward(
      feeds, [&](const std::vector<Var>& v) { return conv2d(v[0], v[1], v[2], k.options()); }, DType::f32);
  expect_close(y, ref_conv(k, feeds[0].values, feeds[1].values, feeds[2].values), 1e-5);
}

TEST(PoolForward, MaxAndAverageMatchDirectLoops) {
  uint64_t seed = 100;
  for (const PoolCase& k : kPoolCases)
    for (PoolKind kind : {PoolKind::max, PoolKind::avg_include_pad, PoolKind::avg_exclude_pad}) {
      SCOPED_TRACE(k.str() + " kind " + std::to_string(static_cast<int>(kind)));
      std::vector<Feed> feeds{{"x", k.x, random_values(numel(k.x), seed++)}};
      auto [y, shape] = run_forward(feeds, [&](const std::vector<Var>& v) { return apply_pool(k, kind, v[0]); });
      EXPECT_EQ(shape, (Shape{k.x[0], k.x[1], k.oh(), k.ow()}));
      expect_close(y, ref_pool(k, kind, feeds[0].values), 1e-12);
    }
}

TEST(PoolForward, MaxPaddingNeverWins) {
  // All inputs negative: a zero-padded window would return 0.
  const PoolCase k{{1, 2, 5, 5}, 3, 3, {2, 2}, 1, 1};
  std::vector<Feed> feeds{{"x", k.x, random_values(numel(k.x), 7, -2.0, -1.0)}};
  auto [y, shape] = run_forward(feeds, [&](const std::vector<Var>& v) { return apply_pool(k, PoolKind::max, v[0]); });
  for (double v : y) EXPECT_LT(v, -0.5);
  expect_close(y, ref_pool(k, PoolKind::max, feeds[0].values), 0);
}

TEST(PoolForward, Float32) {
  const PoolCase k{{3, 3, 5, 5}, 3, 3, {2, 2}, 1, 1};
  std::vector<Feed> feeds{{"x", k.x, random_values(numel(k.x), 31)}};
  for (auto& v : feeds[0].values) v = static_cast<float>(v);
  for (PoolKind kind : {PoolKind::max, PoolKind::avg_exclude_pad}) {
    auto [y, shape] = run_forward(
        feeds, [&](const std::vector<Var>& v) { return apply_pool(k, kind, v[0]); }, DType::f32);
    expect_close(y, ref_pool(k, kind, feeds[0].values), 1e-6);
  }
}

TEST(PoolForward, GlobalAverage) {
  for (Shape s : {Shape{3, 4, 5, 7}, Shape{1, 1, 1, 1}, Shape{1, 3, 9, 1}}) {
    SCOPED_TRACE(shape_str(s));
    std::vector<Feed> feeds{{"x", s, random_values(numel(s), 41)}};
    auto [y, shape] = run_forward(feeds, [](const std::vector<Var>& v) { return global_avg_pool(v[0]); });
    EXPECT_EQ(shape, (Shape{s[0], s[1]}));
    std::vector<double> want(static_cast<size_t>(s[0] * s[1]), 0.0);
    const int64_t hw = s[2] * s[3];
    for (size_t i = 0; i < feeds[0].values.size(); ++i) want[i / static_cast<size_t>(hw)] += feeds[0].values[i];
    for (auto& v : want) v /= static_cast<double>(hw);
    expect_close(y, want, 1e-12);
  }
}

// --- Gradients ---

TEST(ConvGrad, InputWeightAndBias) {
  const ConvCase cases[] = {
      //n c h w  o kh kw sh sw ph pw dh dw g  bias
      {2, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},   // "same" 3x3
      {1, 4, 7, 6, 4, 2, 3, 2, 2, 1, 0, 1, 2, 2, true},   // non-square, stride 2, dilation, groups 2
      {2, 4, 5, 5, 4, 3, 3, 2, 2, 2, 2, 2, 2, 4, true},   // depthwise, dilation 2, padding 2
      {1, 3, 5, 7, 6, 3, 3, 2, 1, 1, 0, 1, 2, 3, false},  // depthwise with multiplier 2
      {2, 4, 3, 5, 6, 1, 1, 1, 1, 0, 0, 1, 1, 2, true},   // pointwise, groups 2
      {1, 3, 5, 5, 2, 1, 1, 2, 2, 1, 1, 1, 1, 1, false},  // 1x1 with stride and padding
      {3, 3, 3, 3, 5, 3, 3, 1, 1, 0, 0, 1, 1, 1, true},   // output 1x1
      {2, 2, 1, 1, 3, 3, 3, 2, 2, 1, 1, 1, 1, 1, true},   // 1x1 input, output 1x1
  };
  for (const ConvCase& k : cases) {
    SCOPED_TRACE(k.str());
    check_gradients([&](GradCase& c) {
      Var x = c.param("x", k.x_shape()), w = c.param("w", k.w_shape());
      std::optional<Var> b;
      if (k.bias) b = c.param("b", {k.o});
      return conv2d(x, w, b, k.options());
    });
  }
}

// A batch's images are independent: each image's output and input gradient must be what
// that image alone gives, and the weight and bias gradients the sum of the images' own
// (the weight gradient accumulates over the batch; large images, grouped channels).
TEST(ConvGrad, EachImageOfABatchGivesItsOwnResult) {
  const int64_t n = 5, c = 8, hw = 200, o = 4;
  const Conv2dOptions opt{.padding = {1, 1}, .groups = 2};
  const auto x_all = random_values(n * c * hw * hw, 31);
  const auto w_vals = random_values(o * (c / 2) * 9, 32);
  const auto b_vals = random_values(o, 33);
  const auto r_all = random_values(n * o * hw * hw, 34, 0.5, 1.5);
  struct Out {
    std::vector<double> y, dx, dw, db;
  };
  auto run = [&](int64_t first, int64_t count) {
    Graph g;
    Var x = g.param("x", {count, c, hw, hw}, Init::zeros(), true, DType::f64);
    Var w = g.param("w", {o, c / 2, 3, 3}, Init::zeros(), true, DType::f64);
    Var b = g.param("b", {o}, Init::zeros(), true, DType::f64);
    Var r = g.input("r", {count, o, hw, hw}, DType::f64);
    Var y = conv2d(x, w, b, opt);
    Var loss = sum(mul(y, r));
    Model m(g);
    Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {y.id()}});
    const size_t img = static_cast<size_t>(c * hw * hw), out = static_cast<size_t>(o * hw * hw);
    std::vector<double> xs(x_all.begin() + first * img, x_all.begin() + (first + count) * img);
    std::vector<double> rs(r_all.begin() + first * out, r_all.begin() + (first + count) * out);
    m.write_param("x", std::as_bytes(std::span(xs)));
    m.write_param("w", std::as_bytes(std::span(w_vals)));
    m.write_param("b", std::as_bytes(std::span(b_vals)));
    p.set_input("r", std::span<const double>(rs));
    p.run();
    return Out{p.read_as<double>(y.name()), p.grad_as<double>("x"), p.grad_as<double>("w"), p.grad_as<double>("b")};
  };
  const Out all = run(0, n);
  std::vector<double> y, dx, dw(w_vals.size(), 0.0), db(b_vals.size(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const Out one = run(i, 1);
    y.insert(y.end(), one.y.begin(), one.y.end());
    dx.insert(dx.end(), one.dx.begin(), one.dx.end());
    for (size_t k = 0; k < dw.size(); ++k) dw[k] += one.dw[k];
    for (size_t k = 0; k < db.size(); ++k) db[k] += one.db[k];
  }
  expect_close(all.y, y, 1e-12);
  expect_close(all.dx, dx, 1e-12);
  expect_close(all.dw, dw, 1e-10);
  expect_close(all.db, db, 1e-10);
}

TEST(ConvGrad, FixedInputOnlyWeight) {
  // x is data: the graph needs no conv2d_grad_input.
  check_gradients([](GradCase& c) {
    Var x = c.data("x", {2, 3, 5, 5});
    return conv2d(x, c.param("w", {4, 3, 3, 3}), c.param("b", {4}), {.stride = {2, 2}, .padding = {1, 1}});
  });
}

TEST(PoolGrad, MaxOverlappingAndNot) {
  const PoolCase cases[] = {
      {{2, 3, 5, 5}, 3, 3, {2, 2}, 1, 1},  // overlapping, padded
      {{1, 2, 7, 9}, 2, 3, {}, 0, 0},      // non-overlapping, leftover rows
      {{1, 1, 1, 1}, 1, 1, {}, 0, 0},
  };
  for (const PoolCase& k : cases) {
    SCOPED_TRACE(k.str());
    check_gradients([&](GradCase& c) { return apply_pool(k, PoolKind::max, c.param("x", k.x)); });
  }
}

TEST(PoolGrad, MaxRoutesTiesToTheFirstMaximum) {
  // A constant input: every window is one tie, so each dy goes to its window's first
  // in-bounds element, and overlapping windows add up.
  const PoolCase k{{1, 1, 5, 5}, 3, 3, {2, 2}, 1, 1};
  Graph g;
  Var x = g.param("x", k.x, Init::constant(0.5), true, DType::f64);
  Var loss = sum(apply_pool(k, PoolKind::max, x));
  Model m(g);
  CompileOptions o;
  o.loss = loss.id();
  o.gradients = true;
  Program p = m.compile(o);
  p.run();
  std::vector<double> want(static_cast<size_t>(numel(k.x)), 0.0);
  std::vector<bool> routed(static_cast<size_t>(k.oh() * k.ow()), false);
  for_each_window(k, [&](size_t o, size_t i) {
    if (!routed[o]) want[i] += 1, routed[o] = true;
  });
  expect_close(p.grad_as<double>("x"), want, 0);
}

// 2x2 windows at stride 2: a tie goes to the window's first maximum, and a NaN wins its
// window, forward and backward. Plane 0 has no NaN (the tiling form runs), plane 1 the
// same values but one NaN (the general form runs for that plane).
TEST(PoolGrad, TwoByTwoTilesRouteTiesToTheFirstAndLetANaNWin) {
  const std::vector<double> plane{1, 3, 5, 5,   //
                                  3, 2, 0, 4,   //
                                  7, 7, 9, 1,   //
                                  7, 7, 2, 0};
  std::vector<double> xs = plane;
  xs.insert(xs.end(), plane.begin(), plane.end());
  xs.back() = NAN;
  Graph g;
  Var x = g.param("x", {1, 2, 4, 4}, Init::zeros(), true, DType::f64);
  Var y = max_pool2d(x, {2, 2});
  Var loss = sum(mul(y, g.input("r", {1, 2, 2, 2}, DType::f64)));
  Model m(g);
  Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {y.id()}});
  m.write_param("x", std::as_bytes(std::span(xs)));
  const std::vector<double> r{1, 2, 3, 4, 1, 2, 3, 4};
  p.set_input("r", std::span<const double>(r));
  p.run();
  const auto out = p.read_as<double>(y.name());
  const std::vector<double> want_y{3, 5, 7, 9, 3, 5, 7, NAN};
  for (size_t i = 0; i < want_y.size(); ++i)
    EXPECT_TRUE(out[i] == want_y[i] || (std::isnan(out[i]) && std::isnan(want_y[i]))) << "output " << i;
  const std::vector<double> tiles{0, 1, 2, 0,   // 3 first at (0, 1); 5 first at (0, 2)
                                  0, 0, 0, 0,   //
                                  3, 0, 4, 0,   // 7 first at (2, 0); 9
                                  0, 0, 0, 0};
  std::vector<double> want = tiles;
  want.insert(want.end(), tiles.begin(), tiles.end());
  want[16 + 10] = 0, want[16 + 15] = 4;  // plane 1: the NaN, not 9, takes the last window's dy
  const auto dx = p.grad_as<double>("x");
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(dx[i], want[i]) << "element " << i;
}

TEST(PoolGrad, AverageBothPaddingCounts) {
  const PoolCase cases[] = {
      {{2, 3, 5, 5}, 3, 3, {2, 2}, 1, 1},
      {{1, 2, 7, 6}, 2, 3, {1, 2}, 1, 1},
      {{1, 2, 4, 4}, 2, 2, {}, 0, 0},
  };
  for (const PoolCase& k : cases)
    for (PoolKind kind : {PoolKind::avg_include_pad, PoolKind::avg_exclude_pad}) {
      SCOPED_TRACE(k.str() + (kind == PoolKind::avg_include_pad ? " count_include_pad" : ""));
      check_gradients([&](GradCase& c) { return apply_pool(k, kind, c.param("x", k.x)); });
    }
}

TEST(PoolGrad, GlobalAverage) {
  check_gradients([](GradCase& c) { return global_avg_pool(c.param("x", {2, 3, 5, 3})); });
  check_gradients([](GradCase& c) { return global_avg_pool(c.param("x", {1, 1, 1, 1})); });
}

TEST(PoolGrad, ConvPoolChain) {
  // conv -> relu -> max pool -> global average: the pieces compose.
  check_gradients([](GradCase& c) {
    Var y = relu(conv2d(c.param("x", {1, 2, 7, 7}), c.param("w", {3, 2, 3, 3}), c.param("b", {3}),
                        {.padding = {1, 1}}));
    return global_avg_pool(max_pool2d(y, {2, 2}));
  });
}

// --- Shape errors ---

namespace {

// The message of the seam::Error that f throws ("" and a test failure if none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no seam::Error thrown";
  return "";
}

void expect_error(const std::function<void(Graph&)>& build, const std::vector<std::string>& parts) {
  Graph g;
  std::string msg = error_of([&] { build(g); });
  for (auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

}  // namespace

TEST(ConvShapeErrors, ClearMessages) {
  auto conv = [](Shape x, Shape w, Conv2dOptions o) {
    return [=](Graph& g) { conv2d(g.input("x", x), g.input("w", w), std::nullopt, o); };
  };
  expect_error(conv({1, 3, 5, 5}, {4, 1, 3, 3}, {.groups = 2}), {"conv2d", "groups=2", "C_in=3"});
  expect_error(conv({1, 4, 5, 5}, {3, 2, 3, 3}, {.groups = 2}), {"conv2d", "C_out=3"});
  expect_error(conv({1, 3, 5, 5}, {4, 2, 3, 3}, {}), {"conv2d", "input channels"});
  expect_error(conv({1, 3, 2, 2}, {4, 3, 3, 3}, {}), {"conv2d", "does not fit"});
  // Overhangs by less than a stride: floor division alone would give a 1x1 output.
  expect_error(conv({1, 3, 2, 2}, {4, 3, 3, 3}, {.stride = {2, 2}}), {"conv2d", "does not fit"});
  expect_error(conv({1, 3, 5, 5}, {4, 3, 3, 3}, {.dilation = {3, 1}}), {"conv2d", "does not fit", "dilation 3"});
  expect_error(conv({1, 3, 5}, {4, 3, 3, 3}, {}), {"conv2d", "[N, C, H, W]"});
  expect_error(conv({1, 3, 5, 5}, {4, 3, 3, 3}, {.stride = {0, 1}}), {"conv2d", "stride"});
  expect_error([](Graph& g) { conv2d(g.input("x", {1, 3, 5, 5}), g.input("w", {4, 3, 3, 3}), g.input("b", {3})); },
               {"conv2d", "b must have shape [4]"});
}

TEST(PoolShapeErrors, ClearMessages) {
  expect_error([](Graph& g) { max_pool2d(g.input("x", {1, 1, 2, 2}), {3, 3}); }, {"max_pool2d", "does not fit"});
  expect_error([](Graph& g) { max_pool2d(g.input("x", {1, 1, 2, 2}), {3, 3}, {2, 2}); },
               {"max_pool2d", "does not fit"});
  expect_error([](Graph& g) { avg_pool2d(g.input("x", {1, 1, 5, 5}), {2, 2}, {}, {2, 2}); },
               {"avg_pool2d", "more than half"});
  expect_error([](Graph& g) { avg_pool2d(g.input("x", {1, 5, 5}), {2, 2}); }, {"avg_pool2d", "[N, C, H, W]"});
  expect_error([](Graph& g) { max_pool2d(g.input("x", {1, 1, 5, 5}), {2}); }, {"max_pool2d", "2 entries"});
  expect_error([](Graph& g) { global_avg_pool(g.input("x", {2, 3})); }, {"global_avg_pool", "rank 4"});
}

// conv2d_grad_input as an op of its own (ONNX's ConvTranspose): its gradients with respect
// to its input and its filter, against finite differences, with stride, padding, dilation
// and groups.
TEST(ConvTranspose, GradientsMatchFiniteDifferences) {
  struct Case {
    Shape in, w, out;
    Conv2dOptions o;
  };
  for (const Case& k : {Case{{2, 4, 3, 3}, {4, 3, 3, 3}, {2, 3, 5, 5}, {}},
                        Case{{1, 4, 3, 4}, {4, 2, 3, 3}, {1, 4, 5, 7}, {.stride = {2, 2}, .padding = {1, 1}, .groups = 2}},
                        Case{{1, 2, 4, 4}, {2, 3, 2, 2}, {1, 3, 5, 5}, {.dilation = {1, 1}}},
                        Case{{1, 3, 3, 3}, {3, 2, 3, 3}, {1, 2, 9, 9}, {.stride = {2, 2}, .dilation = {2, 2}}}}) {
    SCOPED_TRACE(shape_str(k.in) + " * " + shape_str(k.w) + " -> " + shape_str(k.out));
    check_gradients([&](GradCase& c) {
      return c.g.add1(Op::conv2d_grad_input, {c.param("x", k.in).id(), c.param("w", k.w).id()},
                      {{"stride", k.o.stride}, {"padding", k.o.padding}, {"dilation", k.o.dilation},
                       {"groups", k.o.groups}, {"shape", k.out}});
    });
  }
}
