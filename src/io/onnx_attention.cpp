// Attention as exporters write it, imported as seam's attention op (src/io/onnx_import.h):
//   MatMul(Softmax(scale * MatMul(q, Transpose(k)) [masked causally]), v)
// where every value between the two MatMuls is read by the next node only. The scale is
// a Mul or Div by one constant (absent: 1), of the scores or of q and k^T each; the mask an Add of a constant (0 where a key
// is kept, -inf or below -1e4 where not) or a Where between the scores and such a
// constant, and it must be the causal one (each query sees the keys up to its own). Rank
// 3 operands ([N, T, D]) take the op's head axis as 1. Anything else imports node by node.
#include <cmath>
#include <optional>

#include "io/onnx_import.h"

namespace seam::onnx::detail {

namespace {

namespace T = ::onnx;

// The node that makes `value` if only one node reads it (a link of the chain), else null.
const T::NodeProto* only_producer(const Importer& imp, const std::string& value) {
  auto r = imp.readers.find(value);
  auto p = imp.producer.find(value);
  if (r == imp.readers.end() || r->second != 1 || p == imp.producer.end()) return nullptr;
  return p->second;
}

int64_t int_attr(const T::NodeProto& n, const std::string& name, int64_t def) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return def;
}

bool masked_value(double v) { return v <= -1e4; }

// Whether `keep` (a constant broadcast over [.., tq, tk], true where a key is kept) is the
// causal pattern: key j kept for query i exactly when j <= i.
bool causal(const Const& keep_of, const std::function<bool(double)>& kept, int64_t tq, int64_t tk) {
  const Shape& s = keep_of.shape;
  if (s.size() < 2 || s[s.size() - 2] != tq || s.back() != tk) return false;
  for (size_t d = 0; d + 2 < s.size(); ++d)
    if (s[d] != 1) return false;
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j)
      if (kept(keep_of.v[static_cast<size_t>(i * tk + j)]) != (j <= i)) return false;
  return true;
}

}  // namespace

