// What opsets 18 to 21 changed or added among the ops seam imports (the node tests of
// libonnx-testdata stop at opset 17): Gelu and Mish, Split by num_outputs, ReduceMean's
// axes as an input, Pad's wrap mode; and BatchNormalization's training mode (opset 14 on);
// each against values computed here in double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "io/onnx.h"
#include "onnx_build.h"
#include "seam/seam.h"
#include "test_util.h"

namespace seam::testing {
namespace {

namespace P = ::onnx;
using namespace onnx_build;

struct OneNode {
  P::ModelProto m;
  P::GraphProto& g;
  explicit OneNode(int64_t opset) : g(*m.mutable_graph()) {
    m.set_ir_version(9);
    m.add_opset_import()->set_version(opset);
  }
  void ints(const std::string& name, const std::vector<int64_t>& v) {
    P::TensorProto* t = g.add_initializer();
    t->set_name(name);
    t->set_data_type(P::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(v.size()));
    for (int64_t x : v) t->add_int64_data(x);
  }
  // Imports, runs x through, and returns each output.
  std::vector<std::vector<float>> run(const std::vector<float>& x) {
    const std::string bytes = m.SerializeAsString();
    onnx::OnnxImport imp = onnx::import_onnx_bytes(std::as_bytes(std::span(bytes)), "m.onnx", {});
    Model model(imp.graph, {.seed = 1});
    onnx::load_initial(model, imp);
    std::vector<ValueId> outs;
    for (const std::string& o : imp.outputs) outs.push_back(*imp.graph.find(o));
    Program p = model.compile({.mode = Mode::eval, .outputs = outs});
    p.set_input("x", std::span<const float>(x));
    p.run();
    std::vector<std::vector<float>> r;
    for (const std::string& o : imp.outputs) r.push_back(p.read_as<float>(o));
    return r;
  }
};

void set_string(P::NodeProto* n, const std::string& name, const std::string& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(P::AttributeProto::STRING);
  a->set_s(v);
}

void set_int(P::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(P::AttributeProto::INT);
  a->set_i(v);
}

TEST(OnnxOpset, GeluAndMishAreTheirFormulas) {
  const auto x = random_floats(64, 71);
  for (const std::string approx : {"none", "tanh"}) {
    OneNode m(20);
    add_io(m.g.mutable_input(), "x", {8, 8});
    set_string(add_node(m.g, "Gelu", {"x"}, {"y"}), "approximate", approx);
    add_io(m.g.mutable_output(), "y", {8, 8});
    const auto y = m.run(x)[0];
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = x[i];
      const double want = approx == "none"
                              ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))
                              : 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      EXPECT_NEAR(y[i], want, 1e-5 * (1 + std::abs(want))) << approx << " " << v;
    }
  }
  OneNode m(18);
  add_io(m.g.mutable_input(), "x", {64});
  add_node(m.g, "Mish", {"x"}, {"y"});
  add_io(m.g.mutable_output(), "y", {64});
  const auto y = m.run(x)[0];
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], want = v * std::tanh(std::log1p(std::exp(v)));
    EXPECT_NEAR(y[i], want, 1e-5 * (1 + std::abs(want))) << v;
  }
}

// Normalized by the batch's own mean and population variance over N and L; the running
// statistics' update as outputs 1 and 2.
TEST(OnnxOpset, BatchNormInTrainingModeUsesTheBatchsStatistics) {
  const int64_t n = 3, ch = 2, len = 5;
  const double eps = 1e-3, momentum = 0.8;
  OneNode m(15);
  add_io(m.g.mutable_input(), "x", {n, ch, len});
  const auto scale = random_floats(ch, 81), bias = random_floats(ch, 82), mean0 = random_floats(ch, 83);
  const std::vector<float> var0 = {0.5f, 1.5f};
  add_tensor(m.g, "scale", {ch}, scale), add_tensor(m.g, "bias", {ch}, bias);
  add_tensor(m.g, "mean", {ch}, mean0), add_tensor(m.g, "var", {ch}, var0);
  P::NodeProto* node = add_node(m.g, "BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y", "rm", "rv"});
  set_int(node, "training_mode", 1);
  auto* a = node->add_attribute();
  a->set_name("epsilon"), a->set_type(P::AttributeProto::FLOAT), a->set_f(static_cast<float>(eps));
  a = node->add_attribute();
  a->set_name("momentum"), a->set_type(P::AttributeProto::FLOAT), a->set_f(static_cast<float>(momentum));
  add_io(m.g.mutable_output(), "y", {n, ch, len});
  add_io(m.g.mutable_output(), "rm", {ch});
  add_io(m.g.mutable_output(), "rv", {ch});
  const auto x = random_floats(static_cast<size_t>(n * ch * len), 84);
  const auto out = m.run(x);
  ASSERT_EQ(out.size(), 3u);
  for (int64_t c = 0; c < ch; ++c) {
    auto at = [&](int64_t b, int64_t l) { return static_cast<double>(x[static_cast<size_t>((b * ch + c) * len + l)]); };
    double mu = 0, var = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t l = 0; l < len; ++l) mu += at(b, l) / (n * len);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t l = 0; l < len; ++l) var += (at(b, l) - mu) * (at(b, l) - mu) / (n * len);
    const auto ci = static_cast<size_t>(c);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t l = 0; l < len; ++l) {
        const double want = (at(b, l) - mu) / std::sqrt(var + eps) * scale[ci] + bias[ci];
        EXPECT_NEAR(out[0][static_cast<size_t>((b * ch + c) * len + l)], want, 1e-5 * (1 + std::abs(want)));
      }
    EXPECT_NEAR(out[1][ci], mean0[ci] * momentum + mu * (1 - momentum), 1e-6);
    EXPECT_NEAR(out[2][ci], var0[ci] * momentum + var * (1 - momentum), 1e-6);
  }
}

