// conv2d and its two gradients on the CPU: im2col (or col2im) per image, then one GEMM
// per group; the images spread over the cores (each GEMM on one). One image at a time keeps the column matrix compact and in cache (226 KB for
// fmnist_cnn's 3x3 convolution): a column matrix of many images side by side, for fewer
// and wider GEMMs, measured 2.5x slower on a 2-core AVX-512 machine, its rows written
// 100 KB apart (docs/perf.md).

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/parallel.h"

namespace seam::cpu {

namespace {

// The geometry of one convolution, read from the attributes and the x / w shapes.
struct ConvGeom {
  int64_t n, c, h, w;     // x
  int64_t o, kh, kw;      // w: [o, c / groups, kh, kw]
  int64_t oh, ow;         // y
  int64_t sh, sw, ph, pw, dh, dw, groups;
  int64_t cg() const { return c / groups; }
  int64_t og() const { return o / groups; }
  int64_t k() const { return cg() * kh * kw; }  // GEMM depth of one group
  int64_t p() const { return oh * ow; }         // output pixels per image
  // A 1x1 kernel with unit stride and no padding reads x itself as the column matrix.
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

ConvGeom conv_geom(const Attrs& a, const Shape& x, const Shape& w, const Shape& y) {
  const auto& st = a.ints("stride");
  const auto& pd = a.ints("padding");
  const auto& dl = a.ints("dilation");
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3],
          st[0], st[1], pd[0], pd[1], dl[0], dl[1], a.i("groups")};
}

// For kernel column j: output column ox reads input column ox * sw + off, which is inside
// the row for ox in [lo, hi).
struct Inside {
  int64_t off, lo, hi;
};
Inside inside(const ConvGeom& g, int64_t j) {
  const int64_t off = j * g.dw - g.pw;
  const int64_t lo = std::clamp<int64_t>((-off + g.sw - 1) / g.sw, 0, g.ow);
  return {off, lo, std::clamp<int64_t>((g.w - off + g.sw - 1) / g.sw, lo, g.ow)};
}

// col[(c * kh + i) * kw + j][oy * ow + ox] = x[c][oy * sh - ph + i * dh][ox * sw - pw + j * dw],
// zero where that falls in the padding. x is one image, all channels.
template <class T>
void im2col(const ConvGeom& g, const T* x, T* col) {
  parallel_for(g.c, 4, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j) {
          T* row = col + ((c * g.kh + i) * g.kw + j) * g.p();
          for (int64_t oy = 0; oy < g.oh; ++oy) {
            int64_t iy = oy * g.sh - g.ph + i * g.dh;
            T* out = row + oy * g.ow;
            if (iy < 0 || iy >= g.h) {
              std::fill(out, out + g.ow, T(0));
              continue;
            }
            const T* in = x + (c * g.h + iy) * g.w;
            const auto [off, lo, hi] = inside(g, j);  // the rest read the padding
            std::fill(out, out + lo, T(0));
            if (g.sw == 1) std::copy(in + lo + off, in + hi + off, out + lo);
            else
              for (int64_t ox = lo; ox < hi; ++ox) out[ox] = in[ox * g.sw + off];
            std::fill(out + hi, out + g.ow, T(0));
          }
        }
  });
}

// The adjoint of im2col: adds every column entry back to the pixel it was read from.
// x must be zeroed by the caller; overlapping windows accumulate.
template <class T>
void col2im(const ConvGeom& g, const T* col, T* x) {
  parallel_for(g.c, 4, [&](int64_t c0, int64_t c1) {  // a channel's rows write only its plane
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j) {
          const T* row = col + ((c * g.kh + i) * g.kw + j) * g.p();
          for (int64_t oy = 0; oy < g.oh; ++oy) {
            int64_t iy = oy * g.sh - g.ph + i * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            T* out = x + (c * g.h + iy) * g.w;
            const T* in = row + oy * g.ow;
            const auto [off, lo, hi] = inside(g, j);
            for (int64_t ox = lo; ox < hi; ++ox) out[ox * g.sw + off] += in[ox];
          }
        }
  });
}

