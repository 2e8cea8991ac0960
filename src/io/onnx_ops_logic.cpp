// The ONNX importer's op table, part four: comparisons, logic, Where and Mod. Comparisons
// and logic fold on constants (masks and shape arithmetic); Where with a constant
// condition selects by arithmetic on graph values.
#include <cmath>
#include <functional>

#include "io/onnx_import.h"

namespace seam::onnx::detail {

namespace {

// Comparisons and logic: on constants (mask and shape arithmetic) only; seam's
// elementwise ops compute on floating point values.
template <int Kind>  // 0 Equal, 1 Less, 2 Greater, 3 LessOrEqual, 4 GreaterOrEqual, 5 And, 6 Or, 7 Xor
void compare_op(NodeCtx& c) {
  if (!all_const(c)) c.fail("its operands must be constants: seam folds comparisons and logic, and has no such ops on graph values");
  static const std::function<double(double, double)> fs[] = {
      [](double a, double b) { return a == b ? 1.0 : 0.0; }, [](double a, double b) { return a < b ? 1.0 : 0.0; },
      [](double a, double b) { return a > b ? 1.0 : 0.0; },  [](double a, double b) { return a <= b ? 1.0 : 0.0; },
      [](double a, double b) { return a >= b ? 1.0 : 0.0; },
      [](double a, double b) { return a != 0 && b != 0 ? 1.0 : 0.0; },
      [](double a, double b) { return a != 0 || b != 0 ? 1.0 : 0.0; },
      [](double a, double b) { return (a != 0) != (b != 0) ? 1.0 : 0.0; }};
  Const r = fold_binary(c, c.const_in(0, "a"), c.const_in(1, "b"), fs[Kind]);
  r.elem = ::onnx::TensorProto::BOOL;
  c.out_const(0, r);
}

void not_op(NodeCtx& c) {
  if (!all_const(c)) c.fail("its operand must be a constant: seam folds logic, and has no such ops on graph values");
  Const r = c.const_in(0, "x");
  for (double& v : r.v) v = v != 0 ? 0.0 : 1.0;
  c.out_const(0, r);
}

// Where(cond, x, y): constants fold; a constant condition selects by arithmetic, x m +
// y (1 - m) with the mask m, which is exact where both branches are finite. An infinite
// constant branch (a masked fill with -inf, as attention masks are exported) becomes the
// largest finite value of the result's dtype, which softmax turns into the same zero.
void where_op(NodeCtx& c) {
  if (all_const(c)) {
    const Const &m = c.const_in(0, "condition"), &x = c.const_in(1, "x"), &y = c.const_in(2, "y");
    Const r = fold_binary(c, fold_binary(c, m, x, [](double a, double b) { return a != 0 ? b : 0.0; }), y,
                          [](double, double b) { return b; });
    const Shape s = r.shape;
    for (int64_t i = 0; i < numel(s); ++i) {
      const double cond = at_broadcast(m, s, i);
      r.v[static_cast<size_t>(i)] = cond != 0 ? at_broadcast(x, s, i) : at_broadcast(y, s, i);
    }
    r.elem = x.elem;
    return c.out_const(0, r);
  }
  const Const* m = c.maybe_const(0);
  if (!m) c.fail("the condition must be a constant: seam selects by arithmetic with a constant mask");
  const DType t = c.maybe_const(1) ? c.in(2).dtype() : c.in(1).dtype();
  const double big = t == DType::f16 ? 65504.0 : t == DType::bf16 ? 3.3895313892515355e38 : 3.4028234663852886e38;
  auto branch = [&](size_t i) {
    if (const Const* k = c.maybe_const(i)) {
      Const finite = *k;
      for (double& v : finite.v)
        if (std::isinf(v)) v = v > 0 ? big : -big;
      const std::string name = c.node.name() + ".branch" + std::to_string(i);
      c.imp.consts[name] = finite;
      Var v = c.imp.var(name, c.where);
      return v.dtype() == t ? v : cast(v, t);
    }
    return c.in(i);
  };
  Const keep = *m, drop = *m;
  keep.elem = drop.elem = ::onnx::TensorProto::FLOAT;
  for (double& v : drop.v) v = v != 0 ? 0.0 : 1.0;
  c.imp.consts[c.node.name() + ".keep"] = keep;
  c.imp.consts[c.node.name() + ".drop"] = drop;
  auto mask = [&](const std::string& suffix) {
    Var v = c.imp.var(c.node.name() + suffix, c.where);
    return v.dtype() == t ? v : cast(v, t);
  };
  c.out(0, add(mul(branch(1), mask(".keep")), mul(branch(2), mask(".drop"))));
}


// Mod: integer remainders take the divisor's sign (fmod = 0), fmod = 1 C's fmod (float
// operands need it). On constants (shape and index arithmetic) only.
void mod_op(NodeCtx& c) {
  if (!all_const(c)) c.fail("its operands must be constants: seam folds Mod, and has no such op on graph values");
  const bool c_fmod = c.i("fmod", 0) != 0;
  const Const &a = c.const_in(0, "a"), &b = c.const_in(1, "b");
  if (!c_fmod && is_float(dtype_of(a.elem).value_or(DType::f32)))
    c.fail("fmod = 0 on floating point operands; the ONNX spec requires fmod = 1 for them");
  Const r = fold_binary(c, a, b, [&](double x, double y) {
    if (y == 0) c.fail("division by zero in a constant Mod");
    const double m = std::fmod(x, y);
    return !c_fmod && m != 0 && ((m < 0) != (y < 0)) ? m + y : m;
  });
  c.out_const(0, r);
}

}  // namespace

void add_logic_importers(std::map<std::string, OpImporter>& t) {
  t.insert({{"Equal", compare_op<0>},
            {"Less", compare_op<1>},
            {"Greater", compare_op<2>},
            {"LessOrEqual", compare_op<3>},
            {"GreaterOrEqual", compare_op<4>},
            {"And", compare_op<5>},
            {"Or", compare_op<6>},
            {"Xor", compare_op<7>},
            {"Not", not_op},
            {"Where", where_op},
            {"Mod", mod_op}});
}

}  // namespace seam::onnx::detail
