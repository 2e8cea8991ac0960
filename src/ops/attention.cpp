// Scaled dot-product attention and its gradient. The forward also writes each query row's
// log-sum-exp of the scaled scores (f32 for 16-bit data), from which the backward
// recomputes the probabilities: the [Tq, Tk] matrix is never an operand between steps.
#include <cmath>

#include "ops/registry.h"

namespace seam {

namespace {

struct AttentionDims {
  int64_t b, h, tq, tk, d, dv;
};

// A scale that is 0 (the default, 1 / sqrt(D)) or positive and finite, dropout in [0, 1).
void check_attention_attrs(const InferCtx& c) {
  const double scale = c.attrs.f("scale");
  if (!(scale >= 0) || !std::isfinite(scale)) c.fail("scale must be positive and finite (0: 1 / sqrt(D)), got ", scale);
  const double p = c.attrs.f("dropout");
  if (!(p >= 0 && p < 1)) c.fail("dropout must be in [0, 1), got ", p);
}

// q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv]: one float dtype, causal only with
// Tq = Tk, a scale that is 0 (the default, 1 / sqrt(D)) or positive and finite.
AttentionDims check_attention(const InferCtx& c, size_t q, size_t k, size_t v) {
  for (size_t i : {q, k, v}) {
    c.expect_float(i);
    if (c.shape(i).size() != 4) c.fail("q, k and v must be [B, H, T, D], got ", shape_str(c.shape(i)));
    if (c.type(i).dtype != c.type(q).dtype) c.fail("q, k and v must share one dtype");
  }
  const Shape &sq = c.shape(q), &sk = c.shape(k), &sv = c.shape(v);
  if (sk[0] != sq[0] || sk[1] != sq[1] || sk[3] != sq[3])
    c.fail("k ", shape_str(sk), " must be [B, H, Tk, D] of q's B, H and D ", shape_str(sq));
  if (sv[0] != sq[0] || sv[1] != sq[1] || sv[2] != sk[2])
    c.fail("v ", shape_str(sv), " must be [B, H, Tk, Dv] of k's B, H and Tk ", shape_str(sk));
  if (c.attrs.i("causal") != 0 && sq[2] != sk[2])
    c.fail("causal attention needs as many queries as keys, got Tq = ", sq[2], ", Tk = ", sk[2]);
  check_attention_attrs(c);
  return {sq[0], sq[1], sq[2], sk[2], sq[3], sv[3]};
}

// qkv [B, T, 3, H, D] of a float dtype.
AttentionDims check_packed(const InferCtx& c, size_t qkv) {
  c.expect_float(qkv);
  const Shape& s = c.shape(qkv);
  if (s.size() != 5 || s[2] != 3) c.fail("qkv must be [B, T, 3, H, D], got ", shape_str(s));
  check_attention_attrs(c);
  return {s[0], s[3], s[1], s[1], s[4], s[4]};
}

// Multiply-adds of q k^T and of p v, counting only the unmasked half when causal.
double attention_flops(const AttentionDims& a, const Attrs& attrs) {
  const double pairs = static_cast<double>(a.b * a.h * a.tq) * static_cast<double>(a.tk) *
                       (attrs.i("causal") != 0 ? 0.5 : 1.0);
  return 2.0 * pairs * static_cast<double>(a.d + a.dv);
}
double attention_flops(const OpCostCtx& c, size_t q, size_t v) {
  const Shape &sq = c.in[q].shape, &sv = c.in[v].shape;
  return attention_flops({sq[0], sq[1], sq[2], sv[2], sq[3], sv[3]}, c.attrs);
}
double packed_flops(const OpCostCtx& c, size_t qkv) {
  const Shape& s = c.in[qkv].shape;
  return attention_flops({s[0], s[3], s[1], s[1], s[4], s[4]}, c.attrs);
}

// dropout: of the probabilities, as the dropout op draws (Philox(seed, step, stream,
// index), the index ((b * H + h) * Tq + i) * Tk + j), in training only.
const std::vector<AttrSpec> kAttrs = {
    {"causal", int64_t{0}}, {"scale", 0.0}, {"dropout", 0.0}, {"stream", int64_t{0}}, {"training", int64_t{1}}};

}  // namespace

void register_attention(OpTable& t) {
  {
    OpDef& d = def(t, Op::attention);
    d.name = "attention";
    d.inputs = {"q", "k", "v"};
    d.outputs = {"o", "lse"};
    d.attrs = kAttrs;
    d.doc = "o = dropout(softmax(scale * q k^T)) v on [B, H, T, D], causal: keys after the query masked, scale 0: "
            "1 / sqrt(D), dropout: of the probabilities (training only); lse: each query's log-sum-exp of its scaled "
            "scores (for the gradient)";
    d.infer = [](const InferCtx& c) {
      const AttentionDims a = check_attention(c, 0, 1, 2);
      return std::vector<TensorType>{{c.type(0).dtype, {a.b, a.h, a.tq, a.dv}},
                                     {compute_dtype(c.type(0).dtype), {a.b, a.h, a.tq}}};
    };
    d.flops = [](const OpCostCtx& c) { return attention_flops(c, 0, 2); };
    d.grad = [](GradCtx& c) {
      auto out = c.g.add(Op::attention_grad,
                         {c.dy().id(), c.x(0).id(), c.x(1).id(), c.x(2).id(), c.y(0).id(), c.y(1).id()}, c.attrs());
      for (size_t i = 0; i < 3; ++i) c.set(i, c.g.var(out[i]));
    };
  }
  {
    OpDef& d = def(t, Op::attention_grad);
    d.name = "attention_grad";
    d.inputs = {"do", "q", "k", "v", "o", "lse"};
    d.outputs = {"dq", "dk", "dv"};
    d.attrs = kAttrs;
    d.doc = "gradients of attention from do, the operands, and the forward's o and lse";
    d.infer = [](const InferCtx& c) {
      const AttentionDims a = check_attention(c, 1, 2, 3);
      const Shape o{a.b, a.h, a.tq, a.dv};
      for (size_t i : {0, 4})
        if (c.shape(i) != o || c.type(i).dtype != c.type(1).dtype)
          c.fail(i == 0 ? "do" : "o", " must be ", TensorType{c.type(1).dtype, o}.str(), ", got ", c.type(i).str());
      if (c.type(5) != TensorType{compute_dtype(c.type(1).dtype), {a.b, a.h, a.tq}})
        c.fail("lse must be ", TensorType{compute_dtype(c.type(1).dtype), {a.b, a.h, a.tq}}.str(), ", got ",
               c.type(5).str());
      return std::vector<TensorType>{c.type(1), c.type(2), c.type(3)};
    };
    d.flops = [](const OpCostCtx& c) { return 2.5 * attention_flops(c, 1, 3); };
  }
  {
    OpDef& d = def(t, Op::attention_qkv);
    d.name = "attention_qkv";
    d.inputs = {"qkv"};
    d.outputs = {"o", "lse"};
    d.attrs = kAttrs;
    d.doc = "causal or full attention of q, k and v packed token by token as a fused projection writes them, qkv "
            "[B, T, 3, H, D]: o [B, T, H, D] (heads merged as the output projection reads them) and lse [B, H, T]; "
            "o is attention(q, k, v)'s with its heads moved after T";
    d.infer = [](const InferCtx& c) {
      const AttentionDims a = check_packed(c, 0);
      return std::vector<TensorType>{{c.type(0).dtype, {a.b, a.tq, a.h, a.dv}},
                                     {compute_dtype(c.type(0).dtype), {a.b, a.h, a.tq}}};
    };
    d.flops = [](const OpCostCtx& c) { return packed_flops(c, 0); };
    d.grad = [](GradCtx& c) {
      c.set(0, c.g.add1(Op::attention_qkv_grad, {c.dy().id(), c.x(0).id(), c.y(0).id(), c.y(1).id()}, c.attrs()));
    };
  }
  {
    OpDef& d = def(t, Op::attention_qkv_grad);
    d.name = "attention_qkv_grad";
    d.inputs = {"do", "qkv", "o", "lse"};
    d.outputs = {"dqkv"};
    d.attrs = kAttrs;
    d.doc = "the gradient of attention_qkv, packed as qkv is";
    d.infer = [](const InferCtx& c) {
      const AttentionDims a = check_packed(c, 1);
      const TensorType o{c.type(1).dtype, {a.b, a.tq, a.h, a.dv}};
      const TensorType lse{compute_dtype(c.type(1).dtype), {a.b, a.h, a.tq}};
      if (c.type(0) != o) c.fail("do must be ", o.str(), ", got ", c.type(0).str());
      if (c.type(2) != o) c.fail("o must be ", o.str(), ", got ", c.type(2).str());
      if (c.type(3) != lse) c.fail("lse must be ", lse.str(), ", got ", c.type(3).str());
      return std::vector<TensorType>{c.type(1)};
    };
    d.flops = [](const OpCostCtx& c) { return 2.5 * packed_flops(c, 1); };
  }
}

Var attention_qkv(Var qkv, bool causal, std::optional<double> scale, double dropout) {
  if (scale && !(*scale > 0))
    fail("attention_qkv: scale must be positive, got ", *scale, " (leave it unset for 1 / sqrt(D))");
  auto stream = static_cast<int64_t>(qkv.graph().nodes().size());
  return qkv.graph().add1(Op::attention_qkv, {qkv.id()},
                          {{"causal", int64_t{causal}}, {"scale", scale.value_or(0.0)}, {"dropout", dropout},
                           {"stream", stream}});
}

Var attention(Var q, Var k, Var v, bool causal, std::optional<double> scale, double dropout) {
  if (scale && !(*scale > 0))
    fail("attention: scale must be positive, got ", *scale, " (leave it unset for 1 / sqrt(D))");
  // As dropout's: the node's position names its random stream.
  auto stream = static_cast<int64_t>(q.graph().nodes().size());
  return q.graph().add1(Op::attention, {q.id(), k.id(), v.id()},
                        {{"causal", int64_t{causal}}, {"scale", scale.value_or(0.0)}, {"dropout", dropout},
                         {"stream", stream}});
}

}  // namespace seam
