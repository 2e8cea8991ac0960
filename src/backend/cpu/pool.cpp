// Pooling kernels on the CPU: max and average over 2D windows (with their gradients) and
// the global average. Loops over one (image, channel) plane at a time.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu.h"
#include "backend/cpu/parallel.h"

namespace seam::cpu {

namespace {

// The geometry of one pooling op; x [N, C, H, W] -> y [N, C, OH, OW].
struct PoolGeom {
  int64_t planes, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw;
  bool count_include_pad = true;

  // The window of output (oy, ox) clipped to the unpadded input: rows [y0, y1), cols [x0, x1).
  struct Window {
    int64_t y0, y1, x0, x1;
  };
  Window window(int64_t oy, int64_t ox) const {
    int64_t ys = oy * sh - ph, xs = ox * sw - pw;
    return {std::max<int64_t>(ys, 0), std::min(ys + kh, h), std::max<int64_t>(xs, 0), std::min(xs + kw, w)};
  }
  // The divisor of an average window, as PyTorch (floor mode: windows never pass the padding).
  int64_t divisor(const Window& win) const {
    return count_include_pad ? kh * kw : (win.y1 - win.y0) * (win.x1 - win.x0);
  }
};

PoolGeom pool_geom(const Attrs& a, const Shape& x, const Shape& y) {
  const auto& k = a.ints("kernel");
  auto st = a.ints("stride");
  if (st.empty()) st = k;
  const auto& pd = a.ints("padding");
  PoolGeom g{x[0] * x[1], x[2], x[3], y[2], y[3], k[0], k[1], st[0], st[1], pd[0], pd[1]};
  if (a.has("count_include_pad")) g.count_include_pad = a.i("count_include_pad") != 0;
  return g;
}

// The running first maximum (offset best, value b) after element i: x[i] replaces it when
// it is larger, or NaN over a number (so that a NaN propagates, as in PyTorch).
template <class T>
void keep_max(const T* x, int64_t i, int64_t& best, T& b) {
  const T v = x[i];
  const bool wins = !(v <= b) && b == b;
  best = wins ? i : best;
  b = wins ? v : b;
}

// Offset (within the plane) of the first maximum of a window in row-major order. Padding
// never wins.
template <class T>
int64_t argmax(const PoolGeom& g, const T* x, const PoolGeom::Window& win) {
  int64_t best = win.y0 * g.w + win.x0;
  T b = x[best];
  for (int64_t iy = win.y0; iy < win.y1; ++iy)
    for (int64_t ix = win.x0; ix < win.x1; ++ix) keep_max(x, iy * g.w + ix, best, b);
  return best;
}

// The same for a K x K window wholly inside the plane, its top-left corner at offset i0:
// the loops unroll.
template <int K, class T>
int64_t argmax_inside(const PoolGeom& g, const T* x, int64_t i0) {
  int64_t best = i0;
  T b = x[i0];
  for (int dy = 0; dy < K; ++dy)
    for (int dx = 0; dx < K; ++dx) keep_max(x, i0 + dy * g.w + dx, best, b);
  return best;
}

// Calls f(output offset, input offset of its window's maximum) for every output of a plane.
template <class T, class F>
void each_argmax(const PoolGeom& g, const T* x, F&& f) {
  const bool square = g.kh == g.kw && (g.kh == 2 || g.kh == 3);
  for (int64_t oy = 0; oy < g.oh; ++oy)
    for (int64_t ox = 0; ox < g.ow; ++ox) {
      const auto win = g.window(oy, ox);
      const bool inside = win.y1 - win.y0 == g.kh && win.x1 - win.x0 == g.kw;
      const int64_t i0 = win.y0 * g.w + win.x0;
      const int64_t best = !(square && inside) ? argmax(g, x, win)
                           : g.kh == 2         ? argmax_inside<2>(g, x, i0)
                                               : argmax_inside<3>(g, x, i0);
      f(oy * g.ow + ox, best);
    }
}

// 2x2 windows at stride 2 without padding, the pooling of most CNNs, have a flat form
// the compiler vectorizes: the windows tile the plane, so a window's maximum and its
// gradient's place come from four loads and strict comparisons (the first maximum wins a
// tie). It holds for planes without NaN; a plane with one takes each_argmax, whose rule
// makes the NaN win.
bool tiles_2x2(const PoolGeom& g) {
  return g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0;
}

template <class T>
bool has_nan(const T* x, int64_t n) {
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) nan |= x[i] != x[i];
  return nan;
}

template <class T>
void max_2x2(const PoolGeom& g, const T* x, T* y) {
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    const T* r0 = x + 2 * oy * g.w;
    const T* r1 = r0 + g.w;
    T* out = y + oy * g.ow;
    for (int64_t ox = 0; ox < g.ow; ++ox)
      out[ox] = std::max(std::max(r0[2 * ox], r0[2 * ox + 1]), std::max(r1[2 * ox], r1[2 * ox + 1]));
  }
}

