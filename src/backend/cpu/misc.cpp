// CPU kernels of the small ops: full, cast, copy, argmax, dropout, embedding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu.h"
#include "common/half.h"
#include "common/philox.h"

namespace seam::cpu {

double load_value(const TensorView& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.as<float>()[i];
    case DType::f64: return t.as<double>()[i];
    case DType::bf16: return bf16_to_float(t.as<uint16_t>()[i]);
    case DType::f16: return f16_to_float(t.as<uint16_t>()[i]);
    case DType::i32: return t.as<int32_t>()[i];
    case DType::u8: return t.as<uint8_t>()[i];
  }
  return 0;
}

// Floats round to nearest even; integers truncate toward zero and saturate.
void store_value(const TensorView& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32: t.as<float>()[i] = static_cast<float>(v); return;
    case DType::f64: t.as<double>()[i] = v; return;
    case DType::bf16: t.as<uint16_t>()[i] = float_to_bf16(static_cast<float>(v)); return;
    case DType::f16: t.as<uint16_t>()[i] = float_to_f16(static_cast<float>(v)); return;
    case DType::i32:
      t.as<int32_t>()[i] = std::isnan(v) ? 0 : static_cast<int32_t>(std::fmax(-2147483648.0, std::fmin(2147483647.0, std::trunc(v))));
      return;
    case DType::u8:
      t.as<uint8_t>()[i] = std::isnan(v) ? 0 : static_cast<uint8_t>(std::fmax(0.0, std::fmin(255.0, std::trunc(v))));
      return;
  }
}

namespace {

void full(const KernelArgs& a) {
  double v = a.attrs().f("value");
  const int64_t n = a.out[0].numel();
  for (int64_t i = 0; i < n; ++i) store_value(a.out[0], i, v);
}

void loss_scale(const KernelArgs& a) {
  a.out[0].as<float>()[0] = static_cast<float>(a.state.loss_scale > 0 ? a.state.loss_scale : a.attrs().f("init"));
}

void cast(const KernelArgs& a) {
  const int64_t n = a.out[0].numel();
  for (int64_t i = 0; i < n; ++i) store_value(a.out[0], i, load_value(a.in[0], i));
}

void copy(const KernelArgs& a) { std::memcpy(a.out[0].data, a.in[0].data, a.out[0].type.bytes()); }

void argmax(const KernelArgs& a) {
  const Shape& s = a.in[0].shape();
  int axis = normalize_axis(a.attrs().i("axis"), s.size());
  int64_t outer = 1, len = s[static_cast<size_t>(axis)], inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t classes = a.attrs().i("classes") > 0 ? a.attrs().i("classes") : len;
  int32_t* y = a.out[0].as<int32_t>();
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* x = a.in[0].as<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const T* p = x + o * len * inner + i;
        int64_t best = 0;
        for (int64_t j = 1; j < classes; ++j)
          if (p[j * inner] > p[best * inner]) best = j;
        y[o * inner + i] = static_cast<int32_t>(best);
      }
  });
}

// Forward and backward are the same computation: multiply by mask / (1 - p).
void dropout(const KernelArgs& a) {
  const double p = a.attrs().f("p");
  const bool training = a.attrs().i("training") != 0;
  const auto stream = static_cast<uint32_t>(a.attrs().i("stream"));
  const int64_t n = a.out[0].numel();
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    if (!training || p == 0) {
      std::memcpy(y, x, static_cast<size_t>(n) * sizeof(T));
      return;
    }
    const T keep_scale = static_cast<T>(1.0 / (1.0 - p));
    const auto seed = a.state.seed;
    const auto step = static_cast<uint64_t>(a.state.step);
    for (int64_t i = 0; i < n; ++i) {
      float u = dropout_uniform(seed, step, stream, static_cast<uint64_t>(i));
      y[i] = u >= static_cast<float>(p) ? x[i] * keep_scale : T(0);
    }
  });
}

void count_equal(const KernelArgs& a) {
  const int32_t* x = a.in[0].as<int32_t>();
  const int32_t* y = a.in[1].as<int32_t>();
  int32_t n = 0;
  for (int64_t i = 0; i < a.in[0].numel(); ++i) n += y[i] >= 0 && x[i] == y[i];
  a.out[0].as<int32_t>()[0] = n;
}

void accumulate(const KernelArgs& a) {
  if (a.attrs().i("training") == 0) return;
  float* acc = a.in[0].as<float>();
  for (size_t i = 1; i < a.in.size(); ++i) {
    const double v = load_value(a.in[i], 0);
    if (std::isfinite(v)) acc[i - 1] += static_cast<float>(v);
  }
}

void embedding(const KernelArgs& a) {
  const int32_t* ids = a.in[0].as<int32_t>();
  const int64_t num = a.in[1].shape()[0], dim = a.in[1].shape()[1], n = a.in[0].numel();
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= num)
      fail("embedding '", a.step.name, "': id ", ids[i], " at position ", i, " is outside [0, ", num, ")");
  const size_t row = static_cast<size_t>(dim) * dtype_size(a.in[1].dtype());
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(a.out[0].data + static_cast<size_t>(i) * row, a.in[1].data + static_cast<size_t>(ids[i]) * row, row);
}

// With acc (a tied weight's other gradient): the rows' sums first, then acc + sum, one
// rounding as the add this replaces had. acc may be dweight's own buffer.
void embedding_grad(const KernelArgs& a) {
  const int32_t* ids = a.in[1].as<int32_t>();
  const int64_t num = a.out[0].shape()[0], dim = a.out[0].shape()[1], n = a.in[1].numel();
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= num)
      fail("embedding_grad '", a.step.name, "': id ", ids[i], " at position ", i, " is outside [0, ", num, ")");
  dispatch_float(a.out[0].dtype(), [&]<class T>() {
    const T* dy = a.in[0].as<T>();
    T* dw = a.out[0].as<T>();
    std::vector<T> sums;
    T* into = dw;
    if (a.in.size() > 2) sums.assign(static_cast<size_t>(num * dim), T(0)), into = sums.data();
    else std::fill(dw, dw + num * dim, T(0));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < dim; ++j) into[ids[i] * dim + j] += dy[i * dim + j];
    if (a.in.size() > 2) {
      const T* acc = a.in[2].as<T>();
      for (int64_t e = 0; e < num * dim; ++e) dw[e] = acc[e] + sums[static_cast<size_t>(e)];
    }
  });
}

}  // namespace

void register_misc(KernelTable& t) {
  set(t, Op::full, full);
  set(t, Op::loss_scale, loss_scale);
  set(t, Op::cast, cast);
  set(t, Op::copy, copy);
  set(t, Op::argmax, argmax);
  set(t, Op::count_equal, count_equal);
  set(t, Op::accumulate, accumulate);
  set(t, Op::dropout, dropout);
  set(t, Op::dropout_grad, dropout);
  set(t, Op::embedding, embedding);
  set(t, Op::embedding_grad, embedding_grad);
}

}  // namespace seam::cpu