// Each image's convolution into y (one GEMM per group), then epilogue(n, yn) on its
// result.
template <class T, class Epilogue>
void conv_forward(const ConvGeom& g, const T* x, const T* w, T* y, Epilogue&& epilogue) {
  parallel_for(g.n, 1, [&](int64_t n0, int64_t n1) {
    std::vector<T> col(g.pointwise() ? 0 : static_cast<size_t>(g.c * g.kh * g.kw * g.p()));
    for (int64_t n = n0; n < n1; ++n) {
      const T* xn = x + n * g.c * g.h * g.w;
      T* yn = y + n * g.o * g.p();
      const T* cols = xn;
      if (!g.pointwise()) {
        im2col(g, xn, col.data());
        cols = col.data();
      }
      for (int64_t gr = 0; gr < g.groups; ++gr)
        gemm(false, false, g.og(), g.p(), g.k(), w + gr * g.og() * g.k(), cols + gr * g.k() * g.p(), T(0),
             yn + gr * g.og() * g.p());
      epilogue(n, yn);
    }
  });
}

// inputs: x, w, b?; activation relu applied to each image's result.
void conv2d(const KernelArgs& a) {
  const ConvGeom g = conv_geom(a.attrs(), a.in[0].shape(), a.in[1].shape(), a.out[0].shape());
  const bool relu = a.attrs().s("activation") == "relu";
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* b = a.in.size() == 3 ? a.in[2].as<T>() : nullptr;
    conv_forward(g, a.in[0].as<T>(), a.in[1].as<T>(), a.out[0].as<T>(), [&](int64_t, T* yn) {
      if (b)
        for (int64_t o = 0; o < g.o; ++o)
          for (int64_t q = 0; q < g.p(); ++q) yn[o * g.p() + q] += b[o];
      if (relu)  // as the relu op: x > 0 ? x : 0
        for (int64_t i = 0; i < g.o * g.p(); ++i) yn[i] = yn[i] > T(0) ? yn[i] : T(0);
    });
  });
}

// inputs: x, w, gamma, beta, running_mean, running_var, z?. Each image's result is
// normalized as batch_norm in evaluation normalizes it, rounding where the unfused steps
// store: the convolution's value, the normalized one, the sum with z.
void conv2d_bn(const KernelArgs& a) {
  const ConvGeom g = conv_geom(a.attrs(), a.in[0].shape(), a.in[1].shape(), a.out[0].shape());
  const bool relu = a.attrs().s("activation") == "relu";
  const double eps = a.attrs().f("eps");
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* gamma = a.in[2].as<T>();
    const T* beta = a.in[3].as<T>();
    const T* mean = a.in[4].as<T>();
    const T* var = a.in[5].as<T>();
    const T* z = a.in.size() == 7 ? a.in[6].as<T>() : nullptr;
    std::vector<double> invstd(static_cast<size_t>(g.o));
    for (int64_t o = 0; o < g.o; ++o) invstd[static_cast<size_t>(o)] = 1.0 / std::sqrt(static_cast<double>(var[o]) + eps);
    T* y = a.out[0].as<T>();
    conv_forward(g, a.in[0].as<T>(), a.in[1].as<T>(), y, [&](int64_t, T* yn) {
      const T* zn = z ? z + (yn - y) : nullptr;
      for (int64_t o = 0; o < g.o; ++o) {
        const double m = static_cast<double>(mean[o]), s = invstd[static_cast<size_t>(o)];
        const double gm = static_cast<double>(gamma[o]), bt = static_cast<double>(beta[o]);
        for (int64_t q = 0; q < g.p(); ++q) {
          const int64_t i = o * g.p() + q;
          T v = static_cast<T>((static_cast<double>(yn[i]) - m) * s * gm + bt);
          if (zn) v = static_cast<T>(v + zn[i]);
          yn[i] = relu && !(v > T(0)) ? T(0) : v;
        }
      }
    });
  });
}

