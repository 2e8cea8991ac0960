// The ONNX importer's op table, part six: values known at import, Constant,
// ConstantOfShape, Size, Range, EyeLike, and Trilu (its mask).
#include <cmath>

#include "io/onnx_import.h"

namespace seam::onnx::detail {

namespace {

namespace T = ::onnx;

void constant_of_shape_op(NodeCtx& c) {
  const std::vector<int64_t> s = c.const_in(0, "the shape").ints();
  check_foldable(c, Shape(s.begin(), s.end()));
  Const r{Shape(s.begin(), s.end()), {}, ::onnx::TensorProto::FLOAT};
  double v = 0;
  if (const auto* t = c.tensor_attr("value")) {
    const Const k = const_of(*t, c.where);
    r.elem = k.elem;
    v = scalar_of(c, k, "value");
  }
  r.v.assign(static_cast<size_t>(numel(r.shape)), v);
  c.out_const(0, r);
}

void size_op(NodeCtx& c) {
  c.out_const(0, Const{{}, {static_cast<double>(numel(shape_of(c, 0)))}, ::onnx::TensorProto::INT64});
}

void range_op(NodeCtx& c) {
  const Const &start = c.const_in(0, "start"), &limit = c.const_in(1, "limit"), &delta = c.const_in(2, "delta");
  const double a = scalar_of(c, start, "start"), b = scalar_of(c, limit, "limit"), d = scalar_of(c, delta, "delta");
  if (d == 0) c.fail("delta is 0");
  const double count = std::ceil((b - a) / d);
  if (!(count < static_cast<double>(int64_t{1} << 26))) c.fail("a range of ", count, " values is too large to fold at import");
  const auto n = static_cast<int64_t>(std::max(0.0, count));
  Const r{{n}, {}, start.elem};
  for (int64_t i = 0; i < n; ++i) r.v.push_back(a + static_cast<double>(i) * d);
  c.out_const(0, r);
}

// EyeLike and Trilu: masks known at import (the shapes are static).
void eye_like_op(NodeCtx& c) {
  const Shape s = shape_of(c, 0);
  if (s.size() != 2) c.fail("input of rank ", s.size(), " (2-d only)");
  check_foldable(c, s);
  const int64_t k = c.i("k", 0);
  Const r{s, std::vector<double>(static_cast<size_t>(numel(s)), 0.0),
          c.has_attr("dtype") ? static_cast<int32_t>(c.i("dtype", 1))
                              : (c.maybe_const(0) ? c.maybe_const(0)->elem : ::onnx::TensorProto::FLOAT)};
  for (int64_t i = 0; i < s[0]; ++i)
    if (i + k >= 0 && i + k < s[1]) r.v[static_cast<size_t>(i * s[1] + i + k)] = 1;
  c.out_const(0, r);
}

void trilu_op(NodeCtx& c) {
  const Shape in = shape_of(c, 0);
  if (in.size() < 2) c.fail("input of rank ", in.size(), " (2-d or more)");
  const auto k = static_cast<int64_t>(c.has(1) ? scalar_of(c, c.const_in(1, "k"), "k") : 0);
  const bool upper = c.i("upper", 1) != 0;
  const int64_t rows = in[in.size() - 2], cols = in.back();
  check_foldable(c, {rows, cols});
  Const mask{{rows, cols}, {}, ::onnx::TensorProto::FLOAT};
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) mask.v.push_back((upper ? j - i >= k : j - i <= k) ? 1.0 : 0.0);
  if (const Const* x = c.foldable(0)) {  // integer or constant data: folded
    Const r = *x;
    for (size_t i = 0; i < r.v.size(); ++i) r.v[i] = mask.v[i % mask.v.size()] != 0 ? r.v[i] : 0.0;
    return c.out_const(0, r);
  }
  expect_float_operands(c);
  Var x = c.in(0);
  const std::string name = c.node.name() + ".mask";
  c.imp.consts[name] = mask;
  Var m = c.imp.var(name, c.where);
  c.out(0, mul(x, m.dtype() == x.dtype() ? m : cast(m, x.dtype())));
}

void constant_op(NodeCtx& c) {
  if (const T::TensorProto* t = c.tensor_attr("value")) return c.out_const(0, const_of(*t, c.where));
  if (c.has_attr("value_float")) return c.out_const(0, Const{{}, {c.f("value_float", 0)}, T::TensorProto::FLOAT});
  if (c.has_attr("value_floats")) {
    const auto v = c.floats("value_floats");
    return c.out_const(0, Const{{static_cast<int64_t>(v.size())}, v, T::TensorProto::FLOAT});
  }
  if (c.has_attr("value_int")) return c.out_const(0, Const{{}, {static_cast<double>(c.i("value_int", 0))}, T::TensorProto::INT64});
  if (c.has_attr("value_ints")) {
    const auto v = c.ints("value_ints");
    return c.out_const(0, Const{{static_cast<int64_t>(v.size())}, std::vector<double>(v.begin(), v.end()), T::TensorProto::INT64});
  }
  c.fail("has none of the value attributes seam reads (value, value_float(s), value_int(s))");
}

}  // namespace

void add_constant_importers(std::map<std::string, OpImporter>& t) {
  t.insert({{"Constant", constant_op},
            {"ConstantOfShape", constant_of_shape_op},
            {"Size", size_op},
            {"Range", range_op},
            {"EyeLike", eye_like_op},
            {"Trilu", trilu_op}});
}

}  // namespace seam::onnx::detail
