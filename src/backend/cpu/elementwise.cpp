// CPU kernels of the elementwise ops, generated from the expressions in seam/ops.def.
#include <cmath>

#include "backend/cpu/cpu.h"
#include "ops/elementwise.h"
#include "ops/fused_ew.h"

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

// fused_elementwise: the program interpreted per element, each op through the functor of
// its unfused kernel with the same operands and each temp held in T, so the results are
// bitwise those of the unfused ops.
template <class T>
using EwEval = T (*)(const T* v, T p);

template <class F, Uses U, class T>
T unary_grad_of(const T* v, T p) {  // v = (dy) or (dy, x) or (dy, y)
  const T x = U == Uses::X ? v[1] : T(0), y = U == Uses::Y ? v[1] : T(0);
  return F::bwd(x, y, v[0], p);
}

template <class T>
EwEval<T> evaluator(Op op) {
  switch (op) {
#define SEAM_UNARY(name, attr, def, value, derivative, uses)                           case Op::name:                                                                         return [](const T* v, T p) { return fn::name##_fn::fwd(v[0], p); };                case Op::name##_grad:                                                                  return [](const T* v, T p) { return unary_grad_of<fn::name##_fn, Uses::uses>(v, p); };
#define SEAM_BINARY(name, value, da, db)                                                           case Op::name:                                                                                     return [](const T* v, T) { return fn::name##_fn::fwd(v[0], v[1]); };                           case Op::name##_grad_a:                                                                            return [](const T* v, T) { return fn::name##_fn::grad_a(v[1], v[2], v[0]); };                  case Op::name##_grad_b:                                                                            return [](const T* v, T) { return fn::name##_fn::grad_b(v[1], v[2], v[0]); };
#include "seam/ops.def"
    default:
      fail("fused_elementwise: ", op_name(op), " is not an elementwise op");
  }
}

void fused_elementwise(const KernelArgs& a) {
  const EwProgram& prog = EwProgram::cached(a.attrs().s("program"));
  dispatch_float(a.out[0].dtype(), [&]<class T>() {
    const size_t nin = a.in.size(), ncode = prog.code.size();
    std::vector<EwEval<T>> eval;
    std::vector<T> param;
    for (const EwInstr& in : prog.code) {
      eval.push_back(evaluator<T>(in.op));
      param.push_back(static_cast<T>(in.p));
    }
    const Shape& out = a.out[0].shape();
    const size_t r = out.size();
    // Each input's element strides over the output's dims (0 where it is broadcast).
    std::vector<std::vector<int64_t>> st(nin, std::vector<int64_t>(r, 0));
    std::vector<const T*> src(nin);
    for (size_t k = 0; k < nin; ++k) {
      src[k] = a.in[k].as<T>();
      const Shape& s = a.in[k].shape();
      const auto own = row_major_strides(s);
      const size_t lead = r - s.size();
      for (size_t d = lead; d < r; ++d)
        if (s[d - lead] != 1) st[k][d] = own[d - lead];
    }
    std::vector<T*> dst;
    for (auto& o : a.out) dst.push_back(o.as<T>());
    std::vector<T> temp(ncode);
    std::vector<int64_t> idx(r, 0), off(nin, 0);
    T args[3];
    const int64_t n = numel(out);
    for (int64_t i = 0; i < n; ++i) {
      for (size_t c = 0; c < ncode; ++c) {
        const auto& as = prog.code[c].args;
        for (size_t j = 0; j < as.size(); ++j) {
          const int v = as[j];
          args[j] = v >= 0 ? src[static_cast<size_t>(v)][off[static_cast<size_t>(v)]] : temp[static_cast<size_t>(-v - 1)];
        }
        temp[c] = eval[c](args, param[c]);
      }
      for (size_t o = 0; o < dst.size(); ++o) dst[o][i] = temp[static_cast<size_t>(prog.outputs[o])];
      for (size_t d = r; d-- > 0;) {  // the next output index, odometer style
        ++idx[d];
        for (size_t k = 0; k < nin; ++k) off[k] += st[k][d];
        if (idx[d] < out[d]) break;
        for (size_t k = 0; k < nin; ++k) off[k] -= st[k][d] * out[d];
        idx[d] = 0;
      }
    }
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
  set(t, Op::fused_elementwise, fused_elementwise);
}

}  // namespace seam::cpu
