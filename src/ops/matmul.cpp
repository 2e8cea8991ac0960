// matmul and linear: schema, shapes, gradients. Gradients are themselves matmuls; for a
// weight shared across leading dims ([B, T, K] x [K, N]) the weight gradient is one GEMM
// over M = B*T through free reshapes, never per-batch GEMMs plus a reduction.
#include <optional>
#include <string>

#include "ops/geometry.h"
#include "ops/registry.h"

namespace seam {

namespace {

struct MatmulDims {
  Shape batch;  // broadcast batch dims of the output
  int64_t m, n, k;
};

MatmulDims matmul_dims(const InferCtx& c) {
  const Shape& a = c.shape(0);
  const Shape& b = c.shape(1);
  if (a.size() < 2 || b.size() < 2) c.fail("both operands need rank >= 2");
  bool ta = c.attrs.i("transpose_a") != 0, tb = c.attrs.i("transpose_b") != 0;
  int64_t m = a[a.size() - (ta ? 1 : 2)], ka = a[a.size() - (ta ? 2 : 1)];
  int64_t kb = b[b.size() - (tb ? 1 : 2)], n = b[b.size() - (tb ? 2 : 1)];
  if (ka != kb)
    c.fail("inner dimensions differ: a gives K=", ka, ", b gives K=", kb,
           ta || tb ? " (after transposes)" : "");
  Shape ba(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  auto batch = broadcast_shapes(ba, bb);
  if (!batch) c.fail("batch dimensions ", shape_str(ba), " and ", shape_str(bb), " do not broadcast");
  return {*batch, m, n, ka};
}

// y's type for x [..., in] and w [out, in] (inputs 0 and 1), with b [out] at input `bias`
// where the node has one: linear's and linear_add's.
TensorType linear_y(const InferCtx& c, size_t bias) {
  c.expect_float(0);
  c.expect_same_dtype();
  if (c.shape(0).empty()) c.fail("x needs rank >= 1");
  c.expect_rank(1, 2);
  const int64_t in = c.shape(0).back(), out = c.shape(1)[0];
  if (c.shape(1)[1] != in) c.fail("x has ", in, " features but w is ", shape_str(c.shape(1)), " ([out, in] expected)");
  if (c.n() > bias && c.shape(bias) != Shape{out}) c.fail("b must have shape [", out, "], got ", shape_str(c.shape(bias)));
  Shape s = c.shape(0);
  s.back() = out;
  return {c.type(0).dtype, s};
}

}  // namespace

void register_fused_matmul(OpTable& t);

void register_matmul(OpTable& t) {
  {
    OpDef& d = def(t, Op::matmul);
    d.name = "matmul";
    d.inputs = {"a", "b", "c?"};
    d.outputs = {"y"};
    d.attrs = {{"transpose_a", int64_t{0}}, {"transpose_b", int64_t{0}}, {"dtype", std::string()}};
    d.in_place = {0, 2};  // y over its addend: a sum of products built up in one buffer
    d.doc = "y = op(a) op(b) (+ c) over the last two dims, batch dims broadcast; y in `dtype` (\"\": a's; "
            "f32 from 16-bit inputs); c, of y's type, is added as y is stored";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      if (c.type(0).dtype != c.type(1).dtype)
        c.fail("a and b differ in dtype: ", dtype_name(c.type(0).dtype), " and ", dtype_name(c.type(1).dtype));
      MatmulDims md = matmul_dims(c);
      Shape s = md.batch;
      s.push_back(md.m);
      s.push_back(md.n);
      const TensorType y{c.result_dtype(c.type(0).dtype), s};
      if (c.n() > 2 && c.type(2) != y) c.fail("c must be y's ", y.str(), ", got ", c.type(2).str());
      return std::vector<TensorType>{y};
    };
    d.flops = [](const OpCostCtx& c) {
      const Shape& a = c.in[0].shape;
      int64_t k = a[a.size() - (c.attrs.i("transpose_a") ? 2 : 1)];
      return 2.0 * static_cast<double>(c.out[0].numel()) * static_cast<double>(k);
    };
    d.grad = [](GradCtx& c) {
      Var a = c.x(0), b = c.x(1), dy = c.dy();
      bool ta = c.attrs().i("transpose_a") != 0, tb = c.attrs().i("transpose_b") != 0;
      if (c.needs(2)) c.set(2, dy);
      // A weight shared over a's leading dims: fold them into M for both gradients.
      bool fold = b.rank() == 2 && a.rank() > 2 && !ta;
      if (c.needs(0)) {
        Var da = ta ? matmul(b, dy, tb, true) : matmul(dy, b, false, !tb);
        c.set(0, sum_to(da, a.shape()));
      }
      if (c.needs(1)) {
        Var db;
        if (fold) {
          int64_t k = a.dim(-1), n = dy.dim(-1), m = a.type().numel() / k;
          Var a2 = reshape(a, {m, k}), dy2 = reshape(dy, {m, n});
          db = tb ? matmul(dy2, a2, true, false) : matmul(a2, dy2, true, false);
        } else {
          db = tb ? matmul(dy, a, true, ta) : matmul(a, dy, !ta, false);
        }
        c.set(1, sum_to(db, b.shape()));
      }
    };
  }
  {
    OpDef& d = def(t, Op::linear);
    d.name = "linear";
    d.inputs = {"x", "w", "b?"};
    d.outputs = {"y"};
    d.doc = "y = x w^T + b, w [out, in]";
    d.infer = [](const InferCtx& c) { return std::vector<TensorType>{linear_y(c, 2)}; };
    d.flops = [](const OpCostCtx& c) {
      return 2.0 * static_cast<double>(c.out[0].numel()) * static_cast<double>(c.in[1].shape[1]);
    };
    d.grad = [](GradCtx& c) {
      Var x = c.x(0), w = c.x(1), dy = c.dy();
      int64_t in = w.dim(1), out = w.dim(0), m = x.type().numel() / in;
      Var dy2 = reshape(dy, {m, out});
      if (c.needs(0)) c.set(0, reshape(matmul(dy2, w), x.shape()));
      if (c.needs(1) && c.needs(2)) {
        // One GEMM gives both: cuBLASLt's BGRADB epilogue sums dy while it multiplies.
        auto out2 = c.g.add(Op::linear_grad_weight_bias, {dy2.id(), reshape(x, {m, in}).id()});
        c.set(1, c.g.var(out2[0]));
        c.set(2, c.g.var(out2[1]));
      } else {
        if (c.needs(1)) c.set(1, matmul(dy2, reshape(x, {m, in}), true, false));
        if (c.needs(2)) c.set(2, sum(dy2, {0}));
      }
    };
  }
  {
    OpDef& d = def(t, Op::linear_grad_weight_bias);
    d.name = "linear_grad_weight_bias";
    d.inputs = {"dy", "x"};
    d.outputs = {"dw", "db"};
    d.attrs = {{"dtype", std::string()}};
    d.doc = "dw = dy^T x and db = sum over rows of dy, for dy [M, out], x [M, in]; both in `dtype` "
            "(\"\": dy's; f32 from 16-bit inputs)";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      c.expect_same_dtype();
      c.expect_rank(0, 2);
      c.expect_rank(1, 2);
      if (c.shape(0)[0] != c.shape(1)[0]) c.fail("dy and x need the same number of rows");
      DType t = c.result_dtype(c.type(0).dtype);
      return std::vector<TensorType>{{t, {c.shape(0)[1], c.shape(1)[1]}}, {t, {c.shape(0)[1]}}};
    };
    d.flops = [](const OpCostCtx& c) {
      return 2.0 * static_cast<double>(c.in[0].numel()) * static_cast<double>(c.in[1].shape[1]);
    };
  }
  register_fused_matmul(t);  // after linear: it borrows linear's shape rule and cost
}

