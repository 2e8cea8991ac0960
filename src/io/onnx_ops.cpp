// The ONNX importer's op table (src/io/onnx.h): each op type as seam ops. Shape
// arithmetic that exporters leave in graphs (Shape, Gather, Concat, Unsqueeze on
// constants) is folded here, since seam's shapes are static.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "io/onnx_import.h"
#include "ops/geometry.h"

namespace seam::onnx::detail {

int64_t norm_axis(NodeCtx& c, int64_t axis, size_t rank, const char* what) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) c.fail(what, " ", axis, " is out of range for rank ", rank);
  return axis < 0 ? axis + r : axis;
}

Var scalar(Graph& g, double v, DType t) { return full(g, Shape{}, v, t); }

double scalar_of(NodeCtx& c, const Const& k, const char* what) {
  if (k.v.size() != 1) c.fail(what, " must be one value, got shape ", shape_str(k.shape));
  return k.v[0];
}

void check_foldable(NodeCtx& c, const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) c.fail("a constant of shape ", shape_str(shape), " has a negative dimension");
    if (d > 0 && n > (int64_t{1} << 26) / d) c.fail("a constant of shape ", shape_str(shape), " is too large to fold at import");
    n *= d;
  }
}

Shape broadcast_shape(NodeCtx& c, const Shape& a, const Shape& b) {
  Shape r(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < r.size(); ++i) {
    const int64_t da = i < r.size() - a.size() ? 1 : a[i - (r.size() - a.size())];
    const int64_t db = i < r.size() - b.size() ? 1 : b[i - (r.size() - b.size())];
    if (da != db && da != 1 && db != 1) c.fail("shapes ", shape_str(a), " and ", shape_str(b), " do not broadcast");
    r[i] = da == 1 ? db : da;
  }
  return r;
}

std::vector<int64_t> axes_of(NodeCtx& c, size_t input, int64_t since_opset) {
  if (c.opset() >= since_opset) return c.has(input) ? c.const_in(input, "axes").ints() : std::vector<int64_t>{};
  return c.ints("axes");
}

Var gather_along(NodeCtx& c, Var x, int64_t axis, Var ids, const Shape& id_shape) {
  if (ids.dtype() != DType::i32) c.fail("indices of ", dtype_name(ids.dtype()), " (integers only)");
  const Shape in = x.shape();
  const int64_t n = in[static_cast<size_t>(axis)];
  std::vector<int64_t> perm{axis};
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d)
    if (d != axis) perm.push_back(d);
  Var table = reshape(axis == 0 ? x : permute(x, perm), {n, numel(in) / n});
  Var looked = embedding(ids, table);  // [ids..., rest]
  Shape out = id_shape;
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d)
    if (d != axis) out.push_back(in[static_cast<size_t>(d)]);
  Var r = reshape(looked, out);
  if (axis != 0 && !id_shape.empty()) {  // [ids..., before..., after...] -> [before..., ids..., after...]
    const auto ri = static_cast<int64_t>(id_shape.size());
    std::vector<int64_t> back;
    for (int64_t d = 0; d < axis; ++d) back.push_back(ri + d);
    for (int64_t d = 0; d < ri; ++d) back.push_back(d);
    for (int64_t d = ri + axis; d < static_cast<int64_t>(out.size()); ++d) back.push_back(d);
    r = permute(r, back);
  }
  return r;
}

Var gather_const(NodeCtx& c, Var x, int64_t axis, const std::vector<int64_t>& idx, const std::string& suffix) {
  const std::string name = c.node.name() + "." + suffix;
  c.imp.consts[name] = Const{{static_cast<int64_t>(idx.size())}, std::vector<double>(idx.begin(), idx.end()),
                             ::onnx::TensorProto::INT32};
  return gather_along(c, x, axis, c.imp.var(name, c.where), {static_cast<int64_t>(idx.size())});
}

double at_broadcast(const Const& c, const Shape& to, int64_t flat) {
  int64_t off = 0, stride = 1;
  for (int64_t d = static_cast<int64_t>(to.size()) - 1, k = static_cast<int64_t>(c.shape.size()) - 1; d >= 0; --d, --k) {
    const int64_t i = flat % to[static_cast<size_t>(d)];
    flat /= to[static_cast<size_t>(d)];
    if (k >= 0) {
      const int64_t n = c.shape[static_cast<size_t>(k)];
      off += (n == 1 ? 0 : i) * stride;
      stride *= n;
    }
  }
  return c.v[static_cast<size_t>(off)];
}

Const fold_binary(NodeCtx& c, const Const& a, const Const& b, const std::function<double(double, double)>& f) {
  Const r;
  r.shape = broadcast_shape(c, a.shape, b.shape);
  check_foldable(c, r.shape);
  r.elem = a.elem;
  const int64_t n = numel(r.shape);
  for (int64_t i = 0; i < n; ++i) r.v.push_back(f(at_broadcast(a, r.shape, i), at_broadcast(b, r.shape, i)));
  const bool integer = !is_float(dtype_of(r.elem).value_or(DType::f32));
  if (integer)
    for (double& x : r.v) x = std::trunc(x);
  return r;
}

