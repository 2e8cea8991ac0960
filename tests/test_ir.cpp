// Graph building, verification and error messages.
#include <gtest/gtest.h>

#include "backend/cpu/cpu.h"
#include "common/strings.h"
#include "io/model_file.h"
#include "ops/registry.h"
#include "seam/seam.h"
#include "test_util.h"

using namespace seam;
using seam::testing::error_of;

TEST(Graph, InfersShapesAndNamesNodes) {
  Graph g;
  Var x = g.input("x", {8, 784});
  Var h = nn::linear(x, 128, "fc1");
  Var y = relu(h);
  EXPECT_EQ(y.shape(), (Shape{8, 128}));
  EXPECT_EQ(g.value(y.id()).name, "relu");
  {
    auto s = g.scope("block");
    Var z = relu(y);
    EXPECT_EQ(z.name(), "block/relu");
  }
  EXPECT_EQ(relu(y).name(), "relu_1");
  g.verify();
}

TEST(Graph, ShapeMismatchNamesBothOperandsAndTheOp) {
  Graph g;
  Var a = g.input("a", {4, 256});
  Var w = g.param("fc2.w", {128, 10}, Init::zeros());
  std::string msg = error_of([&] { matmul(a, w); });
  EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'a' f32[4,256]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'fc2.w' f32[128,10]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("inner dimensions"), std::string::npos) << msg;
}

TEST(Graph, BroadcastMismatchIsAnError) {
  Graph g;
  Var a = g.input("a", {4, 3});
  Var b = g.input("b", {4, 2});
  std::string msg = error_of([&] { add(a, b); });
  EXPECT_NE(msg.find("do not broadcast"), std::string::npos) << msg;
}

TEST(Graph, UnknownAttributeSuggestsTheNearestName) {
  Graph g;
  Var x = g.input("x", {1, 3, 8, 8});
  Var w = g.param("w", {4, 3, 3, 3}, Init::zeros());
  std::string msg = error_of([&] { g.add(Op::conv2d, {x.id(), w.id()}, {{"strid", std::vector<int64_t>{1, 1}}}); });
  EXPECT_NE(msg.find("unknown attribute 'strid'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'stride'"), std::string::npos) << msg;
}

TEST(Graph, MistypedAndMissingAttributes) {
  Graph g;
  Var x = g.input("x", {2, 3});
  EXPECT_NE(error_of([&] { g.add(Op::scale, {x.id()}); }).find("'factor' is required"), std::string::npos);
  EXPECT_NE(error_of([&] { g.add(Op::softmax, {x.id()}, {{"axis", 0.5}}); }).find("must be a int"), std::string::npos);
}

TEST(Graph, WrongOperandCountShowsTheSignature) {
  Graph g;
  Var x = g.input("x", {2, 3});
  std::string msg = error_of([&] { g.add(Op::linear, {x.id()}); });
  EXPECT_NE(msg.find("linear(x, w, b?)"), std::string::npos) << msg;
}

TEST(Graph, IntegerInputsAreRejectedWhereFloatsAreNeeded) {
  Graph g;
  Var x = g.input("x", {2, 3}, DType::i32);
  EXPECT_NE(error_of([&] { relu(x); }).find("must be floating point"), std::string::npos);
}

TEST(Graph, DuplicateNamesAreRejected) {
  Graph g;
  g.input("x", {2});
  EXPECT_NE(error_of([&] { g.param("x", {2}, Init::zeros()); }).find("duplicate"), std::string::npos);
}

TEST(Registry, EveryOpHasASchemaSignatureAndCpuKernel) {
  for (int i = 0; i < kNumOps; ++i) {
    auto op = static_cast<Op>(i);
    const OpDef& d = op_def(op);
    EXPECT_EQ(d.name, op_name(op));
    EXPECT_FALSE(d.signature().empty());
    EXPECT_EQ(parse_op(d.name), op);
    // Views run no kernel (lowering aliases them); every other op has one.
    cpu::Kernel k = nullptr;
    EXPECT_NO_THROW(k = cpu::kernel_for(op)) << d.name;
    if (d.view_of < 0) EXPECT_TRUE(k) << d.name;
  }
}

TEST(Strings, NearestNamesListsEachSuggestionOnce) {
  EXPECT_EQ(nearest_names("lineer", {"linear", "relu", "linear", "line", "line"}), "'linear', 'line'");
}

namespace {
std::string model_error(const std::string& text) {
  return error_of([&] { io::parse_model_json(text, "m.json"); });
}
size_t count_of(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
  return n;
}
}  // namespace

