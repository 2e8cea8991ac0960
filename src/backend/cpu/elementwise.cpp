// CPU kernels of the elementwise ops, generated from the expressions in seam/ops.def.
#include <cmath>
#include <type_traits>

#include "backend/cpu/cpu.h"
#include "common/half.h"
#include "common/philox.h"
#include "ops/elementwise.h"
#include "ops/fused_ew.h"
#include "ops/shapes.h"

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
// its unfused kernel with the same operands and each temp held in T (float, or double for
// f64 data), so the results are bitwise those of the unfused ops. cast[<dtype>] rounds
// as the cast kernel does (a double through float first).
template <class T>
using EwEval = T (*)(const T* v, T p);

template <class F, Uses U, class T>
T unary_grad_of(const T* v, T p) {  // v = (dy) or (dy, x) or (dy, y)
  const T x = U == Uses::X ? v[1] : T(0), y = U == Uses::Y ? v[1] : T(0);
  return F::bwd(x, y, v[0], p);
}

template <class T>
EwEval<T> cast_evaluator(DType to) {
  switch (to) {
    case DType::bf16:
      return [](const T* v, T) { return static_cast<T>(bf16_to_float(float_to_bf16(static_cast<float>(v[0])))); };
    case DType::f16:
      return [](const T* v, T) { return static_cast<T>(f16_to_float(float_to_f16(static_cast<float>(v[0])))); };
    case DType::f32: return [](const T* v, T) { return static_cast<T>(static_cast<float>(v[0])); };
    default: return [](const T* v, T) { return v[0]; };
  }
}