TEST(OnnxOpset, SplitByNumOutputsLeavesTheRestLast) {
  OneNode m(18);
  add_io(m.g.mutable_input(), "x", {2, 7});
  set_int(add_node(m.g, "Split", {"x"}, {"a", "b", "c"}), "axis", 1);
  set_int(m.g.mutable_node(0), "num_outputs", 3);
  for (auto [name, n] : {std::pair{"a", 3}, std::pair{"b", 3}, std::pair{"c", 1}})
    add_io(m.g.mutable_output(), name, {2, n});
  const auto x = random_floats(14, 72);
  const auto out = m.run(x);
  ASSERT_EQ(out.size(), 3u);
  const int64_t from[] = {0, 3, 6}, len[] = {3, 3, 1};
  for (size_t k = 0; k < 3; ++k)
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t j = 0; j < len[k]; ++j)
        EXPECT_EQ(out[k][static_cast<size_t>(r * len[k] + j)], x[static_cast<size_t>(r * 7 + from[k] + j)]);
}

TEST(OnnxOpset, ReduceMeanTakesItsAxesAsAnInput) {
  OneNode m(18);
  add_io(m.g.mutable_input(), "x", {3, 4});
  m.ints("axes", {1});
  set_int(add_node(m.g, "ReduceMean", {"x", "axes"}, {"y"}), "keepdims", 0);
  add_io(m.g.mutable_output(), "y", {3});
  const auto x = random_floats(12, 73);
  const auto y = m.run(x)[0];
  for (size_t r = 0; r < 3; ++r) {
    const double want = (x[4 * r] + x[4 * r + 1] + x[4 * r + 2] + x[4 * r + 3]) / 4.0;
    EXPECT_NEAR(y[r], want, 1e-6) << r;
  }
}

TEST(OnnxOpset, PadWrapsAround) {
  OneNode m(19);
  add_io(m.g.mutable_input(), "x", {2, 3});
  m.ints("pads", {0, 1, 0, 2});  // columns: one before, two after
  set_string(add_node(m.g, "Pad", {"x", "pads"}, {"y"}), "mode", "wrap");
  add_io(m.g.mutable_output(), "y", {2, 6});
  const auto x = random_floats(6, 74);
  const auto y = m.run(x)[0];
  const int64_t cols[] = {2, 0, 1, 2, 0, 1};
  for (size_t r = 0; r < 2; ++r)
    for (size_t j = 0; j < 6; ++j) EXPECT_EQ(y[r * 6 + j], x[r * 3 + static_cast<size_t>(cols[j])]) << r << "," << j;
}