TEST(ModelFile, PrecisionNamesWhatGemmsComputeIn) {
  const std::string head = R"({"input": {"shape": [4]}, "classes": 2, "layers": [{"op": "linear", "out": 2}])";
  EXPECT_EQ(io::parse_model_json(head + "}", "m.json").precision, Precision::f32);  // IEEE unless asked
  EXPECT_EQ(io::parse_model_json(head + R"(, "precision": "tf32"})", "m.json").precision, Precision::tf32);
  const std::string e = model_error(head + R"(, "precision": "tf33"})");
  EXPECT_NE(e.find("m.json: unknown precision 'tf33'; did you mean 'tf32'"), std::string::npos) << e;
  EXPECT_EQ(io::parse_model_json(head + R"(, "precision": "bf16"})", "m.json").precision, Precision::bf16);
  EXPECT_EQ(parse_precision("f16"), Precision::f16);
  EXPECT_TRUE(io::parse_model_json(head + "}", "m.json").master_weights);
  EXPECT_FALSE(io::parse_model_json(head + R"(, "precision": "bf16", "master_weights": false})", "m.json").master_weights);
  const std::string bad = model_error(head + R"(, "master_weights": "no"})");
  EXPECT_NE(bad.find("m.json: 'master_weights' has the wrong type"), std::string::npos) << bad;
  EXPECT_EQ(parse_precision("fp16"), std::nullopt);
  EXPECT_EQ(precision_names(), (std::vector<std::string>{"f32", "tf32", "bf16", "f16"}));
}

TEST(ModelFile, ALayerTakesAPrecisionOfItsOwnAndBadOnesNameTheLayer) {
  const std::string head = R"({"input": {"shape": [4]}, "classes": 2, "precision": "bf16", "layers": [)";
  io::ModelSpec spec = io::parse_model_json(
      head + R"({"op": "linear", "name": "fc1", "out": 8}, {"op": "linear", "name": "fc2", "out": 2, "precision": "f32"}]})",
      "m.json");
  io::BuiltGraph b = io::build_graph(spec, 3);
  ASSERT_EQ(b.overrides.size(), 1u);
  EXPECT_EQ(b.overrides[0].node, "fc2");
  EXPECT_EQ(b.overrides[0].precision, Precision::f32);
  std::string e = model_error(head + R"({"op": "linear", "name": "fc1", "out": 2, "precision": "bf17"}]})");
  EXPECT_NE(e.find("m.json: layer 0 ('fc1') linear: unknown precision 'bf17'; did you mean 'bf16'"), std::string::npos)
      << e;
  e = model_error(head + R"({"op": "linear", "name": "fc1", "out": 2}, {"op": "layer_norm", "name": "ln", "precision": "f16"}]})");
  EXPECT_NE(e.find("m.json: layer 1 ('ln') layer_norm: precision override 'ln' (f16): layer_norm node 'ln/layer_norm' "
                   "computes in f32 at every precision"),
            std::string::npos)
      << e;
  e = model_error(head + R"({"op": "linear", "name": "fc1", "out": 2, "precision": "tf32"}]})");
  EXPECT_NE(e.find("layer 0 ('fc1') linear: precision override 'fc1': tf32 is a policy for a whole model"),
            std::string::npos)
      << e;
}

TEST(ModelFile, UnknownOpSuggestsEachNameOnce) {
  // "linear" is both an op and a layer with parameters.
  std::string msg = model_error(R"({"input": {"shape": [784]}, "layers": [{"op": "lineer", "out": 10}]})");
  EXPECT_NE(msg.find("unknown op 'lineer'"), std::string::npos) << msg;
  EXPECT_EQ(count_of(msg, "'linear'"), 1u) << msg;
}

TEST(ModelFile, InputIsTheOneInputFormOfInputs) {
  // In a graph, on an op with parameters and on one without.
  io::ModelSpec g = io::parse_model_json(R"({"input": {"shape": [784]}, "nodes": [
      {"name": "c0", "op": "linear", "out": 16},
      {"name": "b0", "op": "batch_norm", "input": "c0"},
      {"name": "r0", "op": "relu", "input": "b0"},
      {"name": "out", "op": "linear", "input": "r0", "out": 10}]})", "m.json");
  io::BuiltGraph bg = io::build_graph(g, 4);
  auto w = bg.graph.find("out.weight");
  ASSERT_TRUE(w);
  EXPECT_EQ(bg.graph.value(*w).type.str(), "f32[10,16]");
  // In a sequence it overrides the previous layer: "b" reads the data, not "a".
  io::ModelSpec s = io::parse_model_json(R"({"input": {"shape": [784]}, "layers": [
      {"name": "a", "op": "linear", "out": 20}, {"name": "b", "op": "linear", "out": 10, "input": "x"}]})", "m.json");
  bg = io::build_graph(s, 4);
  w = bg.graph.find("b.weight");
  ASSERT_TRUE(w);
  EXPECT_EQ(bg.graph.value(*w).type.str(), "f32[10,784]");
}

TEST(ModelFile, InputAndInputsTogetherAreRejected) {
  std::string msg = model_error(R"({"input": {"shape": [784]}, "nodes": [
      {"name": "a", "op": "linear", "out": 10}, {"name": "r", "op": "relu", "input": "a", "inputs": ["a"]}]})");
  EXPECT_NE(msg.find("layer 1 ('r') relu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not both"), std::string::npos) << msg;
  msg = model_error(R"({"input": {"shape": [784]}, "nodes": [
      {"name": "a", "op": "linear", "out": 10}, {"name": "r", "op": "relu", "input": ["a"]}]})");
  EXPECT_NE(msg.find("'input' must be a node name"), std::string::npos) << msg;
}

