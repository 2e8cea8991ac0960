// Tied weights: one parameter read by an embedding and by a linear layer (a language
// model's output projection), in C++ (nn::linear_tied) and in model files ("tie").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "grad_check.h"
#include "io/model_file.h"
#include "plan/explain.h"
#include "seam/seam.h"
#include "test_util.h"

namespace seam::testing {
namespace {

// The gradient of the shared weight is the sum of both uses' (finite differences of the
// loss, whose weight moves both).
TEST(Tied, TheSharedWeightsGradientSumsBothUses) {
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    check_gradients([&](GradCase& c) {
      Var w = c.param("emb.weight", {7, 5});
      Var h = tanh(embedding(c.labels("ids", {3, 4}, 7), w));
      return nn::linear_tied(h, w, "head", bias);
    });
  }
}

// The shared weight's two gradients: the GEMM's written into the gradient buffer, the
// embedding's rows added there (sums_into_embedding_grads), no add and no arena copy. At
// f32 the same bits as the unfused plan (its rows summed first, then one add); under
// bf16 the GEMM writes f32 and the rows meet it in f32, within bf16's rounding of the
// unfused plan's sum. Also without arena reuse, where the rows go into a copy.
TEST(Tied, TheEmbeddingsRowsAreAddedIntoTheProjectionsGradient) {
  constexpr int64_t V = 11, C = 8, B = 4, T = 6;
  Graph g;
  Var ids = g.input("ids", {B, T}, DType::i32);
  Var y = g.input("y", {B * T}, DType::i32);
  Var w = g.param("w", {V, C}, Init::normal(0, 0.5));
  Var h = tanh(embedding(ids, w));
  Var loss = cross_entropy(reshape(nn::linear_tied(h, w, "head", true), {B * T, V}), y);
  std::mt19937 rng(7);
  std::vector<int32_t> id(static_cast<size_t>(B * T)), label(static_cast<size_t>(B * T));
  for (auto& v : id) v = static_cast<int32_t>(rng() % 5);  // rows 5..10 never named: the GEMM's part alone
  for (auto& v : label) v = static_cast<int32_t>(rng() % V);
  for (Precision p : {Precision::f32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(p));
    std::vector<float> grads[3];
    for (int variant = 0; variant < 3; ++variant) {
      Model m(g, {.seed = 2, .precision = p});
      Program prog = m.compile({.loss = loss.id(), .gradients = true, .reuse_memory = variant != 2, .fuse = variant > 0});
      prog.set_input("ids", std::span<const int32_t>(id));
      prog.set_input("y", std::span<const int32_t>(label));
      prog.run();
      grads[variant] = Program::cast_bytes<float>(prog.read_grad("w"));
      int embedding_grads = 0;
      for (const PlanStep& s : prog.plan().steps) {
        if (s.op != Op::embedding_grad) continue;
        ++embedding_grads;
        ASSERT_EQ(s.in.size(), variant > 0 ? 3u : 2u) << prog.plan().str();
        if (variant == 0) continue;
        EXPECT_EQ(s.out[0].region, Region::grads);
        EXPECT_EQ(s.out[0].type.dtype, DType::f32);
        EXPECT_EQ(s.in[2].region == Region::grads && s.in[2].offset == s.out[0].offset, variant == 1);
      }
      EXPECT_EQ(embedding_grads, 1);
      if (variant == 1) {
        EXPECT_EQ(testing::count(prog.plan(), Op::add), 0) << prog.plan().str();
        int gemm_into_grads = 0;  // the projection's weight gradient, in f32 at either policy
        for (const PlanStep& s : prog.plan().steps)
          gemm_into_grads += (s.op == Op::matmul || s.op == Op::linear_grad_weight_bias) && s.out[0].region == Region::grads &&
                             s.out[0].offset == 0 && s.out[0].type == TensorType{DType::f32, {V, C}};
        EXPECT_EQ(gemm_into_grads, 1) << prog.plan().str();
        const std::string text = explain_plan(prog.plan(), prog.plan(), DeviceModel{}, false);
        EXPECT_NE(text.find("embedding_grad+add"), std::string::npos) << text;
      }
    }
    EXPECT_EQ(grads[1], grads[2]);
    const double tol = p == Precision::f32 ? 0.0 : 1e-2;
    double scale = 0;
    for (float v : grads[0]) scale = std::max(scale, std::abs(static_cast<double>(v)));
    ASSERT_GT(scale, 0.0);
    for (size_t i = 0; i < grads[0].size(); ++i)
      if (tol == 0) EXPECT_EQ(grads[1][i], grads[0][i]) << i;
      else EXPECT_NEAR(grads[1][i], grads[0][i], tol * scale) << i;
  }
}

TEST(Tied, ATiedWeightMustBeAParameterOfTheInputsWidth) {
  Graph g;
  Var x = g.input("x", {2, 5});
  try {
    nn::linear_tied(x, g.param("w", {7, 4}, Init::zeros()), "head");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear layer 'head': a tied weight must be a parameter [out, 5]"),
              std::string::npos)
        << e.what();
  }
}

