// Graph building, verification and error messages.
#include <gtest/gtest.h>

#include "ops/registry.h"
#include "seam/seam.h"

using namespace seam;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

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
  }
}