template <class T>
EwEval<T> evaluator(const EwInstr& in) {
  switch (in.op) {
#define SEAM_UNARY(name, attr, def, value, derivative, uses)                           \
  case Op::name:                                                                       \
    return [](const T* v, T p) { return fn::name##_fn::fwd(v[0], p); };                \
  case Op::name##_grad:                                                                \
    return [](const T* v, T p) { return unary_grad_of<fn::name##_fn, Uses::uses>(v, p); };
#define SEAM_BINARY(name, value, da, db)                                               \
  case Op::name:                                                                       \
    return [](const T* v, T) { return fn::name##_fn::fwd(v[0], v[1]); };               \
  case Op::name##_grad_a:                                                              \
    return [](const T* v, T) { return fn::name##_fn::grad_a(v[1], v[2], v[0]); };      \
  case Op::name##_grad_b:                                                              \
    return [](const T* v, T) { return fn::name##_fn::grad_b(v[1], v[2], v[0]); };
#include "seam/ops.def"
    case Op::cast: return cast_evaluator<T>(in.dtype);
    case Op::dropout:
    case Op::dropout_grad: return nullptr;  // draws: evaluated in the walk, which knows the element
    default:
      fail("fused_elementwise: ", op_name(in.op), " is not an elementwise op");
  }
}

// The executor hands 16-bit operands over as f32 copies; an operand in another dtype than
// the one the group computes in (a 16-bit one, should it come as is) is converted here,
// into a copy of its own on the way in and from one on the way out.
template <class T>
void fused_elementwise_in(const KernelArgs& a, const EwProgram& prog) {
  constexpr DType own = std::is_same_v<T, double> ? DType::f64 : DType::f32;
  const size_t nin = a.in.size(), ncode = prog.code.size(), nout = a.out.size();
  std::vector<EwEval<T>> eval;
  std::vector<T> param;
  for (const EwInstr& in : prog.code) {
    eval.push_back(evaluator<T>(in));
    param.push_back(static_cast<T>(in.p));
  }
  Shape shape;  // the index space: every input broadcast
  for (auto& in : a.in) shape = *broadcast_shapes(shape, in.shape());
  const size_t r = shape.size();
  // Element strides over the index space of each input (0 where it is broadcast), then
  // of each output (0 along the reduced axes of a sum or mean).
  std::vector<std::vector<int64_t>> st(nin + nout, std::vector<int64_t>(r, 0));
  auto strides_of = [&](std::vector<int64_t>& to, const Shape& s) {
    const auto own_st = row_major_strides(s);
    const size_t lead = r - s.size();
    for (size_t d = lead; d < r; ++d)
      if (s[d - lead] != 1) to[d] = own_st[d - lead];
  };
  std::vector<std::vector<T>> copies(nin + nout);
  auto converted = [&](size_t slot, const TensorView& t, bool load) {
    auto& c = copies[slot];
    c.resize(static_cast<size_t>(t.numel()));
    if (load)
      for (size_t e = 0; e < c.size(); ++e) c[e] = static_cast<T>(load_value(t, static_cast<int64_t>(e)));
    return c.data();
  };
  std::vector<const T*> src(nin);
  for (size_t k = 0; k < nin; ++k) {
    src[k] = a.in[k].dtype() == own ? a.in[k].as<T>() : converted(k, a.in[k], true);
    strides_of(st[k], a.in[k].shape());
  }
  const auto axes = reduce_axes(a.attrs().ints("axes"), r, nullptr);
  Shape kept = shape;
  for (int d : axes) kept[static_cast<size_t>(d)] = 1;
  std::vector<T*> dst;
  std::vector<std::vector<double>> acc(nout);  // a reduced output's sums, as sum adds them
  // A layer norm's input goes to y first, and is normalized in place after the walk.
  auto stored = [&](size_t o) { return prog.reduce[o] == EwReduce::none || prog.reduce[o] == EwReduce::ln_y; };
  for (size_t o = 0; o < nout; ++o) {
    dst.push_back(a.out[o].dtype() == own ? a.out[o].as<T>() : converted(nin + o, a.out[o], false));
    if (summed(prog.reduce[o])) {
      strides_of(st[nin + o], kept);
      acc[o].assign(static_cast<size_t>(a.out[o].numel()), 0.0);
    } else if (stored(o)) {
      strides_of(st[nin + o], shape);
    }
  }
  std::vector<T> temp(ncode);
  std::vector<int64_t> idx(r, 0), off(nin + nout, 0);
  T args[3];
  const int64_t n = numel(shape);
  // Dropout as the op alone computes it (src/backend/cpu/misc.cpp): element i of the
  // index space is element i of the dropped tensor, which has the group's shape.
  std::vector<T> keep_scale(ncode);
  for (size_t c = 0; c < ncode; ++c)
    if (ew_draws(prog.code[c].op)) keep_scale[c] = static_cast<T>(1.0 / (1.0 - prog.code[c].p));
  const uint64_t seed = a.state.seed, step = static_cast<uint64_t>(a.state.step);
  for (int64_t i = 0; i < n; ++i) {
    for (size_t c = 0; c < ncode; ++c) {
      const EwInstr& in = prog.code[c];
      const auto& as = in.args;
      for (size_t j = 0; j < as.size(); ++j) {
        const int v = as[j];
        args[j] = v >= 0 ? src[static_cast<size_t>(v)][off[static_cast<size_t>(v)]] : temp[static_cast<size_t>(-v - 1)];
      }
      if (eval[c]) {
        temp[c] = eval[c](args, param[c]);
      } else {
        const float u = dropout_uniform(seed, step, in.stream, static_cast<uint64_t>(i));
        temp[c] = u >= static_cast<float>(in.p) ? args[0] * keep_scale[c] : T(0);
      }
    }
    for (size_t o = 0; o < nout; ++o) {
      const T v = temp[static_cast<size_t>(prog.outputs[o])];
      if (stored(o)) dst[o][off[nin + o]] = v;
      else if (summed(prog.reduce[o])) acc[o][static_cast<size_t>(off[nin + o])] += static_cast<double>(v);
    }
    for (size_t d = r; d-- > 0;) {  // the next index, odometer style
      ++idx[d];
      for (size_t k = 0; k < st.size(); ++k) off[k] += st[k][d];
      if (idx[d] < shape[d]) break;
      for (size_t k = 0; k < st.size(); ++k) off[k] -= st[k][d] * shape[d];
      idx[d] = 0;
    }
  }
  for (size_t o = 0; o < nout; ++o) {
    if (prog.reduce[o] == EwReduce::ln_y) {  // followed by mean and rstd
      layer_norm_rows<T>(dst[o], src[static_cast<size_t>(prog.ln_gamma)], src[static_cast<size_t>(prog.ln_beta)],
                         dst[o], dst[o + 1], dst[o + 2], a.out[o + 1].numel(), shape.back(), prog.ln_eps);
    }
    if (!summed(prog.reduce[o])) continue;
    // mean's own scale (src/backend/cpu/reduce.cpp), so that fusing changes no bit
    const double scale =
        prog.reduce[o] == EwReduce::mean ? static_cast<double>(numel(kept)) / static_cast<double>(n) : 1.0;
    for (size_t e = 0; e < acc[o].size(); ++e) dst[o][e] = static_cast<T>(acc[o][e] * scale);
  }
  for (size_t o = 0; o < nout; ++o)
    if (a.out[o].dtype() != own)
      for (int64_t e = 0; e < a.out[o].numel(); ++e) store_value(a.out[o], e, static_cast<double>(dst[o][e]));
}

void fused_elementwise(const KernelArgs& a) {
  const EwProgram& prog = EwProgram::cached(a.attrs().s("program"));
  bool f64 = false;
  for (auto* ts : {&a.in, &a.out})
    for (const TensorView& t : *ts) f64 = f64 || t.dtype() == DType::f64;
  if (f64) fused_elementwise_in<double>(a, prog);
  else fused_elementwise_in<float>(a, prog);
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
