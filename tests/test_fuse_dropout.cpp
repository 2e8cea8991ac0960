// Dropout inside fused elementwise groups: the same masks as the op alone (fused and
// unfused plans compute the same bits, forward and backward, at f32 and through the bf16
// policy), the program text that carries p and the stream, and generated kernels that
// compile in every layout a group can take.
#include <gtest/gtest.h>

#include <string>

#include "fuse_check.h"
#include "ops/fused_ew.h"
#include "seam/nn.h"
#include "seam/seam.h"

namespace seam {
namespace {

// The programs of the plan's fused steps that draw a dropout mask.
std::vector<std::string> drawing_programs(const Plan& plan) {
  std::vector<std::string> r;
  for (const PlanStep& s : plan.steps)
    if (s.op == Op::fused_elementwise && EwProgram::parse(s.attrs.s("program")).draws()) r.push_back(s.attrs.s("program"));
  return r;
}

TEST(FuseDropout, ProgramTextCarriesProbabilityAndStream) {
  const EwProgram p = EwProgram::parse("relu(i0);dropout[0.25,4294967295](t0)->t1");
  ASSERT_EQ(p.code.size(), 2u);
  EXPECT_EQ(p.code[1].op, Op::dropout);
  EXPECT_EQ(p.code[1].p, 0.25);
  EXPECT_EQ(p.code[1].stream, 4294967295u);
  EXPECT_TRUE(p.draws());
  EXPECT_EQ(EwProgram::parse(p.str()).str(), p.str());
  EXPECT_FALSE(EwProgram::parse("relu(i0)->t0").draws());
  for (const char* bad : {"dropout[0.5](i0)->t0", "dropout[0.5,x](i0)->t0", "dropout[1,2](i0)->t0",
                          "dropout[0.5,4294967296](i0)->t0"})
    EXPECT_THROW((void)EwProgram::parse(bad), Error) << bad;
}

// The chains the fusion is for: relu -> dropout between GEMMs, and dropout -> residual
// add -> layer norm after one; their gradients (dropout_grad with relu_grad, and with the
// bias gradient's sum) fuse as well.
struct Block {
  Graph g;
  Var loss, h;
  Block() {
    Var x = g.input("x", {6, 16});
    Var a = dropout(relu(nn::linear(x, 16, "fc1")), 0.3);
    h = dropout(nn::linear(a, 16, "fc2"), 0.2);
    Var y = nn::layer_norm(add(h, x), "ln");
    loss = sum(mul(y, g.input("r", {6, 16})));
  }
};

TEST(FuseDropout, FusedGroupsDrawTheMasksOfTheOpAlone) {
  for (Precision policy : {Precision::f32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(policy));
    Block b;
    // Bitwise at f32; through the bf16 policy within what its GEMMs' folded casts change
    // (as the other bf16 fusion tests): a wrong mask zeroes or rescales whole elements.
    const Plan plan = testing::expect_same_bits(b.g, b.loss, {b.h}, "block", policy,
                                                policy == Precision::f32 ? 0.0 : 2e-2);
    const auto programs = drawing_programs(plan);
    std::string all;
    for (const auto& p : programs) all += p + "\n";
    // Forward: the second dropout with the residual add and the norm (the first follows a
    // GEMM whose epilogue took the relu); backward: a dropout_grad with relu_grad.
    EXPECT_GE(programs.size(), 2u) << all << plan.str();
    EXPECT_NE(all.find("dropout[0.20000000000000001,"), std::string::npos) << all;
    EXPECT_NE(all.find("layer_norm"), std::string::npos) << all;
    EXPECT_NE(all.find("dropout_grad[0.29999999999999999,"), std::string::npos) << all;
    testing::expect_kernels_compile(plan);
  }
}

TEST(FuseDropout, ReluDropoutAndTheirGradientsAreOneKernelEach) {
  Graph g;
  Var x = g.param("x", {5, 33}, Init::uniform(-1, 1));  // 165 elements: no multiple of 4
  Var y = seam::tanh(dropout(relu(x), 0.4));
  const Plan plan = testing::expect_same_bits(g, sum(mul(y, g.input("r", {5, 33}))), {y}, "relu dropout");
  std::string all;
  for (const auto& p : drawing_programs(plan)) all += p + "\n";
  EXPECT_NE(all.find("relu(i0);dropout[0.40000000000000002,"), std::string::npos) << all;
  EXPECT_NE(all.find("dropout_grad[0.40000000000000002,"), std::string::npos) << all;
  testing::expect_kernels_compile(plan);
}

TEST(FuseDropout, EvaluationDropsNothingInsideAGroup) {
  // In evaluation the fused dropout keeps every element (p 0), as the op alone copies.
  Graph g;
  Var x = g.input("x", {4, 8});
  Var y = seam::tanh(dropout(relu(x), 0.5));
  Model m(g, {.seed = 1});
  Program fused = m.compile({.mode = Mode::eval, .outputs = {y.id()}});
  Program plain = m.compile({.mode = Mode::eval, .outputs = {y.id()}, .fuse = false});
  std::vector<float> xv(32);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>(i) * 0.25f - 4.f;
  for (Program* p : {&fused, &plain}) {
    p->set_input("x", std::as_bytes(std::span(xv)));
    p->run();
  }
  EXPECT_EQ(fused.read_as<float>(y.name()), plain.read_as<float>(y.name()));
  for (const std::string& s : drawing_programs(fused.plan())) EXPECT_NE(s.find("dropout[0,"), std::string::npos) << s;
}

}  // namespace
}  // namespace seam