TEST(OnnxOpset, AnOpsetPast21IsRefusedByNumber) {
  OneNode m(22);
  add_io(m.g.mutable_input(), "x", {2});
  add_node(m.g, "Relu", {"x"}, {"y"});
  add_io(m.g.mutable_output(), "y", {2});
  try {
    m.run({1, 2});
    FAIL() << "imported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("opset 22 of the default domain; seam imports opsets 1 to 21"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace seam::testing

namespace seam::testing {
namespace {

// softmax(scale q k^T [causal]) v in double, [N, T, D] per leading index n.
std::vector<double> attention_ref(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                  int64_t n, int64_t t, int64_t d, double scale, bool causal) {
  std::vector<double> o(static_cast<size_t>(n * t * d), 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> s(static_cast<size_t>(t));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < t; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += double{q[static_cast<size_t>((b * t + i) * d + e)]} * k[static_cast<size_t>((b * t + j) * d + e)];
        s[static_cast<size_t>(j)] = causal && j > i ? -1e300 : dot * scale;
        mx = std::max(mx, s[static_cast<size_t>(j)]);
      }
      for (double& x : s) sum += x <= -1e299 ? (x = 0) : (x = std::exp(x - mx));
      for (int64_t j = 0; j < t; ++j)
        for (int64_t e = 0; e < d; ++e)
          o[static_cast<size_t>((b * t + i) * d + e)] += s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>((b * t + j) * d + e)];
    }
  return o;
}

// A scalar as exporters write one: a Constant node (an initializer would be a parameter).
void add_scalar(P::GraphProto& g, const std::string& name, float value) {
  auto* a = add_node(g, "Constant", {}, {name})->add_attribute();
  a->set_name("value");
  a->set_type(P::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(P::TensorProto::FLOAT);
  a->mutable_t()->add_float_data(value);
}

// m (inputs q, k, v of 120 values, output o) imports with one attention step (the only
// step where `alone`), and computes softmax(0.5 q k^T [causal]) v over 6 heads of 5 x 4.
void expect_imported_attention(const P::ModelProto& m, bool alone, bool causal, uint32_t seed) {
  const std::string bytes = m.SerializeAsString();
  onnx::OnnxImport imp = onnx::import_onnx_bytes(std::as_bytes(std::span(bytes)), "attn.onnx", {});
  Model model(imp.graph, {.seed = 1});
  onnx::load_initial(model, imp);
  Program p = model.compile({.mode = Mode::eval, .outputs = {*imp.graph.find(imp.outputs[0])}});
  int attention = 0;
  for (const PlanStep& st : p.plan().steps) attention += st.op == Op::attention;
  EXPECT_EQ(attention, 1) << p.plan().str();
  if (alone) EXPECT_EQ(p.plan().steps.size(), 1u) << p.plan().str();
  const auto q = random_floats(120, seed), k = random_floats(120, seed + 1), v = random_floats(120, seed + 2);
  p.set_input("q", std::span<const float>(q));
  p.set_input("k", std::span<const float>(k));
  p.set_input("v", std::span<const float>(v));
  p.run();
  const auto got = p.read_as<float>(imp.outputs[0]);
  const auto want = attention_ref(q, k, v, 6, 5, 4, 0.5, causal);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << i;
}

// Attention as PyTorch exports it (q k^T, a scale, a causal Where mask or none, Softmax,
// p v) imports as one attention op, computing what the nodes compute.
TEST(OnnxOpset, ExportedAttentionImportsAsTheAttentionOp) {
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal, rank 4" : "no mask, rank 3, Div");
    P::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
    P::GraphProto& g = *m.mutable_graph();
    const Shape s = causal ? Shape{2, 3, 5, 4} : Shape{6, 5, 4};
    for (const char* name : {"q", "k", "v"}) add_io(g.mutable_input(), name, s);
    P::NodeProto* tr = add_node(g, "Transpose", {"k"}, {"kt"});
    set_ints(tr, "perm", causal ? std::vector<int64_t>{0, 1, 3, 2} : std::vector<int64_t>{0, 2, 1});
    add_node(g, "MatMul", {"q", "kt"}, {"qk"});
    add_scalar(g, "c", causal ? 0.5f : 2.0f);
    add_node(g, causal ? "Mul" : "Div", {"qk", "c"}, {"scores"});
    std::string into_softmax = "scores";
    if (causal) {
      P::TensorProto* mask = g.add_initializer();
      mask->set_name("mask");
      mask->set_data_type(P::TensorProto::BOOL);
      for (int64_t dim : {1, 1, 5, 5}) mask->add_dims(dim);
      for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 5; ++j) mask->add_int32_data(j <= i ? 1 : 0);
      add_scalar(g, "ninf", -std::numeric_limits<float>::infinity());
      add_node(g, "Where", {"mask", "scores", "ninf"}, {"masked"});
      into_softmax = "masked";
    }
    add_node(g, "Softmax", {into_softmax}, {"p"});
    add_node(g, "MatMul", {"p", "v"}, {"o"});
    add_io(g.mutable_output(), "o", s);
    expect_imported_attention(m, false, causal, 81);
  }
}

// As PyTorch's scaled_dot_product_attention exports it: q and k^T each multiplied by the
// square root of the scale, computed from the head size by Sqrt and Reciprocal nodes. The
// factors fold at import and join the op's scale: the plan is the attention step alone,
// no Mul and no Transpose.
TEST(OnnxOpset, AScaleSplitOverQAndKJoinsTheAttentionOp) {
  P::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  P::GraphProto& g = *m.mutable_graph();
  const Shape s{2, 3, 5, 4};
  for (const char* name : {"q", "k", "v"}) add_io(g.mutable_input(), name, s);
  add_scalar(g, "d", 4.0f);
  add_node(g, "Sqrt", {"d"}, {"sqrt_d"});
  add_node(g, "Reciprocal", {"sqrt_d"}, {"scale"});
  add_node(g, "Sqrt", {"scale"}, {"half"});
  add_node(g, "Mul", {"q", "half"}, {"qs"});
  set_ints(add_node(g, "Transpose", {"k"}, {"kt"}), "perm", {0, 1, 3, 2});
  add_node(g, "Mul", {"kt", "half"}, {"kts"});
  add_node(g, "MatMul", {"qs", "kts"}, {"scores"});
  add_node(g, "Softmax", {"scores"}, {"p"});
  add_node(g, "MatMul", {"p", "v"}, {"o"});
  add_io(g.mutable_output(), "o", s);
  expect_imported_attention(m, true, false, 91);
}

}  // namespace
}  // namespace seam::testing