namespace {

// Checks the act attribute of the fused ops.
const std::string& act_of(const InferCtx& c) {
  const std::string& a = c.attrs.s("act");
  if (a != "relu" && a != "gelu_tanh") c.fail("act must be relu or gelu_tanh, got '", a, "'");
  return a;
}

std::vector<TensorType> infer_linear(const InferCtx& c) { return op_def(Op::linear).infer(c); }

// The dtype of a fused GEMM's column sums: the attribute sums_dtype, "" for input 0's.
DType sums_dtype(const InferCtx& c) {
  const std::string& name = c.attrs.s("sums_dtype");
  const auto t = name.empty() ? std::optional<DType>(c.type(0).dtype) : parse_dtype(name);
  if (!t || !is_float(*t)) c.fail("sums_dtype must name a float dtype, got '", name, "'");
  return *t;
}

TensorType aux_type(const std::string& act, int64_t rows, int64_t n, DType t) {
  if (act == "relu") return {DType::u8, {rows, relu_mask_row_bytes(n)}};
  return {t, {rows, n}};
}

}  // namespace

void register_fused_matmul(OpTable& t) {
  for (Op op : {Op::linear_act, Op::linear_act_aux}) {
    OpDef& d = def(t, op);
    bool aux = op == Op::linear_act_aux;
    d.name = op_name(op);
    d.inputs = {"x", "w", "b?"};
    d.outputs = aux ? std::vector<std::string>{"y", "aux"} : std::vector<std::string>{"y"};
    d.attrs = {{"act", std::string("relu")}};
    d.doc = aux ? "y = act(x w^T + b), and the record its backward GEMM needs (made by fusion)"
                : "y = act(x w^T + b) in one GEMM epilogue (made by fusion)";
    d.infer = [aux](const InferCtx& c) {
      const std::string& act = act_of(c);
      auto y = infer_linear(c);
      if (!aux) return y;
      int64_t n = y[0].shape.back(), rows = y[0].numel() / n;
      if (act == "gelu_tanh" && n % 8) c.fail("gelu_tanh's record needs out % 8 == 0, got ", n);
      return std::vector<TensorType>{y[0], aux_type(act, rows, n, y[0].dtype)};
    };
    d.flops = def(t, Op::linear).flops;
  }
  {
    OpDef& d = def(t, Op::linear_add);
    d.name = "linear_add";
    d.inputs = {"x", "w", "r", "b?"};
    d.outputs = {"y"};
    d.doc = "y = x w^T + b + r, r of y's type: a residual added by the GEMM as it stores y (made by fusion)";
    d.infer = [](const InferCtx& c) {
      const TensorType y = linear_y(c, 3);
      if (c.shape(2) != y.shape) c.fail("r must have y's shape ", shape_str(y.shape), ", got ", shape_str(c.shape(2)));
      return std::vector<TensorType>{y};
    };
    d.flops = def(t, Op::linear).flops;
  }
  {
    OpDef& d = def(t, Op::matmul_act_grad);
    d.name = "matmul_act_grad";
    d.inputs = {"dy", "w", "aux"};
    d.outputs = {"dx", "dx_sums?"};
    d.attrs = {{"act", std::string("relu")}, {"dx_sums", int64_t{0}}, {"sums_dtype", std::string()}};
    d.doc = "dx = (dy w) * act'(pre-activation recorded in aux): a linear layer's input gradient "
            "through the activation before it, in one GEMM epilogue (made by fusion); dx_sums 1: also "
            "dx's column sums (of dx as stored, in sums_dtype, \"\": dx's: the bias gradient of the "
            "linear layer whose output gradient dx is, bias_grads_into_act_grads)";
    d.infer = [](const InferCtx& c) {
      const std::string& act = act_of(c);
      c.expect_float(0);
      c.expect_rank(0, 2);
      c.expect_rank(1, 2);
      if (c.shape(0)[1] != c.shape(1)[0]) c.fail("dy [M, N] and w [N, K] do not chain");
      int64_t m = c.shape(0)[0], k = c.shape(1)[1];
      TensorType want = aux_type(act, m, k, c.type(0).dtype);
      if (!(c.type(2) == want)) c.fail("aux must be ", want.str(), " for act ", act);
      std::vector<TensorType> out{{c.type(0).dtype, {m, k}}};
      const int64_t sums = c.attrs.i("dx_sums");
      if (sums != 0 && sums != 1) c.fail("dx_sums must be 0 or 1, got ", sums);
      if (sums) {
        out.push_back({sums_dtype(c), {k}});
      }
      return out;
    };
    d.flops = [](const OpCostCtx& c) {
      return 2.0 * static_cast<double>(c.out[0].numel()) * static_cast<double>(c.in[0].shape[1]);
    };
  }
  {
    OpDef& d = def(t, Op::linear_grad_input_bias);
    d.name = "linear_grad_input_bias";
    d.inputs = {"dy", "w"};
    d.outputs = {"dx", "db"};
    d.attrs = {{"sums_dtype", std::string()}};
    d.doc = "dx = dy w and db = the column sums of dy (in sums_dtype, \"\": dy's): a linear layer's input and "
            "bias gradients from one GEMM, which sums dy as it reads it (made by fusion: bias_grads_into_data_grads)";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      c.expect_rank(0, 2);
      c.expect_rank(1, 2);
      if (c.type(0).dtype != c.type(1).dtype)
        c.fail("dy and w differ in dtype: ", dtype_name(c.type(0).dtype), " and ", dtype_name(c.type(1).dtype));
      if (c.shape(0)[1] != c.shape(1)[0]) c.fail("dy [M, N] and w [N, K] do not chain");
      const int64_t m = c.shape(0)[0], n = c.shape(0)[1], k = c.shape(1)[1];
      return std::vector<TensorType>{{c.type(0).dtype, {m, k}}, {sums_dtype(c), {n}}};
    };
    d.flops = def(t, Op::matmul_act_grad).flops;  // the same GEMM, dx = dy w
  }
}

Var matmul(Var a, Var b, bool transpose_a, bool transpose_b) {
  return a.graph().add1(Op::matmul, {a.id(), b.id()},
                        {{"transpose_a", int64_t{transpose_a}}, {"transpose_b", int64_t{transpose_b}}});
}

Var linear(Var x, Var w, std::optional<Var> b) {
  std::vector<ValueId> in{x.id(), w.id()};
  if (b) in.push_back(b->id());
  return x.graph().add1(Op::linear, in);
}

}  // namespace seam
