// Shape ops. reshape, flatten (and stop_gradient in misc.cpp) are views: they share their
// input's storage and cost no kernel; transpose, concat and slice copy.
#include <algorithm>

#include "ops/geometry.h"
#include "ops/registry.h"

namespace seam {

namespace {

Var reshape_like(GradCtx& c) { return reshape(c.dy(), c.x(0).shape()); }

std::vector<int> perm_of(const InferCtx& c) {
  const auto& p = c.attrs.ints("perm");
  size_t r = c.shape(0).size();
  if (p.size() != r) c.fail("perm ", shape_str(p), " has ", p.size(), " entries for rank ", r);
  std::vector<int> out;
  std::vector<bool> seen(r, false);
  for (int64_t a : p) {
    int n = normalize_axis(a, r);
    if (n < 0 || seen[static_cast<size_t>(n)]) c.fail("perm ", shape_str(p), " is not a permutation");
    seen[static_cast<size_t>(n)] = true;
    out.push_back(n);
  }
  return out;
}

}  // namespace

void register_shape(OpTable& t) {
  {
    OpDef& d = def(t, Op::reshape);
    d.name = "reshape";
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.attrs = {{"shape", std::vector<int64_t>{}, true}};
    d.view_of = 0;
    d.doc = "same elements, new shape (one dim may be -1)";
    d.infer = [](const InferCtx& c) {
      Shape s = c.attrs.ints("shape");
      int64_t known = 1, neg = -1;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == -1) {
          if (neg >= 0) c.fail("shape ", shape_str(s), " has more than one -1");
          neg = static_cast<int64_t>(i);
        } else if (s[i] <= 0) {
          c.fail("shape ", shape_str(s), " has a non-positive dimension");
        } else if (__builtin_mul_overflow(known, s[i], &known)) {
          c.fail("shape ", shape_str(s), " has more elements than fit in 64 bits");
        }
      }
      int64_t n = c.type(0).numel();
      if (neg >= 0) {
        if (n % known) c.fail("cannot reshape ", n, " elements to ", shape_str(s));
        s[static_cast<size_t>(neg)] = n / known;
      }
      if (numel(s) != n) c.fail("cannot reshape ", n, " elements to ", shape_str(s));
      return std::vector<TensorType>{{c.type(0).dtype, s}};
    };
    d.flops = [](const OpCostCtx&) { return 0.0; };
    d.grad = [](GradCtx& c) { c.set(0, reshape_like(c)); };
  }
  {
    OpDef& d = def(t, Op::flatten);
    d.name = "flatten";
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.attrs = {{"start_dim", int64_t{1}}, {"end_dim", int64_t{-1}}};
    d.view_of = 0;
    d.doc = "merges dims start_dim..end_dim into one";
    d.infer = [](const InferCtx& c) {
      const Shape& x = c.shape(0);
      if (x.empty()) return std::vector<TensorType>{{c.type(0).dtype, {1}}};
      int s = c.axis("start_dim", x.size()), e = c.axis("end_dim", x.size());
      if (s > e) c.fail("start_dim ", s, " comes after end_dim ", e);
      Shape out(x.begin(), x.begin() + s);
      int64_t m = 1;
      for (int i = s; i <= e; ++i) m *= x[static_cast<size_t>(i)];
      out.push_back(m);
      out.insert(out.end(), x.begin() + e + 1, x.end());
      return std::vector<TensorType>{{c.type(0).dtype, out}};
    };
    d.flops = [](const OpCostCtx&) { return 0.0; };
    d.grad = [](GradCtx& c) { c.set(0, reshape_like(c)); };
  }
  {
    OpDef& d = def(t, Op::transpose);
    d.name = "transpose";
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.attrs = {{"perm", std::vector<int64_t>{}, true}};
    d.doc = "y.shape[i] = x.shape[perm[i]]";
    d.infer = [](const InferCtx& c) {
      auto p = perm_of(c);
      Shape s;
      for (int a : p) s.push_back(c.shape(0)[static_cast<size_t>(a)]);
      return std::vector<TensorType>{{c.type(0).dtype, s}};
    };
    d.flops = [](const OpCostCtx&) { return 0.0; };
    d.grad = [](GradCtx& c) {
      const auto& p = c.attrs().ints("perm");
      size_t r = p.size();
      std::vector<int64_t> inv(r);
      for (size_t i = 0; i < r; ++i) inv[static_cast<size_t>(normalize_axis(p[i], r))] = static_cast<int64_t>(i);
      c.set(0, permute(c.dy(), inv));
    };
  }
  {
    OpDef& d = def(t, Op::concat);
    d.name = "concat";
    d.inputs = {"xs..."};
    d.outputs = {"y"};
    d.attrs = {{"axis", int64_t{0}, true}};
    d.doc = "joins inputs along an axis";
    d.infer = [](const InferCtx& c) {
      c.expect_same_dtype();
      const Shape& first = c.shape(0);
      int a = c.axis("axis", first.size());
      Shape s = first;
      s[static_cast<size_t>(a)] = 0;
      for (size_t i = 0; i < c.n(); ++i) {
        Shape si = c.shape(i);
        if (si.size() != first.size()) c.fail("input ", i, " has rank ", si.size(), ", input 0 has ", first.size());
        s[static_cast<size_t>(a)] += si[static_cast<size_t>(a)];
        si[static_cast<size_t>(a)] = first[static_cast<size_t>(a)];
        if (si != first) c.fail("input ", i, " differs from input 0 outside axis ", a);
      }
      return std::vector<TensorType>{{c.type(0).dtype, s}};
    };
    d.flops = [](const OpCostCtx&) { return 0.0; };
    d.grad = [](GradCtx& c) {
      int64_t a = c.attrs().i("axis"), off = 0;
      for (size_t i = 0; i < c.node.in.size(); ++i) {
        int64_t len = c.x(i).dim(a);
        if (c.needs(i)) c.set(i, slice(c.dy(), a, off, off + len));
        off += len;
      }
    };
  }
  {
    OpDef& d = def(t, Op::slice);
    d.name = "slice";
    d.inputs = {"x"};
    d.outputs = {"y"};
    d.attrs = {{"axis", int64_t{0}, true}, {"start", int64_t{0}}, {"end", int64_t{0}, true}, {"step", int64_t{1}}};
    d.doc = "x[start:end:step] along one axis (Python semantics)";
    d.infer = [](const InferCtx& c) {
      int a = c.axis("axis", c.shape(0).size());
      int64_t step = c.attrs.i("step");
      if (step < 1) c.fail("step must be >= 1, got ", step);
      Shape s = c.shape(0);
      auto r = normalize_slice(c.attrs.i("start"), c.attrs.i("end"), step, s[static_cast<size_t>(a)]);
      if (r.count == 0) c.fail("slice [", c.attrs.i("start"), ":", c.attrs.i("end"), "] of axis ", a, " is empty");
      s[static_cast<size_t>(a)] = r.count;
      return std::vector<TensorType>{{c.type(0).dtype, s}};
    };
    d.flops = [](const OpCostCtx&) { return 0.0; };
    d.grad = [](GradCtx& c) {
      Attrs a = c.attrs();
      a.set("size", c.x(0).dim(a.i("axis")));
      c.set(0, c.g.add1(Op::slice_grad, {c.dy().id()}, a));
    };
  }
  {
    OpDef& d = def(t, Op::slice_grad);
    d.name = "slice_grad";
    d.inputs = {"dy"};
    d.outputs = {"dx"};
    d.attrs = def(t, Op::slice).attrs;
    d.attrs.push_back({"size", int64_t{0}, true});
    d.doc = "zeros of the sliced input's shape with dy placed where the slice read";
    d.infer = [](const InferCtx& c) {
      int a = c.axis("axis", c.shape(0).size());
      Shape s = c.shape(0);
      auto r = normalize_slice(c.attrs.i("start"), c.attrs.i("end"), c.attrs.i("step"), c.attrs.i("size"));
      if (r.count != s[static_cast<size_t>(a)]) c.fail("dy does not match the slice");
      s[static_cast<size_t>(a)] = c.attrs.i("size");
      return std::vector<TensorType>{{c.type(0).dtype, s}};
    };
    d.flops = [](const OpCostCtx&) { return 0.0; };
  }
}