// Every input constant: the node folds (shape arithmetic).
bool all_const(NodeCtx& c) {
  for (size_t i = 0; i < c.inputs(); ++i)
    if (c.has(i) && (!c.maybe_const(i) || c.imp.trainable(c.node.input(static_cast<int>(i))))) return false;
  return true;
}

// An input's shape, constant or not.
Shape shape_of(NodeCtx& c, size_t i) {
  if (const Const* k = c.maybe_const(i)) return k->shape;
  return c.in(i).shape();
}

// Arithmetic on integers (or booleans) folds; seam's elementwise kernels compute in
// floating point, so on graph values it is refused.
void expect_float_operands(NodeCtx& c) {
  for (size_t i = 0; i < c.inputs(); ++i)
    if (c.has(i) && !c.maybe_const(i) && !is_float(c.in(i).dtype()))
      c.fail("integer operands must be constants (seam folds integer arithmetic; its kernels compute in floating "
             "point): input ", i, " is ", dtype_name(c.in(i).dtype()));
}


namespace {

namespace T = ::onnx;

// ---- constant folding --------------------------------------------------------------------

// Element of c at the index of a broadcast result of shape `to`.
// ---- elementwise -------------------------------------------------------------------------

// On a constant that no training changes, the function folds (an exporter's scale
// factors: Sqrt of a head size, its Reciprocal), so later nodes see a constant.
template <Var (*F)(Var), double (*D)(double)>
void unary(NodeCtx& c) {
  if (const Const* k = c.foldable(0); k && is_float(dtype_of(k->elem).value_or(DType::i32))) {
    Const r = *k;
    for (double& v : r.v) v = D(v);
    return c.out_const(0, r);
  }
  c.out(0, F(c.in(0)));
}

double relu_d(double x) { return x > 0 ? x : 0; }
double sigmoid_d(double x) { return 1 / (1 + std::exp(-x)); }
double tanh_d(double x) { return std::tanh(x); }
double exp_d(double x) { return std::exp(x); }
double log_d(double x) { return std::log(x); }
double sqrt_d(double x) { return std::sqrt(x); }
double erf_d(double x) { return std::erf(x); }
double reciprocal_d(double x) { return 1 / x; }

Var relu_of(Var x) { return relu(x); }
Var sigmoid_of(Var x) { return sigmoid(x); }
Var tanh_of(Var x) { return seam::tanh(x); }
Var exp_of(Var x) { return seam::exp(x); }
Var log_of(Var x) { return seam::log(x); }
Var sqrt_of(Var x) { return seam::sqrt(x); }
Var erf_of(Var x) { return seam::erf(x); }

// Neg and Abs fold on constants (exporters negate axes and shapes in their expansions);
// seam's kernels compute on floating point values.
template <int Kind>  // 0 Neg, 1 Abs
void sign_op(NodeCtx& c) {
  if (const Const* k = c.foldable(0)) {
    Const r = *k;
    for (double& v : r.v) v = Kind == 0 ? -v : std::abs(v);
    return c.out_const(0, r);
  }
  expect_float_operands(c);
  c.out(0, Kind == 0 ? neg(c.in(0)) : seam::abs(c.in(0)));
}

Var reciprocal_of(Var x) { return div(scalar(x.graph(), 1.0, x.dtype()), x); }

// On a graph value, one exponent (seam's pow takes a scalar); an exponent per element
// folds with a constant base.
void pow_op(NodeCtx& c) {
  if (all_const(c))
    return c.out_const(0, fold_binary(c, c.const_in(0, "x"), c.const_in(1, "y"),
                                      [](double x, double y) { return std::pow(x, y); }));
  const Const* e = c.maybe_const(1);
  if (!e || e->v.size() != 1)
    c.fail("the exponent must be a constant: one value for a graph value's power (seam's pow takes a scalar), or "
           "one per element of a constant base (seam folds them); got ",
           e ? "shape " + shape_str(e->shape) : std::string("a graph value"));
  expect_float_operands(c);
  c.out(0, seam::pow(c.in(0), e->v[0]));
}

template <int Kind>  // 0 add, 1 sub, 2 mul, 3 div
void binary(NodeCtx& c) {
  if (all_const(c)) {
    const Const &a = c.const_in(0, "a"), &b = c.const_in(1, "b");
    static const std::function<double(double, double)> fs[] = {
        [](double x, double y) { return x + y; }, [](double x, double y) { return x - y; },
        [](double x, double y) { return x * y; }, [](double x, double y) { return x / y; }};
    return c.out_const(0, fold_binary(c, a, b, fs[Kind]));
  }
  expect_float_operands(c);
  Var a = c.in(0), b = c.in(1);
  Var (*ops[])(Var, Var) = {add, sub, mul, div};
  c.out(0, ops[Kind](a, b));
}

// Max, Min, Sum, Mean over any number of operands.
template <int Kind>  // 0 max, 1 min, 2 sum, 3 mean
void variadic(NodeCtx& c) {
  if (all_const(c)) {
    Const r = c.const_in(0, "input 0");
    for (size_t i = 1; i < c.inputs(); ++i)
      r = fold_binary(c, r, c.const_in(i, "an input"), [](double a, double b) {
        return Kind == 0 ? std::max(a, b) : Kind == 1 ? std::min(a, b) : a + b;
      });
    if (Kind == 3)
      for (double& v : r.v) v /= static_cast<double>(c.inputs());
    return c.out_const(0, r);
  }
  expect_float_operands(c);
  Var r = c.in(0);
  for (size_t i = 1; i < c.inputs(); ++i) {
    Var x = c.in(i);
    r = Kind == 0 ? maximum(r, x) : Kind == 1 ? minimum(r, x) : add(r, x);
  }
  if (Kind == 3 && c.inputs() > 1) r = scale(r, 1.0 / static_cast<double>(c.inputs()));
  c.out(0, r);
}

void clip_op(NodeCtx& c) {
  if (all_const(c) && c.opset() >= 11) {
    Const r = c.const_in(0, "input");
    const double lo = c.has(1) ? scalar_of(c, c.const_in(1, "min"), "min") : -INFINITY;
    const double hi = c.has(2) ? scalar_of(c, c.const_in(2, "max"), "max") : INFINITY;
    for (double& v : r.v) v = std::min(std::max(v, lo), hi);
    return c.out_const(0, r);
  }
  expect_float_operands(c);
  Var x = c.in(0);
  std::optional<Var> lo, hi;
  if (c.opset() < 11) {
    if (c.has_attr("min")) lo = scalar(c.g(), c.f("min", 0), x.dtype());
    if (c.has_attr("max")) hi = scalar(c.g(), c.f("max", 0), x.dtype());
  } else {  // bounds as inputs: scalars, constant or not
    if (c.has(1)) lo = c.in(1);
    if (c.has(2)) hi = c.in(2);
  }
  if (hi) x = minimum(x, *hi);
  if (lo) x = maximum(x, *lo);
  c.out(0, lo || hi ? x : copy(x));
}

// Exporters write equal initializers once and the others as its Identity (PyTorch does so
// for every layer norm's ones and zeros): such an Identity is a parameter of its own, as
// it was in the exported model, starting from the same value.
void identity_op(NodeCtx& c) {
  if (const Const* k = c.maybe_const(0)) {
    const bool own = c.imp.trainable(c.node.input(0)) && c.wants(0);
    c.out_const(0, *k);
    if (own) c.imp.initializers.insert(c.node.output(0));
    return;
  }
  c.out(0, c.in(0));
}

// Inference: the identity, and a mask of ones. Training mode (an input from opset 12, an
// attribute is_test = 0 before 7) draws from an RNG no importer can reproduce.
void dropout_op(NodeCtx& c) {
  const bool training = c.opset() >= 12 ? (c.has(2) && scalar_of(c, c.const_in(2, "training_mode"), "training_mode") != 0)
                                        : (c.opset() < 7 && c.i("is_test", 0) == 0);
  // A ratio of 0 drops nothing in either mode.
  const double ratio = c.opset() >= 12 ? (c.has(1) ? scalar_of(c, c.const_in(1, "ratio"), "ratio") : 0.5)
                                       : c.f("ratio", 0.5);
  if (training && ratio != 0) c.fail("training mode is not supported: seam imports Dropout for inference");
  if (c.wants(1)) {
    const Shape s = c.maybe_const(0) ? c.maybe_const(0)->shape : c.in(0).shape();
    check_foldable(c, s);
    c.out_const(1, Const{s, std::vector<double>(static_cast<size_t>(numel(s)), 1.0), T::TensorProto::BOOL});
  }
  identity_op(c);
}

void cast_to(NodeCtx& c, int32_t to) {
  if (const Const* k = c.foldable(0)) {
    Const r = *k;
    r.elem = to;
    if (!is_float(dtype_of(to).value_or(DType::f32)))
      for (double& x : r.v) x = std::trunc(x);
    return c.out_const(0, r);
  }
  const std::optional<DType> t = dtype_of(to);
  if (!t) c.fail("casts to ", elem_name(to), ", which seam keeps in no dtype");
  Var x = c.in(0);
  c.out(0, x.dtype() == *t ? copy(x) : cast(x, *t));
}
void cast_op(NodeCtx& c) { cast_to(c, static_cast<int32_t>(c.i("to", 0))); }
void cast_like_op(NodeCtx& c) {
  const Const* k = c.maybe_const(1);
  if (k) return cast_to(c, k->elem);
  const DType t = c.in(1).dtype();
  for (int32_t e : {::onnx::TensorProto::FLOAT, ::onnx::TensorProto::DOUBLE, ::onnx::TensorProto::FLOAT16,
                    ::onnx::TensorProto::BFLOAT16, ::onnx::TensorProto::INT32, ::onnx::TensorProto::UINT8})
    if (dtype_of(e) == t) return cast_to(c, e);
}

// ---- shapes ------------------------------------------------------------------------------

void shape_op(NodeCtx& c) {
  const Shape s = shape_of(c, 0);
  const auto rank = static_cast<int64_t>(s.size());
  int64_t start = c.i("start", 0), end = c.i("end", rank);
  start = std::clamp(start < 0 ? start + rank : start, int64_t{0}, rank);
  end = std::clamp(end < 0 ? end + rank : end, int64_t{0}, rank);
  Const r{{std::max<int64_t>(end - start, 0)}, {}, T::TensorProto::INT64};
  for (int64_t d = start; d < end; ++d) r.v.push_back(static_cast<double>(s[static_cast<size_t>(d)]));
  c.out_const(0, r);
}

// ONNX Reshape's target: 0 copies the input's dim (unless allowzero), one -1 is inferred.
Shape reshape_target(NodeCtx& c, const Shape& in, const std::vector<int64_t>& want) {
  Shape s;
  const bool allowzero = c.i("allowzero", 0) != 0;
  for (size_t d = 0; d < want.size(); ++d) {
    if (want[d] == 0 && !allowzero) {
      if (d >= in.size()) c.fail("shape entry ", d, " is 0 (copy) but the input has rank ", in.size());
      s.push_back(in[d]);
    } else {
      s.push_back(want[d]);
    }
  }
  int64_t known = 1, infer = -1;
  for (size_t d = 0; d < s.size(); ++d) {
    if (s[d] == -1) {
      if (infer >= 0) c.fail("the shape ", shape_str(Shape(want.begin(), want.end())), " has more than one -1");
      infer = static_cast<int64_t>(d);
    } else if (s[d] < 0) {
      c.fail("the shape has a negative entry ", s[d]);
    } else if (__builtin_mul_overflow(known, s[d], &known)) {
      c.fail("the shape ", shape_str(s), " holds more elements than int64 counts");
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel(in) % known) c.fail("cannot infer -1 in ", shape_str(s), " for ", shape_str(in));
    s[static_cast<size_t>(infer)] = numel(in) / known;
  }
  if (numel(s) != numel(in)) c.fail("cannot reshape ", shape_str(in), " to ", shape_str(s));
  return s;
}

void reshape_to(NodeCtx& c, const Shape& s) {
  if (const Const* k = c.foldable(0)) {
    Const r = *k;
    r.shape = s;
    return c.out_const(0, r);
  }
  c.out(0, reshape(c.in(0), s));
}

void reshape_op(NodeCtx& c) {
  const std::vector<int64_t> want = c.opset() < 5 ? c.ints("shape") : c.const_in(1, "the shape").ints();
  reshape_to(c, reshape_target(c, shape_of(c, 0), want));
}

void flatten_op(NodeCtx& c) {
  const Shape in = shape_of(c, 0);
  int64_t axis = c.i("axis", 1);  // in [-rank, rank]
  if (axis < 0) axis += static_cast<int64_t>(in.size());
  if (axis < 0 || axis > static_cast<int64_t>(in.size())) c.fail("axis ", c.i("axis", 1), " is out of range for rank ", in.size());
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= in[static_cast<size_t>(d)];
  reshape_to(c, {outer, numel(in) / std::max<int64_t>(outer, 1)});
}

void squeeze_op(NodeCtx& c) {
  const Shape in = shape_of(c, 0);
  std::vector<int64_t> axes = axes_of(c, 1, 13);
  for (int64_t& a : axes) a = norm_axis(c, a, in.size());
  Shape s;
  for (size_t d = 0; d < in.size(); ++d) {
    const bool listed = std::count(axes.begin(), axes.end(), static_cast<int64_t>(d)) > 0;
    if (listed && in[d] != 1) c.fail("axis ", d, " has size ", in[d], ", not 1");
    if (!(axes.empty() ? in[d] == 1 : listed)) s.push_back(in[d]);
  }
  reshape_to(c, s);
}

void unsqueeze_op(NodeCtx& c) {
  const Shape in = shape_of(c, 0);
  std::vector<int64_t> axes = axes_of(c, 1, 13);
  const size_t rank = in.size() + axes.size();
  for (int64_t& a : axes) a = norm_axis(c, a, rank);
  std::vector<int64_t> sorted = axes;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) c.fail("axes repeat an axis");
  Shape s;
  for (size_t d = 0, k = 0; d < rank; ++d)
    s.push_back(std::count(axes.begin(), axes.end(), static_cast<int64_t>(d)) ? 1 : in[k++]);
  reshape_to(c, s);
}

