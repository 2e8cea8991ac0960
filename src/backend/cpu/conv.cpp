// conv2d and its two gradients on the CPU: im2col (or col2im) over a chunk of images
// side by side, then one GEMM per group and chunk: a batch of 128 Fashion-MNIST images is
// one GEMM of [64, 288] x [288, 25088] rather than 128 of [64, 288] x [288, 196], which
// leave BLAS mostly in its call and packing overhead.

#include <algorithm>

#include "backend/cpu/cpu.h"
#include "backend/cpu/gemm.h"

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
};

ConvGeom conv_geom(const Attrs& a, const Shape& x, const Shape& w, const Shape& y) {
  const auto& st = a.ints("stride");
  const auto& pd = a.ints("padding");
  const auto& dl = a.ints("dilation");
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3],
          st[0], st[1], pd[0], pd[1], dl[0], dl[1], a.i("groups")};
}

// Images are taken in chunks whose column matrix stays under this many elements (32 MB of
// f32), so a batch becomes a few GEMMs of many columns instead of one small GEMM per
// image. A GEMM of little depth (c kh kw / groups under 32, as a stem convolution of a
// one-channel image) gains nothing from more columns and would pay more for moving its
// output into and out of the chunk's [channels][images x pixels] layout than for the
// GEMM itself: it goes one image at a time, reading dy and writing y in place.
constexpr int64_t kChunkElements = int64_t{8} << 20;
constexpr int64_t kMinChunkDepth = 32;

// A thread's working buffers, kept between calls: a fresh 30 MB vector per call would be
// new pages to fault in and zero on every step. slot 0: columns, 1: output or dy.
template <class T>
T* scratch(int slot, int64_t elements) {
  thread_local std::vector<T> buf[2];
  auto& b = buf[slot];
  if (b.size() < static_cast<size_t>(elements)) b.resize(static_cast<size_t>(elements));
  return b.data();
}

int64_t chunk_images(const ConvGeom& g) {
  if (g.k() < kMinChunkDepth) return 1;
  const int64_t per_image = std::max<int64_t>(1, g.c * g.kh * g.kw * g.p());
  return std::clamp<int64_t>(kChunkElements / per_image, 1, std::max<int64_t>(g.n, 1));
}

// col[(c * kh + i) * kw + j][oy * ow + ox] = x[c][oy * sh - ph + i * dh][ox * sw - pw + j * dw],
// zero where that falls in the padding. x is one image, all channels; col points at the
// image's first column of a matrix whose rows are ld long (the chunk's images side by side).
template <class T>
void im2col(const ConvGeom& g, const T* x, T* col, int64_t ld) {
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        T* row = col + ((c * g.kh + i) * g.kw + j) * ld;
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          int64_t iy = oy * g.sh - g.ph + i * g.dh;
          T* out = row + oy * g.ow;
          if (iy < 0 || iy >= g.h) {
            std::fill(out, out + g.ow, T(0));
            continue;
          }
          const T* in = x + (c * g.h + iy) * g.w;
          // Outputs [lo, hi) read inside the row; the rest read the padding.
          const int64_t off = j * g.dw - g.pw;
          const int64_t lo = std::clamp<int64_t>((-off + g.sw - 1) / g.sw, 0, g.ow);
          const int64_t hi = std::clamp<int64_t>((g.w - off + g.sw - 1) / g.sw, lo, g.ow);
          std::fill(out, out + lo, T(0));
          if (g.sw == 1) std::copy(in + lo + off, in + hi + off, out + lo);
          else
            for (int64_t ox = lo; ox < hi; ++ox) out[ox] = in[ox * g.sw + off];
          std::fill(out + hi, out + g.ow, T(0));
        }
      }
}

// The adjoint of im2col: adds every column entry back to the pixel it was read from.
// x must be zeroed by the caller; overlapping windows accumulate.
template <class T>
void col2im(const ConvGeom& g, const T* col, int64_t ld, T* x) {
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const T* row = col + ((c * g.kh + i) * g.kw + j) * ld;
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          int64_t iy = oy * g.sh - g.ph + i * g.dh;
          if (iy < 0 || iy >= g.h) continue;
          T* out = x + (c * g.h + iy) * g.w;
          const T* in = row + oy * g.ow;
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            int64_t ix = ox * g.sw - g.pw + j * g.dw;
            if (ix >= 0 && ix < g.w) out[ix] += in[ox];
          }
        }
      }
}

// The chunk's column matrix [c kh kw][nb p]: image b's columns at b p.
template <class T>
void chunk_columns(const ConvGeom& g, const T* x, int64_t n0, int64_t nb, T* col) {
  for (int64_t b = 0; b < nb; ++b) im2col(g, x + (n0 + b) * g.c * g.h * g.w, col + b * g.p(), nb * g.p());
}