// ids (floats cast to i32) -> embedding [V, C] -> mean over positions -> the same weight
// as the output projection, [C] -> [V] logits.
std::string tied_model(const std::string& head) {
  return R"({"name": "tied", "input": {"shape": [6]}, "classes": 7, "nodes": [
      {"op": "cast", "name": "ids", "input": "x", "dtype": "i32"},
      {"op": "embedding", "name": "emb", "input": "ids", "num": 7, "dim": 4},
      {"op": "mean", "name": "pooled", "input": "emb", "axes": [1]},
      )" + head + R"(]})";
}

TEST(Tied, AModelFileTiesALinearLayerToAnEmbedding) {
  const io::ModelSpec spec =
      io::parse_model_json(tied_model(R"({"op": "linear", "name": "head", "input": "pooled", "tie": "emb"})"), "tied.json");
  io::BuiltGraph bg = io::build_graph(spec, 3);
  Model m(bg.graph, {.seed = 1});
  EXPECT_TRUE(m.layout().param("emb.weight"));
  EXPECT_FALSE(m.layout().param("head.weight"));
  EXPECT_TRUE(m.layout().param("head.bias"));
  Program p = m.compile({.loss = bg.loss, .optimizer = OptimizerConfig::sgd(0.1)});
  const std::vector<float> x = {0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1, 1, 1, 2, 2, 3, 3};
  const std::vector<int32_t> y = {2, 5, 0};
  const auto before = m.read_param("emb.weight");
  p.set_input("x", std::span<const float>(x));
  p.set_input("y", std::span<const int32_t>(y));
  p.run();
  EXPECT_TRUE(std::isfinite(p.read_as<float>(bg.graph.value(bg.loss).name)[0]));
  EXPECT_NE(m.read_param("emb.weight"), before);
  // The projection reads the embedding's weight itself.
  int readers = 0;
  for (const Node& n : bg.graph.nodes())
    for (ValueId v : n.in) readers += bg.graph.value(v).name == "emb.weight";
  EXPECT_EQ(readers, 2);
}

TEST(Tied, AModelFileTieIsCheckedByNameAndShape) {
  auto error_of = [](const std::string& head) {
    try {
      const io::ModelSpec spec = io::parse_model_json(tied_model(head), "tied.json");
      io::build_graph(spec, 3);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(R"({"op": "linear", "name": "head", "input": "pooled", "tie": "nope"})").find("'tie': no earlier layer 'nope' with a weight"),
            std::string::npos)
      << error_of(R"({"op": "linear", "name": "head", "input": "pooled", "tie": "nope"})");
  const std::string out = error_of(R"({"op": "linear", "name": "head", "input": "pooled", "tie": "emb", "out": 9})");
  EXPECT_NE(out.find("'out' = 9 but the tied weight 'emb.weight' is"), std::string::npos) << out;
  const std::string wide = error_of(
      R"({"op": "linear", "name": "wide", "input": "pooled", "out": 5},
          {"op": "linear", "name": "head", "input": "wide", "tie": "emb"})");
  EXPECT_NE(wide.find("the tied weight 'emb.weight' is"), std::string::npos) << wide;
  EXPECT_NE(wide.find("needs [out, 5]"), std::string::npos) << wide;
}

}  // namespace
}  // namespace seam::testing