void transpose_op(NodeCtx& c) {
  const Shape in = shape_of(c, 0);
  std::vector<int64_t> perm = c.ints("perm");
  if (perm.empty())
    for (int64_t d = static_cast<int64_t>(in.size()) - 1; d >= 0; --d) perm.push_back(d);
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (size_t d = 0; d < sorted.size(); ++d)
    if (sorted.size() != in.size() || sorted[d] != static_cast<int64_t>(d))
      c.fail("perm ", shape_str(Shape(perm.begin(), perm.end())), " is not a permutation of rank ", in.size());
  if (const Const* k = c.foldable(0)) {
    Const r = *k;
    Shape s;
    for (int64_t p : perm) s.push_back(in[static_cast<size_t>(p)]);
    r.shape = s;
    const int64_t n = numel(s);
    for (int64_t i = 0; i < n; ++i) {  // output index -> input offset
      int64_t rem = i, off = 0;
      std::vector<int64_t> idx(s.size());
      for (int64_t d = static_cast<int64_t>(s.size()) - 1; d >= 0; --d) {
        idx[static_cast<size_t>(d)] = rem % s[static_cast<size_t>(d)];
        rem /= s[static_cast<size_t>(d)];
      }
      std::vector<int64_t> src(in.size());
      for (size_t d = 0; d < perm.size(); ++d) src[static_cast<size_t>(perm[d])] = idx[d];
      for (size_t d = 0; d < in.size(); ++d) off = off * in[d] + src[d];
      r.v[static_cast<size_t>(i)] = k->v[static_cast<size_t>(off)];
    }
    return c.out_const(0, r);
  }
  c.out(0, permute(c.in(0), perm));
}