TEST(ModelFile, UnknownNodeKeyNamesTheKeyTheNodeAndTheNearestKey) {
  // A misspelt "inputs" is reported as such, not as a node without inputs.
  std::string msg = model_error(R"({"input": {"shape": [784]}, "nodes": [
      {"name": "a", "op": "linear", "out": 10}, {"name": "bn", "op": "batch_norm", "inptus": ["a"]}]})");
  EXPECT_NE(msg.find("layer 1 ('bn') batch_norm: unknown key 'inptus'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'inputs'"), std::string::npos) << msg;
  msg = model_error(R"({"input": {"shape": [784]}, "nodes": [
      {"name": "a", "op": "linear", "out": 10}, {"name": "r", "op": "relu", "inptu": "a"}]})");
  EXPECT_NE(msg.find("('r') relu: unknown key 'inptu'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'input'"), std::string::npos) << msg;
}

// stop_gradient is a forward op (its name holds "_grad" only inside "_gradient"); the
// ops the backward pass emits are not model-file ops.
TEST(ModelFile, StopGradientIsAModelFileOpAndGradientOpsAreNot) {
  EXPECT_FALSE(is_gradient_op(Op::stop_gradient));
  EXPECT_TRUE(is_gradient_op(Op::relu_grad));
  EXPECT_TRUE(is_gradient_op(Op::conv2d_grad_input));
  EXPECT_TRUE(is_gradient_op(Op::linear_grad_weight_bias));
  EXPECT_TRUE(is_gradient_op(Op::cross_entropy_with_grad));
  io::ModelSpec m = io::parse_model_json(R"({"input": {"shape": [8]}, "nodes": [
      {"name": "a", "op": "linear", "out": 16},
      {"name": "frozen", "op": "stop_gradient", "input": "a"},
      {"name": "out", "op": "linear", "input": "frozen", "out": 10}]})", "m.json");
  io::BuiltGraph bg = io::build_graph(m, 2);
  EXPECT_TRUE(bg.graph.find("out.weight"));
  const std::string msg = model_error(R"({"input": {"shape": [8]}, "nodes": [
      {"name": "a", "op": "linear", "out": 10}, {"name": "g", "op": "relu_grad", "inputs": ["a", "a"]}]})");
  EXPECT_NE(msg.find("unknown op 'relu_grad'"), std::string::npos) << msg;
}

// A single int is both entries of a window attribute, and the one entry of any other list.
TEST(ModelFile, ASingleIntIsAWindowsTwoEntriesAndOtherListsOne) {
  io::ModelSpec m = io::parse_model_json(R"({"input": {"shape": [1, 8, 8]}, "nodes": [
      {"name": "c", "op": "conv2d", "out": 4, "kernel": 3, "padding": 1},
      {"name": "p", "op": "max_pool2d", "input": "c", "kernel": 2},
      {"name": "s", "op": "sum", "input": "p", "axes": 1, "keepdims": 1},
      {"name": "f", "op": "flatten", "input": "s"},
      {"name": "out", "op": "linear", "input": "f", "out": 10}]})", "m.json");
  io::BuiltGraph bg = io::build_graph(m, 2);
  // [2, 4, 4, 4] summed over the channels: 16 features.
  const auto w = bg.graph.find("out.weight");
  ASSERT_TRUE(w);
  EXPECT_EQ(bg.graph.value(*w).type.str(), "f32[10,16]");
}

// A model file is checked at its own batch size, so a shape written for it is accepted.
TEST(ModelFile, IsCheckedAtItsOwnBatchSize) {
  const char* text = R"({"input": {"shape": [8]}, "batch_size": 4, "nodes": [
      {"name": "a", "op": "linear", "out": 16},
      {"name": "r", "op": "reshape", "input": "a", "shape": [4, 4, 4]},
      {"name": "f", "op": "flatten", "input": "r"},
      {"name": "out", "op": "linear", "input": "f", "out": 10}]})";
  io::ModelSpec m = io::parse_model_json(text, "m.json");
  EXPECT_EQ(m.batch_size, 4);
  EXPECT_NE(model_error(std::string(text).replace(std::string(text).find("\"batch_size\": 4"), 15, "\"batch_size\": 3")).find("reshape"),
            std::string::npos);
}

// Attributes the compiler sets are refused by name rather than silently overwritten.
TEST(ModelFile, AttributesTheCompilerSetsAreRefused) {
  std::string msg = model_error(R"({"input": {"shape": [8]}, "nodes": [
      {"name": "a", "op": "linear", "out": 10}, {"name": "d", "op": "dropout", "input": "a", "p": 0.1, "training": 0}]})");
  EXPECT_NE(msg.find("('d') dropout: 'training' is set by the mode"), std::string::npos) << msg;
  msg = model_error(R"({"input": {"shape": [8]}, "nodes": [
      {"name": "a", "op": "linear", "out": 10}, {"name": "d", "op": "dropout", "input": "a", "stream": 3}]})");
  EXPECT_NE(msg.find("'stream'"), std::string::npos) << msg;
}