bool import_attention(NodeCtx& c) {
  Importer& imp = c.imp;
  if (c.opset() < 13 || c.inputs() != 2 || !c.has(0) || !c.has(1) || c.maybe_const(0) || c.maybe_const(1)) return false;
  const T::NodeProto* softmax = only_producer(imp, c.node.input(0));
  if (!softmax || softmax->op_type() != "Softmax") return false;
  Var v = c.in(1);  // made before this node
  const int64_t rank = static_cast<int64_t>(v.shape().size());
  if (rank != 3 && rank != 4) return false;
  const int64_t axis = int_attr(*softmax, "axis", -1);
  if (axis != -1 && axis != rank - 1) return false;
  // Back from the softmax's input: an optional causal mask, an optional scale, q k^T.
  std::string s = softmax->input(0);
  bool is_causal = false;
  const T::NodeProto* n = only_producer(imp, s);
  if (!n) return false;
  auto scalar_const = [&](const std::string& name, double* v) {
    auto k = imp.consts.find(name);
    if (k == imp.consts.end() || k->second.v.size() != 1 || imp.trainable(name)) return false;
    *v = k->second.v[0];
    return true;
  };
  std::string masked_input;
  std::optional<Const> mask;
  std::function<bool(double)> kept;
  if (n->op_type() == "Add" && n->input_size() == 2) {
    for (int i = 0; i < 2 && !mask; ++i) {
      auto k = imp.consts.find(n->input(i));
      if (k != imp.consts.end() && !imp.trainable(n->input(i)) && k->second.shape.size() >= 2) {
        mask = k->second;
        masked_input = n->input(1 - i);
        kept = [](double v) { return v == 0; };
      }
    }
  } else if (n->op_type() == "Where" && n->input_size() == 3) {
    auto cond = imp.consts.find(n->input(0));
    double fill = 0;
    if (cond != imp.consts.end()) {
      if (scalar_const(n->input(2), &fill) && masked_value(fill)) {  // cond selects the scores
        mask = cond->second, masked_input = n->input(1), kept = [](double v) { return v != 0; };
      } else if (scalar_const(n->input(1), &fill) && masked_value(fill)) {  // cond selects the fill
        mask = cond->second, masked_input = n->input(2), kept = [](double v) { return v == 0; };
      }
    }
  }
  if (mask) {
    s = masked_input;
    n = only_producer(imp, s);
    if (!n) return false;
    is_causal = true;  // checked against the shapes below
  }
  double scale = 1.0;
  // Where m multiplies (or divides) one input by a nonzero scalar constant: the factor
  // joins `scale`, and the other input is returned.
  auto scaled = [&](const T::NodeProto& m) -> std::optional<std::string> {
    if ((m.op_type() != "Mul" && m.op_type() != "Div") || m.input_size() != 2) return std::nullopt;
    double f = 0;
    const int side = scalar_const(m.input(1), &f) ? 1 : (m.op_type() == "Mul" && scalar_const(m.input(0), &f)) ? 0 : -1;
    if (side < 0 || f == 0) return std::nullopt;
    scale *= m.op_type() == "Mul" ? f : 1.0 / f;
    return m.input(1 - side);
  };
  if (n->op_type() == "Mul" || n->op_type() == "Div") {
    const std::optional<std::string> scores = scaled(*n);
    if (!scores) return false;
    s = *scores;
    n = only_producer(imp, s);
    if (!n) return false;
  }
  if (n->op_type() != "MatMul" || n->input_size() != 2) return false;
  std::string q_name = n->input(0), kt_name = n->input(1);
  // q and k^T each scaled by a constant (an exporter's split of the scale, sqrt of it on
  // each side): the factors join the op's scale and the Muls stay unread.
  auto unscale = [&](std::string& name) {
    if (const T::NodeProto* m = only_producer(imp, name))
      if (std::optional<std::string> x = scaled(*m)) name = *x;
  };
  unscale(q_name);
  unscale(kt_name);
  if (!imp.vars.count(q_name) || !imp.vars.count(kt_name)) return false;
  std::vector<int64_t> swap(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) swap[static_cast<size_t>(d)] = d;
  std::swap(swap[static_cast<size_t>(rank - 1)], swap[static_cast<size_t>(rank - 2)]);
  // k itself where k^T is a Transpose of its last two dims read here only; else k^T's
  // transpose (read in place by the matmul passes).
  std::optional<Var> k_direct;
  if (const T::NodeProto* t = only_producer(imp, kt_name); t && t->op_type() == "Transpose" && imp.vars.count(t->input(0))) {
    std::vector<int64_t> perm;
    for (const auto& a : t->attribute())
      if (a.name() == "perm") perm.assign(a.ints().begin(), a.ints().end());
    if (perm == swap) k_direct = imp.vars.at(t->input(0));
  }
  Var q = imp.vars.at(q_name), kt = imp.vars.at(kt_name);
  if (static_cast<int64_t>(q.shape().size()) != rank || static_cast<int64_t>(kt.shape().size()) != rank) return false;
  Var k = k_direct ? *k_direct : permute(kt, swap);
  const Shape &sq = q.shape(), &sk = k.shape(), &sv = v.shape();
  const int64_t tq = sq[sq.size() - 2], tk = sk[sk.size() - 2];
  for (int64_t d = 0; d + 2 < rank; ++d)
    if (sq[static_cast<size_t>(d)] != sk[static_cast<size_t>(d)] || sq[static_cast<size_t>(d)] != sv[static_cast<size_t>(d)])
      return false;
  if (sq.back() != sk.back() || sv[sv.size() - 2] != tk) return false;
  if (is_causal && (tq != tk || !causal(*mask, kept, tq, tk))) return false;
  if (!is_float(q.dtype()) || q.dtype() != k.dtype() || q.dtype() != v.dtype()) return false;
  auto four = [&](Var x) {
    if (rank == 4) return x;
    Shape s4 = x.shape();
    s4.insert(s4.begin() + 1, 1);
    return reshape(x, s4);
  };
  Var o = attention(four(q), four(k), four(v), is_causal, scale);
  if (rank == 3) o = reshape(o, {sq[0], tq, sv.back()});
  c.out(0, o);
  return true;
}

}  // namespace seam::onnx::detail