void concat_op(NodeCtx& c) {
  const int64_t axis = norm_axis(c, c.i("axis", 0), shape_of(c, 0).size());
  bool fold = all_const(c) && axis == 0;  // shape arithmetic; other constants join in the graph
  for (size_t i = 0; fold && i < c.inputs(); ++i)
    fold = c.maybe_const(i) && c.maybe_const(i)->shape.size() == 1 &&
           !c.imp.trainable(c.node.input(static_cast<int>(i)));
  if (fold) {
    Const r = c.const_in(0, "input 0");
    for (size_t i = 1; i < c.inputs(); ++i) {
      const Const& b = c.const_in(i, "an input");
      r.v.insert(r.v.end(), b.v.begin(), b.v.end());
      r.shape[0] += b.shape[0];
    }
    return c.out_const(0, r);
  }
  std::vector<Var> xs;
  for (size_t i = 0; i < c.inputs(); ++i) xs.push_back(c.in(i));
  c.out(0, xs.size() == 1 ? copy(xs[0]) : concat(xs, axis));
}

void slice_op(NodeCtx& c) {
  const Shape in = shape_of(c, 0);
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset() < 10) {
    starts = c.ints("starts");
    ends = c.ints("ends");
    axes = c.ints("axes");
  } else {
    starts = c.const_in(1, "starts").ints();
    ends = c.const_in(2, "ends").ints();
    if (c.has(3)) axes = c.const_in(3, "axes").ints();
    if (c.has(4)) steps = c.const_in(4, "steps").ints();
  }
  if (axes.empty())
    for (size_t d = 0; d < starts.size(); ++d) axes.push_back(static_cast<int64_t>(d));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    c.fail("starts, ends, axes and steps differ in length");
  std::optional<Var> x;
  Const k;
  bool sliced = false;
  if (const Const* kc = c.foldable(0)) k = *kc;  // folds
  else x = c.in(0);
  for (size_t j = 0; j < starts.size(); ++j) {
    const int64_t a = norm_axis(c, axes[j], in.size());
    const int64_t n = (x ? x->shape() : k.shape)[static_cast<size_t>(a)], step = steps[j];
    if (step == 0) c.fail("step 0 along axis ", a);
    if (x && step < 0) c.fail("step ", step, " along axis ", a, ": seam slices graph values forward only");
    // The ONNX spec's clamping: [0, n] going forward, [-1, n - 1] going backward.
    auto clampi = [&](int64_t v) {
      v = v < 0 ? (v < -n ? -1 : v + n) : v;
      return step > 0 ? std::clamp(v, int64_t{0}, n) : std::clamp(v, int64_t{-1}, n - 1);
    };
    const int64_t s = clampi(starts[j]), e = clampi(ends[j]);
    // An empty slice of a constant is shape arithmetic (a shape's tail, say); seam's
    // values have no empty dims.
    if (x && (step > 0 ? e <= s : e >= s))
      c.fail("slice [", starts[j], ", ", ends[j], ") step ", step, " of axis ", a, " (size ", n, ") is empty");
    if (x) {
      if (s != 0 || e != n || step != 1) {
        x = slice(*x, a, s, e, step);
        sliced = true;
      }
    } else {
      int64_t outer = 1, inner = 1;
      for (int64_t d = 0; d < a; ++d) outer *= k.shape[static_cast<size_t>(d)];
      for (size_t d = static_cast<size_t>(a) + 1; d < k.shape.size(); ++d) inner *= k.shape[d];
      std::vector<double> v;
      int64_t kept = 0;
      for (int64_t o = 0; o < outer; ++o) {
        kept = 0;
        for (int64_t i = s; step > 0 ? i < e : i > e; i += step, ++kept) {
          const auto at = k.v.begin() + static_cast<std::ptrdiff_t>((o * n + i) * inner);
          v.insert(v.end(), at, at + static_cast<std::ptrdiff_t>(inner));
        }
      }
      k.v = std::move(v);
      k.shape[static_cast<size_t>(a)] = kept;
    }
  }
  if (x) c.out(0, sliced ? *x : copy(*x));
  else c.out_const(0, k);
}