// dy of the chunk's images, [n][o][p] -> [o][nb p], the layout its GEMMs read.
template <class T>
void gather_dy(const ConvGeom& g, const T* dy, int64_t n0, int64_t nb, T* out) {
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t o = 0; o < g.o; ++o) {
      const T* src = dy + ((n0 + b) * g.o + o) * g.p();
      std::copy(src, src + g.p(), out + (o * nb + b) * g.p());
    }
}

// inputs: x, w, b?
void conv2d(const KernelArgs& a) {
  const ConvGeom g = conv_geom(a.attrs(), a.in[0].shape(), a.in[1].shape(), a.out[0].shape());
  const int64_t chunk = chunk_images(g);
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* x = a.in[0].as<T>();
    const T* w = a.in[1].as<T>();
    const T* bias = a.in.size() == 3 ? a.in[2].as<T>() : nullptr;
    T* y = a.out[0].as<T>();
    T* col = scratch<T>(0, g.groups * g.k() * chunk * g.p());
    T* out = chunk > 1 ? scratch<T>(1, g.o * chunk * g.p()) : nullptr;
    for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
      const int64_t nb = std::min(chunk, g.n - n0), cols = nb * g.p();
      chunk_columns(g, x, n0, nb, col);
      // One image's [o][p] is y's own layout: written in place.
      T* dst = chunk > 1 ? out : y + n0 * g.o * g.p();
      for (int64_t gr = 0; gr < g.groups; ++gr)
        gemm(false, false, g.og(), cols, g.k(), w + gr * g.og() * g.k(), col + gr * g.k() * cols, T(0),
             dst + gr * g.og() * cols);
      // [o][nb p] back to [n][o][p], the bias added on the way.
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t o = 0; o < g.o; ++o) {
          const T* src = dst + (o * nb + b) * g.p();
          T* to = y + ((n0 + b) * g.o + o) * g.p();
          const T add = bias ? bias[o] : T(0);
          if (src != to || add != T(0))
            for (int64_t q = 0; q < g.p(); ++q) to[q] = src[q] + add;
        }
    }
  });
}

// inputs: dy, w; attribute shape = x's shape.
void conv2d_grad_input(const KernelArgs& a) {
  const ConvGeom g = conv_geom(a.attrs(), a.out[0].shape(), a.in[1].shape(), a.in[0].shape());
  const int64_t chunk = chunk_images(g);
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* dy = a.in[0].as<T>();
    const T* w = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    std::fill(dx, dx + a.out[0].numel(), T(0));
    T* col = scratch<T>(0, g.groups * g.k() * chunk * g.p());
    T* dyc = chunk > 1 ? scratch<T>(1, g.o * chunk * g.p()) : nullptr;
    for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
      const int64_t nb = std::min(chunk, g.n - n0), cols = nb * g.p();
      const T* src = chunk > 1 ? dyc : dy + n0 * g.o * g.p();
      if (chunk > 1) gather_dy(g, dy, n0, nb, dyc);
      for (int64_t gr = 0; gr < g.groups; ++gr)
        gemm(true, false, g.k(), cols, g.og(), w + gr * g.og() * g.k(), src + gr * g.og() * cols, T(0),
             col + gr * g.k() * cols);
      for (int64_t b = 0; b < nb; ++b) col2im(g, col + b * g.p(), cols, dx + (n0 + b) * g.c * g.h * g.w);
    }
  });
}

// inputs: dy, x; attribute shape = w's shape.
void conv2d_grad_weight(const KernelArgs& a) {
  const ConvGeom g = conv_geom(a.attrs(), a.in[1].shape(), a.out[0].shape(), a.in[0].shape());
  const int64_t chunk = chunk_images(g);
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    T* dw = a.out[0].as<T>();
    std::fill(dw, dw + a.out[0].numel(), T(0));
    T* col = scratch<T>(0, g.groups * g.k() * chunk * g.p());
    T* dyc = chunk > 1 ? scratch<T>(1, g.o * chunk * g.p()) : nullptr;
    for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
      const int64_t nb = std::min(chunk, g.n - n0), cols = nb * g.p();
      chunk_columns(g, x, n0, nb, col);
      const T* src = chunk > 1 ? dyc : dy + n0 * g.o * g.p();
      if (chunk > 1) gather_dy(g, dy, n0, nb, dyc);
      // Summed over the chunks: beta = 1 adds each chunk's contribution.
      for (int64_t gr = 0; gr < g.groups; ++gr)
        gemm(false, true, g.og(), g.k(), cols, src + gr * g.og() * cols, col + gr * g.k() * cols, T(1),
             dw + gr * g.og() * g.k());
    }
  });
}

}  // namespace

void register_conv(KernelTable& t) {
  set(t, Op::conv2d, conv2d);
  set(t, Op::conv2d_grad_input, conv2d_grad_input);
  set(t, Op::conv2d_grad_weight, conv2d_grad_weight);
}

}  // namespace seam::cpu