// dx (zeroed) gets each window's dy at its first maximum.
template <class T>
void max_2x2_grad(const PoolGeom& g, const T* x, const T* dy, T* dx) {
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    const T* r0 = x + 2 * oy * g.w;
    const T* r1 = r0 + g.w;
    T* d0 = dx + 2 * oy * g.w;
    T* d1 = d0 + g.w;
    const T* d = dy + oy * g.ow;
    for (int64_t ox = 0; ox < g.ow; ++ox) {
      const T a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], e = r1[2 * ox + 1];
      const bool ib = b > a, ic = c > std::max(a, b), ie = e > std::max(std::max(a, b), c);
      const int k = ie ? 3 : ic ? 2 : ib ? 1 : 0;
      d0[2 * ox] = k == 0 ? d[ox] : T(0);
      d0[2 * ox + 1] = k == 1 ? d[ox] : T(0);
      d1[2 * ox] = k == 2 ? d[ox] : T(0);
      d1[2 * ox + 1] = k == 3 ? d[ox] : T(0);
    }
  }
}

void max_pool2d(const KernelArgs& a) {
  const PoolGeom g = pool_geom(a.attrs(), a.in[0].shape(), a.out[0].shape());
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    parallel_for(g.planes, 16, [&](int64_t p0, int64_t p1) {
      for (int64_t pl = p0; pl < p1; ++pl) {
        const T* x = a.in[0].as<T>() + pl * g.h * g.w;
        T* y = a.out[0].as<T>() + pl * g.oh * g.ow;
        if (tiles_2x2(g) && !has_nan(x, g.h * g.w)) max_2x2(g, x, y);
        else each_argmax(g, x, [&](int64_t o, int64_t i) { y[o] = x[i]; });
      }
    });
  });
}

// inputs: dy, x, y (y unused here: the argmax is recomputed from x). Overlapping
// windows that share a maximum both add to it.
void max_pool2d_grad(const KernelArgs& a) {
  const PoolGeom g = pool_geom(a.attrs(), a.in[1].shape(), a.in[0].shape());
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    parallel_for(g.planes, 16, [&](int64_t p0, int64_t p1) {
      std::fill(a.out[0].as<T>() + p0 * g.h * g.w, a.out[0].as<T>() + p1 * g.h * g.w, T(0));
      for (int64_t pl = p0; pl < p1; ++pl) {
        const T* dy = a.in[0].as<T>() + pl * g.oh * g.ow;
        const T* x = a.in[1].as<T>() + pl * g.h * g.w;
        T* dx = a.out[0].as<T>() + pl * g.h * g.w;
        if (tiles_2x2(g) && !has_nan(x, g.h * g.w)) max_2x2_grad(g, x, dy, dx);
        else each_argmax(g, x, [&](int64_t o, int64_t i) { dx[i] += dy[o]; });
      }
    });
  });
}

void avg_pool2d(const KernelArgs& a) {
  const PoolGeom g = pool_geom(a.attrs(), a.in[0].shape(), a.out[0].shape());
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    for (int64_t pl = 0; pl < g.planes; ++pl) {
      const T* x = a.in[0].as<T>() + pl * g.h * g.w;
      T* y = a.out[0].as<T>() + pl * g.oh * g.ow;
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const auto win = g.window(oy, ox);
          double s = 0;
          for (int64_t iy = win.y0; iy < win.y1; ++iy)
            for (int64_t ix = win.x0; ix < win.x1; ++ix) s += x[iy * g.w + ix];
          y[oy * g.ow + ox] = static_cast<T>(s / static_cast<double>(g.divisor(win)));
        }
    }
  });
}

// inputs: dy; attribute shape = x's shape.
void avg_pool2d_grad(const KernelArgs& a) {
  const PoolGeom g = pool_geom(a.attrs(), a.out[0].shape(), a.in[0].shape());
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    std::fill(a.out[0].as<T>(), a.out[0].as<T>() + a.out[0].numel(), T(0));
    for (int64_t pl = 0; pl < g.planes; ++pl) {
      const T* dy = a.in[0].as<T>() + pl * g.oh * g.ow;
      T* dx = a.out[0].as<T>() + pl * g.h * g.w;
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const auto win = g.window(oy, ox);
          const T share = dy[oy * g.ow + ox] / static_cast<T>(g.divisor(win));
          for (int64_t iy = win.y0; iy < win.y1; ++iy)
            for (int64_t ix = win.x0; ix < win.x1; ++ix) dx[iy * g.w + ix] += share;
        }
    }
  });
}

void global_avg_pool(const KernelArgs& a) {
  const Shape& s = a.in[0].shape();
  const int64_t planes = s[0] * s[1], hw = s[2] * s[3];
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    for (int64_t pl = 0; pl < planes; ++pl) {
      double sum = 0;
      for (int64_t i = 0; i < hw; ++i) sum += x[pl * hw + i];
      y[pl] = static_cast<T>(sum / static_cast<double>(hw));
    }
  });
}

}  // namespace

void register_pool(KernelTable& t) {
  set(t, Op::max_pool2d, max_pool2d);
  set(t, Op::max_pool2d_grad, max_pool2d_grad);
  set(t, Op::avg_pool2d, avg_pool2d);
  set(t, Op::avg_pool2d_grad, avg_pool2d_grad);
  set(t, Op::global_avg_pool, global_avg_pool);
}

}  // namespace seam::cpu