void expand_op(NodeCtx& c) {
  const Shape s = broadcast_shape(c, shape_of(c, 0), [&] {
    const auto v = c.const_in(1, "the shape").ints();
    return Shape(v.begin(), v.end());
  }());
  Var x = c.in(0);
  c.out(0, x.shape() == s ? copy(x) : broadcast_to(x, s));
}

// Gather: the axis moved first and the rest flattened, an embedding lookup of the indices
// (i32; constant ones with negatives wrapped, a graph value's checked by the kernels to
// lie in [0, n)), then the shape back.
void gather_op(NodeCtx& c) {
  const Shape in = shape_of(c, 0);
  const int64_t axis = norm_axis(c, c.i("axis", 0), in.size());
  const int64_t n = in[static_cast<size_t>(axis)];
  const Const* idx = c.maybe_const(1);
  std::vector<double> ids;
  if (idx) {
    ids = idx->v;
    for (double& i : ids) {
      if (i < -n || i >= n) c.fail("index ", i, " is out of range for axis ", axis, " of size ", n);
      if (i < 0) i += static_cast<double>(n);
    }
    // Shape arithmetic folds; a table (an embedding) is gathered in the graph.
    if (const Const* k = c.foldable(0); k && k->shape.size() == 1) {
      Const r{idx->shape, {}, k->elem};
      for (double i : ids) r.v.push_back(k->v[static_cast<size_t>(i)]);
      return c.out_const(0, r);
    }
  }
  // Constant indices that are one run of consecutive ones (a scalar index: q, k or v out of
  // a packed projection) are a slice: no gather kernel, and a gradient without a scatter.
  if (idx && !ids.empty() && !c.foldable(0)) {
    bool run = true;
    for (size_t i = 1; i < ids.size() && run; ++i) run = ids[i] == ids[i - 1] + 1;
    if (run && idx->shape.size() <= 1) {
      const auto from = static_cast<int64_t>(ids.front()), to = from + static_cast<int64_t>(ids.size());
      Var x = c.in(0);
      Var part = from == 0 && to == n ? copy(x) : slice(x, axis, from, to);
      if (idx->shape.empty()) {  // a scalar index drops the axis
        Shape s = in;
        s.erase(s.begin() + axis);
        part = reshape(part, s);
      }
      return c.out(0, part);
    }
  }
  const Shape id_shape = idx ? idx->shape : c.in(1).shape();
  Var id_var = [&] {
    if (!idx) return c.in(1);
    const std::string name = c.node.name() + ".indices";
    c.imp.consts[name] = Const{id_shape.empty() ? Shape{1} : id_shape, ids, T::TensorProto::INT32};
    return c.imp.var(name, c.where);
  }();
  c.out(0, gather_along(c, c.in(0), axis, id_var, id_shape));
}

