// CPU kernels of the elementwise ops, generated from the expressions in seam/ops.def.
#include <cmath>

#include "backend/cpu/cpu.h"
#include "ops/elementwise.h"

#include "ops/ew_math_std.h"

namespace seam::cpu {

namespace {

// One functor per op (name_fn, so that the expression's calls of exp, tanh, ... find
// the math functions, not the struct): fwd(x, p) and bwd(x, y, dy, p); only the value named by the op's
// `uses` is meaningful in bwd, the other is passed as zero.
namespace fn {
using namespace seam_ew;
#define SEAM_UNARY(name, attr, def, value, derivative, uses)                      \
  struct name##_fn {                                                              \
    template <class T>                                                            \
    static T fwd(T x, [[maybe_unused]] T p) {                                     \
      return value;                                                               \
    }                                                                             \
    template <class T>                                                            \
    static T bwd([[maybe_unused]] T x, [[maybe_unused]] T y, T dy, [[maybe_unused]] T p) { \
      return derivative;                                                          \
    }                                                                             \
  };
#define SEAM_BINARY(name, value, da, db)                                          \
  struct name##_fn {                                                              \
    template <class T>                                                            \
    static T fwd(T a, T b) {                                                      \
      return value;                                                               \
    }                                                                             \
    template <class T>                                                            \
    static T grad_a([[maybe_unused]] T a, [[maybe_unused]] T b, T dy) {           \
      return da;                                                                  \
    }                                                                             \
    template <class T>                                                            \
    static T grad_b([[maybe_unused]] T a, [[maybe_unused]] T b, T dy) {           \
      return db;                                                                  \
    }                                                                             \
  };
#include "seam/ops.def"
}  // namespace fn

double scalar_attr(const KernelArgs& a, const char* attr) { return *attr ? a.attrs().f(attr) : 0.0; }

template <class F, const char* Attr>
void unary_fwd(const KernelArgs& a) {
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    T p = static_cast<T>(scalar_attr(a, Attr));
    const int64_t n = a.out[0].numel();
    for (int64_t i = 0; i < n; ++i) y[i] = F::fwd(x[i], p);
  });
}

// Inputs (dy) or (dy, x) or (dy, y), as the op's `uses` says.
template <class F, const char* Attr, Uses U>
void unary_bwd(const KernelArgs& a) {
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* dy = a.in[0].as<T>();
    const T* v = a.in.size() > 1 ? a.in[1].as<T>() : nullptr;
    T* dx = a.out[0].as<T>();
    T p = static_cast<T>(scalar_attr(a, Attr));
    const int64_t n = a.out[0].numel();
    for (int64_t i = 0; i < n; ++i) {
      T x = U == Uses::X ? v[i] : T(0), y = U == Uses::Y ? v[i] : T(0);
      dx[i] = F::bwd(x, y, dy[i], p);
    }
  });
}

template <class F>
void binary_fwd(const KernelArgs& a) {
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    const T* x = a.in[0].as<T>();
    const T* z = a.in[1].as<T>();
    T* y = a.out[0].as<T>();
    for_each_broadcast<2>(a.out[0].shape(), {&a.in[0].shape(), &a.in[1].shape()},
                          [&](int64_t i, const std::array<int64_t, 2>& o) { y[i] = F::fwd(x[o[0]], z[o[1]]); });
  });
}

// Inputs (dy, a, b), output at dy's shape; `Side` picks da or db.
template <class F, int Side>
void binary_bwd(const KernelArgs& k) {
  dispatch_float(k.in[0].dtype(), [&]<class T>() {
    const T* dy = k.in[0].as<T>();
    const T* a = k.in[1].as<T>();
    const T* b = k.in[2].as<T>();
    T* d = k.out[0].as<T>();
    for_each_broadcast<2>(k.out[0].shape(), {&k.in[1].shape(), &k.in[2].shape()},
                          [&](int64_t i, const std::array<int64_t, 2>& o) {
                            d[i] = Side == 0 ? F::grad_a(a[o[0]], b[o[1]], dy[i])
                                             : F::grad_b(a[o[0]], b[o[1]], dy[i]);
                          });
  });
}

// Attribute names as objects with linkage, so they can be template arguments.
#define SEAM_UNARY(name, attr, def, value, derivative, uses) constexpr char attr_##name[] = attr;
#include "seam/ops.def"

}  // namespace

void register_elementwise(KernelTable& t) {
#define SEAM_UNARY(name, attr, def, value, derivative, uses)           \
  set(t, Op::name, unary_fwd<fn::name##_fn, attr_##name>);                 \
  set(t, Op::name##_grad, unary_bwd<fn::name##_fn, attr_##name, Uses::uses>);
#define SEAM_BINARY(name, value, da, db)                  \
  set(t, Op::name, binary_fwd<fn::name##_fn>);                 \
  set(t, Op::name##_grad_a, binary_bwd<fn::name##_fn, 0>);     \
  set(t, Op::name##_grad_b, binary_bwd<fn::name##_fn, 1>);
#include "seam/ops.def"
}

}  // namespace seam::cpu
