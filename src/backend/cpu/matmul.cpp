// matmul and linear on the CPU through BLAS (row-major GEMM).
#include <cblas.h>

#include "backend/cpu/cpu.h"

namespace seam::cpu {

namespace {

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a,
              static_cast<int>(ta ? m : k), b, static_cast<int>(tb ? k : n), 0.0f, c, static_cast<int>(n));
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, const double* b, double* c) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a,
              static_cast<int>(ta ? m : k), b, static_cast<int>(tb ? k : n), 0.0, c, static_cast<int>(n));
}

void matmul(const KernelArgs& x) {
  const Shape& as = x.in[0].shape();
  const Shape& bs = x.in[1].shape();
  const Shape& ys = x.out[0].shape();
  bool ta = x.attrs().i("transpose_a") != 0, tb = x.attrs().i("transpose_b") != 0;
  int64_t m = ys[ys.size() - 2], n = ys.back();
  int64_t k = as[as.size() - (ta ? 2 : 1)];
  dispatch_float(x.in[0].dtype(), [&]<class T>() {
    const T* a = x.in[0].as<T>();
    const T* b = x.in[1].as<T>();
    T* y = x.out[0].as<T>();
    if (bs.size() == 2 && !ta) {  // a's batch dims fold into M: one GEMM
      gemm(false, tb, x.in[0].numel() / k, n, k, a, b, y);
      return;
    }
    Shape batch(ys.begin(), ys.end() - 2), ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
    for_each_broadcast<2>(batch, {&ab, &bb}, [&](int64_t i, const std::array<int64_t, 2>& o) {
      gemm(ta, tb, m, n, k, a + o[0] * m * k, b + o[1] * k * n, y + i * m * n);
    });
  });
}

void linear(const KernelArgs& x) {
  int64_t in = x.in[1].shape()[1], out = x.in[1].shape()[0];
  int64_t rows = x.in[0].numel() / in;
  dispatch_float(x.in[0].dtype(), [&]<class T>() {
    T* y = x.out[0].as<T>();
    gemm(false, true, rows, out, in, x.in[0].as<T>(), x.in[1].as<T>(), y);
    if (x.in.size() == 3) {
      const T* b = x.in[2].as<T>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < out; ++j) y[r * out + j] += b[j];
    }
  });
}

}  // namespace

void register_matmul(KernelTable& t) {
  set(t, Op::matmul, matmul);
  set(t, Op::linear, linear);
}

}  // namespace seam::cpu