// Split along an axis into the sizes the split attribute or input gives, else equal parts.
void split_op(NodeCtx& c) {
  Var x = c.in(0);
  const int64_t axis = norm_axis(c, c.i("axis", 0), rank(x));
  const int64_t n = x.shape()[static_cast<size_t>(axis)];
  std::vector<int64_t> sizes = c.opset() >= 13 ? (c.has(1) ? c.const_in(1, "split").ints() : std::vector<int64_t>{})
                                               : c.ints("split");
  const auto parts = static_cast<int64_t>(c.outputs());
  if (parts < 1) c.fail("no outputs to split into");
  if (sizes.empty()) {
    if (c.opset() >= 18 && c.has_attr("num_outputs")) {  // parts of ceil(n / parts), the last the rest
      if (c.i("num_outputs", 0) != parts) c.fail("num_outputs ", c.i("num_outputs", 0), " for ", parts, " outputs");
      const int64_t chunk = (n + parts - 1) / parts;
      for (int64_t i = 0; i < parts; ++i) sizes.push_back(std::min(chunk, n - i * chunk));
    } else {
      if (n % parts) c.fail("axis ", axis, " of size ", n, " does not split into ", parts, " equal parts");
      sizes.assign(static_cast<size_t>(parts), n / parts);
    }
  }
  if (static_cast<int64_t>(sizes.size()) != parts || std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) != n)
    c.fail("split sizes ", shape_str(Shape(sizes.begin(), sizes.end())), " do not cover axis ", axis, " of size ", n,
           " in ", parts, " outputs");
  int64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] <= 0) c.fail("split size ", sizes[i], ": seam's values have no empty dims");
    c.out(i, sizes.size() == 1 ? copy(x) : slice(x, axis, at, at + sizes[i]));
    at += sizes[i];
  }
}