Var reshape(Var x, Shape shape) {
  if (shape == x.shape()) return x;  // no node for a reshape that changes nothing
  return x.graph().add1(Op::reshape, {x.id()}, {{"shape", shape}});
}
Var flatten(Var x, int64_t start_dim, int64_t end_dim) {
  return x.graph().add1(Op::flatten, {x.id()}, {{"start_dim", start_dim}, {"end_dim", end_dim}});
}
Var permute(Var x, std::vector<int64_t> perm) {
  return x.graph().add1(Op::transpose, {x.id()}, {{"perm", perm}});
}
Var transpose(Var x, int64_t dim0, int64_t dim1) {
  int a = normalize_axis(dim0, x.rank()), b = normalize_axis(dim1, x.rank());
  if (a < 0 || b < 0) fail("transpose of ", x.graph().describe(x.id()), ": dims ", dim0, ", ", dim1, " out of range");
  std::vector<int64_t> perm(x.rank());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[static_cast<size_t>(a)], perm[static_cast<size_t>(b)]);
  return permute(x, perm);
}
Var concat(const std::vector<Var>& xs, int64_t axis) {
  if (xs.empty()) fail("concat needs at least one input");
  std::vector<ValueId> ids;
  for (auto& x : xs) ids.push_back(x.id());
  return xs[0].graph().add1(Op::concat, ids, {{"axis", axis}});
}
Var slice(Var x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  return x.graph().add1(Op::slice, {x.id()}, {{"axis", axis}, {"start", start}, {"end", end}, {"step", step}});
}

}  // namespace seam