// inputs: dy, w, and with activation relu r (each image's dx masked by r > 0, as
// relu_grad) or with residual 1 z (added to each image's dx, as the add op adds);
// attribute shape = x's shape.
void conv2d_grad_input(const KernelArgs& a) {
  const ConvGeom g = conv_geom(a.attrs(), a.out[0].shape(), a.in[1].shape(), a.in[0].shape());
  const bool relu = a.attrs().s("activation") == "relu";
  const bool residual = a.attrs().has("residual") && a.attrs().i("residual") == 1;
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* dy = a.in[0].as<T>();
    const T* w = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    parallel_for(g.n, 1, [&](int64_t n0, int64_t n1) {
      std::vector<T> col(g.pointwise() ? 0 : static_cast<size_t>(g.c * g.kh * g.kw * g.p()));
      for (int64_t n = n0; n < n1; ++n) {
        const T* dyn = dy + n * g.o * g.p();
        T* dxn = dx + n * g.c * g.h * g.w;
        // Pointwise: the column matrix is dx itself, so the GEMM writes it directly.
        T* cols = g.pointwise() ? dxn : col.data();
        for (int64_t gr = 0; gr < g.groups; ++gr)
          gemm(true, false, g.k(), g.p(), g.og(), w + gr * g.og() * g.k(), dyn + gr * g.og() * g.p(), T(0),
               cols + gr * g.k() * g.p());
        if (!g.pointwise()) {
          std::fill(dxn, dxn + g.c * g.h * g.w, T(0));
          col2im(g, col.data(), dxn);
        }
        if (relu) {
          const T* rn = a.in[2].as<T>() + n * g.c * g.h * g.w;
          for (int64_t i = 0; i < g.c * g.h * g.w; ++i) dxn[i] = rn[i] > T(0) ? dxn[i] : T(0);
        }
        if (residual) {
          const T* zn = a.in[2].as<T>() + n * g.c * g.h * g.w;
          for (int64_t i = 0; i < g.c * g.h * g.w; ++i) dxn[i] = dxn[i] + zn[i];
        }
      }
    });
  });
}

// inputs: dy, x; attribute shape = w's shape.
void conv2d_grad_weight(const KernelArgs& a) {
  const ConvGeom g = conv_geom(a.attrs(), a.in[1].shape(), a.out[0].shape(), a.in[0].shape());
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    T* dw = a.out[0].as<T>();
    // The images in kSlices contiguous slices, each summed into a partial dw of its own
    // (beta = 1 adds an image's contribution), then the partials in order: the same sums
    // for any number of cores.
    constexpr int64_t kSlices = 8;
    const int64_t slices = std::min(kSlices, g.n), size = a.out[0].numel();
    // Slice 0 sums into dw itself, the others into partials added after.
    std::fill(dw, dw + size, T(0));
    std::vector<T> partial(static_cast<size_t>((slices - 1) * size), T(0));
    parallel_for(slices, 1, [&](int64_t s0, int64_t s1) {
      std::vector<T> col(g.pointwise() ? 0 : static_cast<size_t>(g.c * g.kh * g.kw * g.p()));
      for (int64_t s = s0; s < s1; ++s)
        for (int64_t n = g.n * s / slices; n < g.n * (s + 1) / slices; ++n) {
          const T* xn = x + n * g.c * g.h * g.w;
          const T* dyn = dy + n * g.o * g.p();
          const T* cols = xn;
          if (!g.pointwise()) {
            im2col(g, xn, col.data());
            cols = col.data();
          }
          T* part = s == 0 ? dw : partial.data() + (s - 1) * size;
          for (int64_t gr = 0; gr < g.groups; ++gr)
            gemm(false, true, g.og(), g.k(), g.p(), dyn + gr * g.og() * g.p(), cols + gr * g.k() * g.p(), T(1),
                 part + gr * g.og() * g.k());
        }
    });
    for (int64_t s = 1; s < slices; ++s)
      for (int64_t i = 0; i < size; ++i) dw[i] += partial[static_cast<size_t>((s - 1) * size + i)];
  });
}

}  // namespace

void register_conv(KernelTable& t) {
  set(t, Op::conv2d, conv2d);
  set(t, Op::conv2d_bn, conv2d_bn);
  set(t, Op::conv2d_grad_input, conv2d_grad_input);
  set(t, Op::conv2d_grad_weight, conv2d_grad_weight);
}

}  // namespace seam::cpu