void tile_op(NodeCtx& c) {
  Var x = c.in(0);
  const std::vector<int64_t> reps = c.const_in(1, "repeats").ints();
  if (static_cast<int64_t>(reps.size()) != rank(x)) c.fail(reps.size(), " repeats for rank ", rank(x));
  for (size_t d = 0; d < reps.size(); ++d) {
    if (reps[d] < 1) c.fail("repeat ", reps[d], " along axis ", d, ": seam's values have no empty dims");
    if (reps[d] > 4096) c.fail("repeat ", reps[d], " along axis ", d, " is more than seam tiles (4096)");
    if (reps[d] > 1) x = concat(std::vector<Var>(static_cast<size_t>(reps[d]), x), static_cast<int64_t>(d));
  }
  c.out(0, x.id() == c.in(0).id() ? copy(x) : x);
}

// Pad, constant mode: blocks of the value concatenated at both ends of each padded axis.
// k's slices along `axis` at idx, -1 standing for a slice of `fill`.
Const take_along(const Const& k, int64_t axis, const std::vector<int64_t>& idx, double fill) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= k.shape[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < k.shape.size(); ++d) inner *= k.shape[d];
  const int64_t n = k.shape[static_cast<size_t>(axis)];
  Const r = k;
  r.shape[static_cast<size_t>(axis)] = static_cast<int64_t>(idx.size());
  r.v.clear();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i : idx)
      for (int64_t e = 0; e < inner; ++e) r.v.push_back(i < 0 ? fill : k.v[static_cast<size_t>((o * n + i) * inner + e)]);
  return r;
}

// Each axis padded by the input's indices along it (-1: the constant): constant padding
// concatenates fills, edge and reflect gather the input's own slices, negative pads crop.
// A constant input (integer data) folds.
void pad_op(NodeCtx& c) {
  const Shape in = shape_of(c, 0);
  const std::string mode = c.s("mode", "constant");
  if (mode != "constant" && mode != "edge" && mode != "reflect" && mode != "wrap")
    c.fail("mode '", mode, "': seam pads in the modes constant, edge, reflect and wrap");
  const std::vector<int64_t> pads = c.opset() >= 11 ? c.const_in(1, "pads").ints() : c.ints("pads");
  double value = c.opset() >= 11 ? (c.has(2) ? scalar_of(c, c.const_in(2, "constant_value"), "constant_value") : 0.0) : c.f("value", 0.0);
  const size_t r = in.size();
  std::vector<int64_t> axes;
  if (c.opset() >= 18 && c.has(3)) axes = c.const_in(3, "axes").ints();
  else
    for (size_t d = 0; d < r; ++d) axes.push_back(static_cast<int64_t>(d));
  if (pads.size() != 2 * axes.size()) c.fail(pads.size(), " pads for ", axes.size(), " axes");
  std::optional<Const> k;
  if (const Const* kc = c.foldable(0)) k = *kc;
  else expect_float_operands(c);
  Var x = k ? Var() : c.in(0);
  for (size_t j = 0; j < axes.size(); ++j) {
    const int64_t a = norm_axis(c, axes[j], r);
    const int64_t n = in[static_cast<size_t>(a)], before = pads[j], after = pads[j + axes.size()];
    if (before == 0 && after == 0) continue;
    if (n + before + after <= 0) c.fail("pads crop axis ", a, " of size ", n, " to nothing");
    if (mode == "reflect" && (before >= n || after >= n))
      c.fail("reflect pads ", before, " and ", after, " on axis ", a, " of size ", n, ": each must be below the size");
    std::vector<int64_t> idx;
    for (int64_t i = -before; i < n + after; ++i)
      idx.push_back(i >= 0 && i < n ? i
                    : mode == "constant" ? -1
                    : mode == "edge"     ? (i < 0 ? 0 : n - 1)
                    : mode == "wrap"     ? ((i % n) + n) % n
                                         : (i < 0 ? -i : 2 * (n - 1) - i));
    if (k) {
      check_foldable(c, [&] { Shape s = k->shape; s[static_cast<size_t>(a)] = static_cast<int64_t>(idx.size()); return s; }());
      k = take_along(*k, a, idx, value);
    } else if (mode != "constant") {
      x = gather_const(c, x, a, idx, "pad" + std::to_string(a));
    } else {  // the input's own span (cropped where a pad is negative), between fills
      const int64_t lo = std::max<int64_t>(0, -before), hi = n - std::max<int64_t>(0, -after);
      std::vector<Var> parts;
      Shape s = x.shape();
      if (before > 0) s[static_cast<size_t>(a)] = before, parts.push_back(full(c.g(), s, value, x.dtype()));
      parts.push_back(lo == 0 && hi == n ? x : slice(x, a, lo, hi));
      if (after > 0) s[static_cast<size_t>(a)] = after, parts.push_back(full(c.g(), s, value, x.dtype()));
      x = parts.size() == 1 ? parts[0] : concat(parts, a);
    }
  }
  if (k) return c.out_const(0, *k);
  c.out(0, x.id() == c.in(0).id() ? copy(x) : x);
}

// DepthToSpace (DCR or CRD) and SpaceToDepth: a reshape, a permute and a reshape.
void depth_to_space_op(NodeCtx& c) {
  Var x = c.in(0);
  if (rank(x) != 4) c.fail("input of rank ", rank(x), " (4-d only)");
  const int64_t b = c.i("blocksize", 0), n = x.shape()[0], ch = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  if (b < 1 || ch % (b * b)) c.fail("blocksize ", b, " does not divide ", ch, " channels into blocks");
  const bool crd = c.s("mode", "DCR") == "CRD";
  Var t = crd ? permute(reshape(x, {n, ch / (b * b), b, b, h, w}), {0, 1, 4, 2, 5, 3})
              : permute(reshape(x, {n, b, b, ch / (b * b), h, w}), {0, 3, 4, 1, 5, 2});
  c.out(0, reshape(t, {n, ch / (b * b), h * b, w * b}));
}

void space_to_depth_op(NodeCtx& c) {
  Var x = c.in(0);
  if (rank(x) != 4) c.fail("input of rank ", rank(x), " (4-d only)");
  const int64_t b = c.i("blocksize", 0), n = x.shape()[0], ch = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  if (b < 1 || h % b || w % b) c.fail("blocksize ", b, " does not divide ", h, "x", w);
  Var t = permute(reshape(x, {n, ch, h / b, b, w / b, b}), {0, 3, 5, 1, 2, 4});
  c.out(0, reshape(t, {n, ch * b * b, h / b, w / b}));
}

}  // namespace

const std::map<std::string, OpImporter>& op_importers() {
  static const std::map<std::string, OpImporter> table = [] {
    std::map<std::string, OpImporter> t = {
        {"Relu", unary<relu_of, relu_d>},        {"Sigmoid", unary<sigmoid_of, sigmoid_d>},
        {"Tanh", unary<tanh_of, tanh_d>},        {"Exp", unary<exp_of, exp_d>},
        {"Log", unary<log_of, log_d>},          {"Sqrt", unary<sqrt_of, sqrt_d>},
        {"Neg", sign_op<0>},             {"Abs", sign_op<1>},
        {"Erf", unary<erf_of, erf_d>},          {"Reciprocal", unary<reciprocal_of, reciprocal_d>},
        {"Pow", pow_op},
        {"Add", binary<0>},              {"Sub", binary<1>},
        {"Mul", binary<2>},              {"Div", binary<3>},
        {"Max", variadic<0>},            {"Min", variadic<1>},
        {"Sum", variadic<2>},            {"Mean", variadic<3>},
        {"Clip", clip_op},               {"Identity", identity_op},
        {"Dropout", dropout_op},         {"Cast", cast_op},
        {"Shape", shape_op},             {"Reshape", reshape_op},
        {"Flatten", flatten_op},         {"Squeeze", squeeze_op},
        {"Unsqueeze", unsqueeze_op},     {"Transpose", transpose_op},
        {"Concat", concat_op},           {"Slice", slice_op},
        {"Expand", expand_op},           {"Gather", gather_op},
        {"CastLike", cast_like_op},      {"Split", split_op},
        {"Tile", tile_op},               {"Pad", pad_op},
        {"DepthToSpace", depth_to_space_op}, {"SpaceToDepth", space_to_depth_op},
    };
    add_nn_importers(t);
    add_resize_importers(t);
    add_logic_importers(t);
    add_activation_importers(t);
    add_constant_importers(t);
    return t;
  }();
  return table;
}

}  // namespace seam::onnx::detail
