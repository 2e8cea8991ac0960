// Epilogue fusion: fused and unfused plans compute bitwise the same losses, gradients and
// updates on the CPU, the fused ops appear where the patterns allow, and nowhere else.
#include <gtest/gtest.h>

#include <random>

#include "fuse_check.h"
#include "passes/fuse.h"
#include "test_util.h"
#include "seam/seam.h"

using namespace seam;
using seam::testing::count;
using seam::testing::expect_same_bits;

namespace {

struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
  Plan plan;
};

// Three Adam steps on random data; returns losses and parameters.
Trained train(const Graph& g, Var loss, bool fuse, int64_t rows, int64_t dim,
              std::vector<std::string> recompute = {}, size_t memory_budget = 0) {
  Model m(g, {.seed = 3});
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-2), .fuse = fuse,
                         .recompute = std::move(recompute), .memory_budget = memory_budget});
  Trained r;
  r.plan = p.plan();
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0, 1);
  for (int s = 0; s < 3; ++s) {
    std::vector<float> x(static_cast<size_t>(rows * dim));
    std::vector<int32_t> y(static_cast<size_t>(rows));
    for (auto& v : x) v = nd(rng);
    for (auto& v : y) v = static_cast<int32_t>(rng() % 10);
    p.set_input("x", std::span<const float>(x));
    p.set_input("y", std::span<const int32_t>(y));
    p.run();
    r.losses.push_back(p.read_as<float>(loss.name())[0]);
  }
  for (ValueId id : g.params()) r.params.push_back(Program::cast_bytes<float>(m.read_param(g.value(id).name)));
  return r;
}

}  // namespace

TEST(Fuse, MlpFusesEveryLayerAndChangesNoBit) {
  Graph g;
  Var x = g.input("x", {32, 20});
  Var y = g.input("y", {32}, DType::i32);
  Var h = relu(nn::linear(x, 64, "fc1"));
  h = gelu(nn::linear(h, 48, "fc2"), /*tanh_approximation=*/true);
  h = relu(nn::linear(h, 40, "fc3"));
  Var loss = cross_entropy(nn::linear(h, 10, "fc4"), y);
  Trained fused = train(g, loss, true, 32, 20), plain = train(g, loss, false, 32, 20);
  EXPECT_EQ(count(fused.plan, Op::linear_act_aux), 3) << fused.plan.str();
  // fc1's input gradient is never needed; fc2..fc4's input gradients carry the derivative,
  // and each writes the bias gradient of the layer before it (bias_grads_into_act_grads):
  // only fc4's, whose output gradient is the loss's, stays with its weight gradient.
  EXPECT_EQ(count(fused.plan, Op::matmul_act_grad), 3) << fused.plan.str();
  int summed = 0;
  for (const PlanStep& s : fused.plan.steps) summed += s.op == Op::matmul_act_grad && s.out.size() == 2;
  EXPECT_EQ(summed, 3) << fused.plan.str();
  EXPECT_EQ(count(fused.plan, Op::linear_grad_weight_bias), 1) << fused.plan.str();
  EXPECT_EQ(count(fused.plan, Op::relu_grad) + count(fused.plan, Op::gelu_tanh_grad), 0);
  // The loss and its gradient: one op.
  EXPECT_EQ(count(fused.plan, Op::cross_entropy_with_grad), 1) << fused.plan.str();
  EXPECT_EQ(count(fused.plan, Op::cross_entropy) + count(fused.plan, Op::cross_entropy_grad), 0);
  EXPECT_EQ(count(plain.plan, Op::cross_entropy_with_grad), 0);
  EXPECT_LT(fused.plan.steps.size(), plain.plan.steps.size());
  EXPECT_EQ(fused.losses, plain.losses);
  EXPECT_EQ(fused.params, plain.params);
}

// GELU recomputed in the backward (CompileOptions::recompute): the same bits as kept, fused
// (from the epilogue's record) or not (from the op's input; the erf GELU always), and less
// arena: the GELU outputs no longer live from the forward to the backward.
TEST(Fuse, RecomputedGeluChangesNoBitAndShrinksTheArena) {
  Graph g;
  Var x = g.input("x", {32, 20});
  Var y = g.input("y", {32}, DType::i32);
  Var h = gelu(nn::linear(x, 64, "fc1"), /*tanh_approximation=*/true);
  h = gelu(nn::linear(h, 96, "fc2"));  // erf: no epilogue takes it, recomputed from its input
  Var loss = cross_entropy(nn::linear(h, 10, "fc3"), y);
  for (bool fuse : {true, false}) {
    SCOPED_TRACE(fuse ? "fused" : "unfused");
    Trained kept = train(g, loss, fuse, 32, 20), again = train(g, loss, fuse, 32, 20, {"gelu"});
    int recomputed = 0;
    for (const PlanStep& st : again.plan.steps) recomputed += st.name.find("/recompute") != std::string::npos;
    EXPECT_EQ(recomputed, 2) << again.plan.str();  // each GELU output, for its weight gradient
    EXPECT_LT(again.plan.arena_bytes, kept.plan.arena_bytes);
    EXPECT_EQ(again.losses, kept.losses);
    EXPECT_EQ(again.params, kept.params);
  }
  Model m(g, {.seed = 3});
  try {
    m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-2), .recompute = {"softmax"}});
    ADD_FAILURE() << "no seam::Error thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recompute: unknown activation 'softmax' (known: gelu, layer_norm)"), std::string::npos)
        << e.what();
  }
}

// Pre-norm residual blocks (layer norm, a GELU MLP, a residual add): the layer norms'
// outputs feed weight gradients, so the backward may recompute them as well as the GELUs'.
struct NormBlocks {
  Graph g;
  Var loss;
  NormBlocks() {
    Var x = g.input("x", {32, 20});
    Var y = g.input("y", {32}, DType::i32);
    Var h = nn::linear(x, 48, "in");
    for (int b = 0; b < 3; ++b) {
      const std::string n = "b" + std::to_string(b);
      Var u = gelu(nn::linear(nn::layer_norm(h, n + ".ln"), 96, n + ".fc"), /*tanh_approximation=*/true);
      h = add(h, nn::linear(u, 48, n + ".proj"));
    }
    loss = cross_entropy(nn::linear(nn::layer_norm(h, "ln_f"), 10, "head"), y);
  }
};

TEST(Fuse, RecomputedLayerNormsChangeNoBitAndShrinkTheArena) {
  NormBlocks m;
  for (bool fuse : {true, false}) {
    SCOPED_TRACE(fuse ? "fused" : "unfused");
    Trained kept = train(m.g, m.loss, fuse, 32, 20), again = train(m.g, m.loss, fuse, 32, 20, {"layer_norm"});
    int recomputed = 0;
    for (const PlanStep& st : again.plan.steps)
      recomputed += st.op == Op::layer_norm && st.name.find("/recompute") != std::string::npos;
    EXPECT_EQ(recomputed, 4) << again.plan.str();  // three blocks' and the final one, for their weight gradients
    EXPECT_LT(again.plan.arena_bytes, kept.plan.arena_bytes);
    EXPECT_EQ(again.losses, kept.losses);
    EXPECT_EQ(again.params, kept.params);
  }
}

// Layer norm gradients taken from the norms' outputs (norm_grads_from_outputs).
int from_outputs(const Plan& p) {
  int n = 0;
  for (const PlanStep& st : p.steps) n += st.op == Op::layer_norm_grad && st.attrs.i("from_output") == 1;
  return n;
}

// A memory budget: nothing changed where the step fits; where it does not, layer norm
// gradients from the norms' outputs first, then GELU outputs and then layer norm outputs
// recomputed, the fewest that fit, and the same bits as without the recomputation; an
// error that names the step's least where nothing fits.
TEST(Fuse, AMemoryBudgetRecomputesTheFewestOutputsThatFit) {
  NormBlocks m;
  Model model(m.g, {.seed = 3});
  auto compile = [&](size_t budget) {
    return model.compile({.loss = m.loss.id(), .optimizer = OptimizerConfig::adam(1e-2), .memory_budget = budget});
  };
  const Plan plain = compile(0).plan();
  const size_t own = model.device_bytes();  // with the moments the first program made
  const Plan all = compile(own + 100000000).plan();
  EXPECT_EQ(all.arena_bytes, plain.arena_bytes);
  EXPECT_NE(all.budget_note.find("the model's buffers and the arena take"), std::string::npos) << all.budget_note;
  EXPECT_EQ(all.budget_note.find("recomputing"), std::string::npos) << all.budget_note;
  const Plan exact = compile(own + plain.arena_bytes).plan();
  EXPECT_EQ(exact.arena_bytes, plain.arena_bytes);
  EXPECT_EQ(from_outputs(exact), 0);
  // A model's first program counts the moments and working copies it is about to make.
  for (size_t less : {size_t{0}, size_t{1}}) {
    Model fresh(m.g, {.seed = 3, .precision = Precision::bf16});
    Model sized(m.g, {.seed = 3, .precision = Precision::bf16});
    const size_t arena =
        sized.compile({.loss = m.loss.id(), .optimizer = OptimizerConfig::adam(1e-2)}).plan().arena_bytes;
    const Plan p = fresh.compile({.loss = m.loss.id(), .optimizer = OptimizerConfig::adam(1e-2),
                                  .memory_budget = sized.device_bytes() + arena - less}).plan();
    EXPECT_EQ(from_outputs(p) > 0, less == 1) << p.budget_note;
    EXPECT_EQ(p.budget_note.find("recomputing"), std::string::npos) << p.budget_note;
  }
  // The norms' gradients from their outputs alone; below that, recomputation.
  const size_t just_under = own + plain.arena_bytes - 1;
  const Plan from = compile(just_under).plan();
  EXPECT_EQ(from.budget_note.find("recomputing"), std::string::npos) << from.budget_note;
  const Plan most = model.compile({.loss = m.loss.id(), .optimizer = OptimizerConfig::adam(1e-2),
                                   .recompute = {"gelu", "layer_norm"}}).plan();
  ASSERT_LT(most.arena_bytes, from.arena_bytes);
  int fitted = 0;
  for (size_t arena = most.arena_bytes; arena < from.arena_bytes; arena += (from.arena_bytes - most.arena_bytes) / 5) {
    SCOPED_TRACE("budget: the model's own bytes + " + std::to_string(arena));
    const Plan p = compile(own + arena).plan();
    EXPECT_LE(p.arena_bytes, arena) << p.budget_note;
    EXPECT_NE(p.budget_note.find("recomputing"), std::string::npos) << p.budget_note;
    EXPECT_EQ(from_outputs(p), 4) << p.budget_note;
    ++fitted;
  }
  EXPECT_GE(fitted, 5);
  // A budget between: GELUs go first; the bits are those without recomputation.
  const size_t mid = own + (most.arena_bytes + from.arena_bytes) / 2;
  const Plan p = compile(mid).plan();
  EXPECT_NE(p.budget_note.find(" gelu"), std::string::npos) << p.budget_note;
  EXPECT_LE(own + p.arena_bytes, mid);
  const Trained kept = train(m.g, m.loss, true, 32, 20, {}, just_under);
  const Trained within = train(m.g, m.loss, true, 32, 20, {}, mid);
  EXPECT_EQ(within.plan.arena_bytes, p.arena_bytes);
  EXPECT_EQ(within.losses, kept.losses);
  EXPECT_EQ(within.params, kept.params);
  // Too small for the step even with everything recomputed: the error counts what could be,
  // by kind; below the model's own buffers it says that instead.
  const std::string e = seam::testing::error_of([&] { compile(own + 1); });
  EXPECT_NE(e.find("compile: memory budget of "), std::string::npos) << e;
  EXPECT_NE(e.find("even with every output the backward could compute again recomputed ("), std::string::npos) << e;
  EXPECT_NE(e.find(" gelu"), std::string::npos) << e;
  const std::string below = seam::testing::error_of([&] { compile(own / 2); });
  EXPECT_NE(below.find("the model's own buffers"), std::string::npos) << below;
  // The note's and the error's counts: each kind once, in name order.
  EXPECT_EQ(count_kinds({"layer_norm", "gelu", "gelu"}), "2 gelu, 1 layer_norm");
  EXPECT_EQ(count_kinds({}), "");
}

// A step over its memory budget takes layer norm's gradients from the norms' outputs
// first (norm_grads_from_outputs): their inputs are not kept, nothing is recomputed, and
// training follows the plain step's to f32's rounding (xhat from y, not from x). A step
// within its budget keeps its plain backward.
TEST(Fuse, AMemoryBudgetTakesLayerNormGradientsFromTheirOutputsFirst) {
  NormBlocks m;
  Model model(m.g, {.seed = 3});
  const Plan plain = model.compile({.loss = m.loss.id(), .optimizer = OptimizerConfig::adam(1e-2)}).plan();
  const size_t own = model.device_bytes(), budget = own + plain.arena_bytes - 1;
  const Trained kept = train(m.g, m.loss, true, 32, 20), within = train(m.g, m.loss, true, 32, 20, {}, budget);
  EXPECT_EQ(from_outputs(kept.plan), 0);
  EXPECT_EQ(from_outputs(within.plan), 4) << within.plan.str();  // three blocks' and the final one
  EXPECT_NE(within.plan.budget_note.find("4 layer norm gradients from their outputs"), std::string::npos)
      << within.plan.budget_note;
  EXPECT_EQ(within.plan.budget_note.find("recomputing"), std::string::npos) << within.plan.budget_note;
  EXPECT_LT(within.plan.arena_bytes, plain.arena_bytes);
  for (size_t i = 0; i < kept.losses.size(); ++i) EXPECT_NEAR(within.losses[i], kept.losses[i], 1e-5);
  for (size_t i = 0; i < kept.params.size(); ++i)
    for (size_t j = 0; j < kept.params[i].size(); ++j)
      ASSERT_NEAR(within.params[i][j], kept.params[i][j], 1e-4) << "parameter " << i << " value " << j;
  // Asked to recompute layer norm outputs, the budget keeps the backward from the inputs.
  const Plan asked = model.compile({.loss = m.loss.id(), .optimizer = OptimizerConfig::adam(1e-2),
                                    .recompute = {"layer_norm"}, .memory_budget = budget}).plan();
  EXPECT_EQ(from_outputs(asked), 0);
}

// The fused loss keeps ignore_index and label smoothing, and is made only where the
// incoming gradient exists when the forward runs.
TEST(Fuse, CrossEntropyFusesWhereItsGradientIsReadyAndChangesNoBit) {
  for (bool scaled : {false, true}) {
    SCOPED_TRACE(scaled ? "loss = 0.5 * ce + 0.1 * sum(h)" : "loss = ce");
    Graph g;
    Var x = g.input("x", {32, 20});
    Var y = g.input("y", {32}, DType::i32);
    Var h = nn::linear(x, 10, "fc");
    Var ce = cross_entropy(h, y, /*ignore_index=*/7, /*label_smoothing=*/0.1);
    // Scaled, the loss's gradient reaches cross_entropy_grad through nodes that read the
    // seed after the forward: the pair cannot be one op there.
    Var loss = scaled ? add(scale(ce, 0.5), scale(sum(h), 0.1)) : ce;
    Trained fused = train(g, loss, true, 32, 20), plain = train(g, loss, false, 32, 20);
    EXPECT_EQ(count(fused.plan, Op::cross_entropy_with_grad), scaled ? 0 : 1) << fused.plan.str();
    EXPECT_EQ(fused.losses, plain.losses);
    EXPECT_EQ(fused.params, plain.params);
    for (auto& s : fused.plan.steps)
      if (s.op == Op::cross_entropy_with_grad) {
        EXPECT_EQ(s.attrs.i("ignore_index"), 7);
        EXPECT_DOUBLE_EQ(s.attrs.f("label_smoothing"), 0.1);
      }
  }
}

TEST(Fuse, BatchedInputFusesThroughReshapes) {
  Graph g;
  Var x = g.input("x", {4, 8, 16});
  Var y = g.input("y", {4, 8}, DType::i32);
  Var h = gelu(nn::linear(x, 32, "fc1"), true);
  h = gelu(nn::linear(h, 24, "fc2"), true);
  Var loss = cross_entropy(nn::linear(h, 10, "fc3"), y);
  Trained fused = train(g, loss, true, 32, 16), plain = train(g, loss, false, 32, 16);
  EXPECT_EQ(count(fused.plan, Op::matmul_act_grad), 2) << fused.plan.str();
  EXPECT_EQ(fused.losses, plain.losses);
  EXPECT_EQ(fused.params, plain.params);
}

TEST(Fuse, LeavesUnfusableShapesAndSharedValuesAlone) {
  Graph g;
  Var x = g.input("x", {16, 12});
  Var y = g.input("y", {16}, DType::i32);
  Var a = nn::linear(x, 12, "fc1");  // used twice: by relu and by the residual add
  Var h = relu(a) + a;
  Var b = gelu(nn::linear(h, 13, "fc2"), true);  // 13 % 8 != 0: no gelu record possible
  Var c = relu(nn::linear(b, 16, "fc3"));
  Var d = sigmoid(c) + c;  // relu's gradient gets a sum, not a plain GEMM
  Var loss = cross_entropy(nn::linear(d, 10, "fc4"), y);
  Trained fused = train(g, loss, true, 16, 12), plain = train(g, loss, false, 16, 12);
  EXPECT_EQ(count(fused.plan, Op::linear_act_aux), 0) << fused.plan.str();
  EXPECT_EQ(count(fused.plan, Op::linear_act), 1) << fused.plan.str();  // fc3 forward only
  EXPECT_EQ(count(fused.plan, Op::matmul_act_grad), 0);
  EXPECT_EQ(fused.losses, plain.losses);
  EXPECT_EQ(fused.params, plain.params);
}

TEST(Fuse, EvaluationPlansFuseWithoutRecords) {
  Graph g;
  Var x = g.input("x", {8, 20});
  Var out = nn::linear(relu(nn::linear(x, 16, "fc1")), 4, "fc2");
  Model m(g);
  Program p = m.compile({.mode = Mode::eval, .outputs = {out.id()}});
  EXPECT_EQ(count(p.plan(), Op::linear_act), 1);
  EXPECT_EQ(count(p.plan(), Op::linear_act_aux), 0);
}

namespace {

// Logits [rows, 16] of which the first 10 columns are classes: the slice, the loss, its
// gradient and the training accuracy's argmax, as nn::gpt's padded vocabulary makes them.
struct PaddedRun {
  std::vector<float> losses;
  std::vector<std::vector<int32_t>> predictions;
  std::vector<std::vector<float>> params;
  Plan plan;
};

// read_slice: the sliced logits are an output too, which keeps the slice (and the loss
// on it) while every other fusion happens.
PaddedRun train_padded(Precision policy, bool fuse, bool read_slice, const std::vector<int32_t>& extra_labels = {}) {
  Graph g;
  Var x = g.input("x", {4, 6, 12});
  Var y = g.input("y", {4, 6}, DType::i32);
  Var logits = slice(nn::linear(x, 16, "head"), 2, 0, 10);
  Var loss = cross_entropy(logits, y, -100, 0.1);
  Var pred = argmax(logits);
  Model m(g, {.seed = 3, .precision = policy});
  std::vector<ValueId> outputs{pred.id()};
  if (read_slice) outputs.push_back(logits.id());
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-2), .outputs = outputs, .fuse = fuse});
  PaddedRun r;
  r.plan = p.plan();
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0, 1);
  for (int s = 0; s < 3; ++s) {
    std::vector<float> xs(4 * 6 * 12);
    std::vector<int32_t> ys(4 * 6);
    for (auto& v : xs) v = nd(rng);
    for (auto& v : ys) v = static_cast<int32_t>(rng() % 10);
    ys[3] = -100;
    for (size_t i = 0; i < extra_labels.size(); ++i) ys[i] = extra_labels[i];
    p.set_input("x", std::span<const float>(xs));
    p.set_input("y", std::span<const int32_t>(ys));
    p.run();
    r.losses.push_back(p.read_as<float>(loss.name())[0]);
    r.predictions.push_back(p.read_as<int32_t>(pred.name()));
  }
  for (ValueId id : g.params()) r.params.push_back(Program::cast_bytes<float>(m.read_param(g.value(id).name)));
  return r;
}

}  // namespace

// The loss, its gradient and argmax read the padded logits with classes = 10: no slice
// and no slice_grad left, the same bits as the sliced plan with the same other fusions
// (and at f32 as the unfused plan; at bf16 folding the gradient's cast into the loss
// skips a rounding, as everywhere).
TEST(Fuse, PaddedClassesAreReadInPlaceAndChangeNoBit) {
  for (Precision policy : {Precision::f32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(policy));
    PaddedRun fused = train_padded(policy, true, false), sliced = train_padded(policy, true, true);
    EXPECT_EQ(count(fused.plan, Op::slice) + count(fused.plan, Op::slice_grad), 0) << fused.plan.str();
    EXPECT_EQ(count(sliced.plan, Op::slice), 1);
    EXPECT_EQ(count(fused.plan, Op::cross_entropy_with_grad), 1);
    for (auto& s : fused.plan.steps)
      if (s.op == Op::cross_entropy_with_grad || s.op == Op::argmax) EXPECT_EQ(s.attrs.i("classes"), 10);
    EXPECT_EQ(fused.losses, sliced.losses);
    EXPECT_EQ(fused.predictions, sliced.predictions);
    EXPECT_EQ(fused.params, sliced.params);
    if (policy == Precision::f32) {
      PaddedRun plain = train_padded(policy, false, false);
      EXPECT_EQ(fused.losses, plain.losses);
      EXPECT_EQ(fused.predictions, plain.predictions);
      EXPECT_EQ(fused.params, plain.params);
    }
  }
}

// A label among the padding columns is no class: the same error as the sliced plan's.
TEST(Fuse, PaddedClassesRefuseALabelInThePadding) {
  try {
    train_padded(Precision::f32, true, false, {12});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 12 of row 0 is outside [0, 10)"), std::string::npos) << e.what();
  }
}

// A slice that something else reads (here a requested output) stays, and so does the loss's.
TEST(Fuse, PaddedClassesStayWhereTheSliceIsReadElsewhere) {
  Graph g;
  Var x = g.input("x", {8, 12});
  Var y = g.input("y", {8}, DType::i32);
  Var logits = slice(nn::linear(x, 16, "head"), 1, 0, 10);
  Var loss = cross_entropy(logits, y);
  Model m(g, {.seed = 3});
  Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {logits.id()}});
  EXPECT_EQ(count(p.plan(), Op::slice), 1) << p.plan().str();
  for (auto& s : p.plan().steps)
    if (s.op == Op::cross_entropy_with_grad) EXPECT_EQ(s.attrs.i("classes"), 0);
}

// Attention scores as an exporter writes them, q k^T with k transposed by a permute of
// its last two dims: the matmul reads k in place (transpose_b), in the forward and in the
// backward, and no transpose step is left; values and gradients as unfused.
TEST(Fuse, TransposesOfTheLastTwoDimsFoldIntoMatmuls) {
  Graph g;
  Var q = g.param("q", {2, 3, 5, 4}, Init::uniform(-1, 1));
  Var k = g.param("k", {2, 3, 6, 4}, Init::uniform(-1, 1));
  Var v = g.param("v", {2, 3, 6, 4}, Init::uniform(-1, 1));
  Var p = softmax(matmul(q, permute(k, {0, 1, 3, 2})), -1);
  Var out = matmul(p, v);
  Var loss = sum(mul(out, g.input("r", {2, 3, 5, 4})));
  const Plan plan = expect_same_bits(g, loss, {out}, "folded transposes", Precision::f32, 1e-5);
  EXPECT_EQ(count(plan, Op::transpose), 0) << plan.str();
  // A transpose that also has another reader stays for it, and the matmul still folds it.
  Graph h;
  Var a = h.param("a", {4, 6}, Init::uniform(-1, 1)), b = h.param("b", {5, 6}, Init::uniform(-1, 1));
  Var bt = permute(b, {1, 0});
  Var both = add(sum(matmul(a, bt)), sum(exp(bt)));
  const Plan kept = expect_same_bits(h, both, {}, "a transpose read elsewhere too", Precision::f32, 1e-5);
  // Both stay: the forward one for exp, and the gradient's, of a sum (not a matmul).
  EXPECT_EQ(count(kept, Op::transpose), 2) << kept.str();
}

namespace {

struct Counted {
  std::vector<float> losses;
  std::vector<int32_t> correct;
  Plan plan;
};

// Padded logits (the slice absorbed too), a loss and count_equal(argmax(logits), y), the
// count read as an output: three Adam steps.
Counted train_counting(bool fuse, int64_t ignore_index, bool read_predictions) {
  Graph g;
  Var x = g.input("x", {4, 6, 12});
  Var y = g.input("y", {4, 6}, DType::i32);
  Var logits = slice(nn::linear(x, 16, "head"), 2, 0, 10);
  Var loss = cross_entropy(logits, y, ignore_index);
  Var pred = argmax(logits);
  Var correct = count_equal(pred, y);
  Model m(g, {.seed = 5});
  std::vector<ValueId> outputs{correct.id()};
  if (read_predictions) outputs.push_back(pred.id());
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(5e-2), .outputs = outputs, .fuse = fuse});
  Counted r;
  r.plan = p.plan();
  std::mt19937_64 rng(2);
  std::normal_distribution<float> nd(0, 1);
  for (int s = 0; s < 3; ++s) {
    std::vector<float> xs(4 * 6 * 12);
    std::vector<int32_t> ys(4 * 6);
    for (auto& v : xs) v = nd(rng);
    for (auto& v : ys) v = static_cast<int32_t>(rng() % 3);  // few classes: many rows right
    ys[3] = static_cast<int32_t>(ignore_index);
    p.set_input("x", std::span<const float>(xs));
    p.set_input("y", std::span<const int32_t>(ys));
    p.run();
    r.losses.push_back(p.read_as<float>(loss.name())[0]);
    r.correct.push_back(p.read_as<int32_t>(correct.name())[0]);
  }
  return r;
}

}  // namespace

// The training accuracy's count folds into the fused loss, which finds each row's argmax
// in the pass that writes its gradient: no argmax step reads the logits again. Counts and
// losses as unfused; not where the predictions are asked for, nor where ignored rows'
// labels could be classes (ignore_index >= 0: count_equal counts those rows, the loss
// skips them).
TEST(Fuse, TheLossCountsTheRowsItsArgmaxGetsRight) {
  const Counted fused = train_counting(true, -100, false), plain = train_counting(false, -100, false);
  EXPECT_EQ(count(fused.plan, Op::argmax) + count(fused.plan, Op::count_equal), 0) << fused.plan.str();
  int counting = 0;
  for (const PlanStep& s : fused.plan.steps)
    counting += s.op == Op::cross_entropy_with_grad && s.attrs.i("count_correct") == 1 && s.out.size() == 3;
  EXPECT_EQ(counting, 1) << fused.plan.str();
  EXPECT_EQ(fused.losses, plain.losses);
  EXPECT_EQ(fused.correct, plain.correct);
  EXPECT_GT(fused.correct.back(), 0);
  for (bool read : {false, true}) {
    const Counted kept = train_counting(true, read ? -100 : 2, read);
    EXPECT_EQ(count(kept.plan, Op::argmax), 1) << kept.plan.str();
    EXPECT_EQ(count(kept.plan, Op::cross_entropy_with_grad), 1);
    EXPECT_EQ(kept.correct, train_counting(false, read ? -100 : 2, read).correct);
  }
}

// The fused loss's gradient takes the logits' buffer where no later step reads them (one
// buffer of logits less: 1.6 GB at GPT-2's vocabulary and batch), not where the
// predictions are read after it. Values as unfused either way (above).
TEST(Fuse, TheLossGradientIsWrittenOverLogitsNothingReadsLater) {
  for (bool read : {false, true}) {
    SCOPED_TRACE(read ? "predictions read" : "only the loss reads the logits");
    const Plan plan = train_counting(true, -100, read).plan;
    int fused = 0;
    for (const PlanStep& s : plan.steps) {
      if (s.op != Op::cross_entropy_with_grad) continue;
      ++fused;
      EXPECT_EQ(s.out[1].region, Region::arena);
      EXPECT_EQ(s.out[1].offset == s.in[0].offset, !read) << plan.str();
    }
    EXPECT_EQ(fused, 1);
  }
}

// count_correct is a flag: any other value is refused by name, and 1 gives the count.
TEST(Fuse, CountCorrectIsZeroOrOne) {
  Graph g;
  Var z = g.input("z", {4, 10});
  Var y = g.input("y", {4}, DType::i32);
  Var dy = g.input("dy", {});
  auto with = [&](int64_t flag) {
    return seam::testing::error_of(
        [&] { g.add(Op::cross_entropy_with_grad, {z.id(), y.id(), dy.id()}, {{"count_correct", flag}}); });
  };
  EXPECT_NE(with(2).find("count_correct must be 0 or 1, got 2"), std::string::npos) << with(2);
  EXPECT_EQ(with(1), "");
  EXPECT_EQ(g.add(Op::cross_entropy_with_grad, {z.id(), y.id(), dy.id()}, {{"count_correct", int64_t{1}}}).size(), 3u);
}

// Residual adds into the GEMMs that make one of their operands (linear_add): either
// order, through a reshape of the GEMM's output, with and without a bias; not where
// another node reads the GEMM's output, nor where the add broadcasts. The same bits
// (values, gradients, training) as unfused at f32; with bf16 storage within a rounding
// (the sum is rounded once, where unfused the GEMM's output was rounded before the add).
TEST(Fuse, ResidualAddsIntoLinearsChangeNoBit) {
  Graph g;
  Var x = g.input("x", {4, 6, 12});
  Var y = g.input("y", {24}, DType::i32);
  Var h = tanh(nn::linear(x, 16, "in"));
  h = add(h, nn::linear(h, 16, "a"));  // [4, 6, 16], the residual first
  Var flat = reshape(h, {24, 16});
  h = add(reshape(nn::linear(flat, 16, "b", /*bias=*/false), {4, 6, 16}), h);  // through a view, no bias
  Var c = nn::linear(h, 16, "c");
  Var twice = add(h, c);  // c is also read below: stays a linear and an add
  Var wide = add(nn::linear(twice, 16, "d"), g.param("shift", {16}, Init::zeros()));  // broadcast: not fused
  Var out = add(wide, tanh(c));
  for (Precision p : {Precision::f32, Precision::bf16}) {
    SCOPED_TRACE(p == Precision::f32 ? "f32" : "bf16");
    Graph h2 = g;
    Var l2 = sum(mul(h2.var(out.id()), h2.input("r", {4, 6, 16})));
    const Plan plan =
        expect_same_bits(h2, l2, {h2.var(twice.id())}, "residual adds", p, p == Precision::f32 ? 0.0 : 6e-2);
    EXPECT_EQ(count(plan, Op::linear_add), 2) << plan.str();
    EXPECT_EQ(count(plan, Op::linear), 3) << plan.str();  // in, c, d
  }
  Var loss = cross_entropy(reshape(out, {24, 16}), y);
  Trained fused = train(g, loss, true, 24, 12), plain = train(g, loss, false, 24, 12);
  EXPECT_EQ(fused.losses, plain.losses);
  EXPECT_EQ(fused.params, plain.params);
}

TEST(Fuse, LinearAddChecksItsResidual) {
  Graph g;
  Var x = g.input("x", {5, 4});
  Var w = g.param("w", {3, 4}, Init::zeros());
  EXPECT_EQ(g.value(g.add(Op::linear_add, {x.id(), w.id(), g.input("r", {5, 3}).id()})[0]).type,
            (TensorType{DType::f32, {5, 3}}));
  const std::string e =
      seam::testing::error_of([&] { g.add(Op::linear_add, {x.id(), w.id(), g.input("r2", {5, 4}).id()}); });
  EXPECT_NE(e.find("r must have y's shape [5,3], got [5,4]"), std::string::npos) << e;
}

// matmul_act_grad's dx_sums takes 0 or 1; with 1 a second output, dx's column sums, in
// sums_dtype (dx's when empty); a bf16 plan with f32 master weights has them in f32, the
// dtype its weight gradients take.
TEST(Fuse, ActivationGradientsSumTheirColumnsOnAFlag) {
  Graph g;
  Var dy = g.input("dy", {4, 6}), w = g.input("w", {6, 5}), pre = g.input("pre", {4, 5});
  const std::vector<ValueId> in{dy.id(), w.id(), pre.id()};
  const Attrs act{{"act", std::string("gelu_tanh")}};
  EXPECT_EQ(g.add(Op::matmul_act_grad, in, act).size(), 1u);
  Attrs sums = act;
  sums.set("dx_sums", int64_t{1});
  auto out = g.add(Op::matmul_act_grad, in, sums);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(g.value(out[1]).type, (TensorType{DType::f32, {5}}));
  sums.set("sums_dtype", std::string("f64"));
  EXPECT_EQ(g.value(g.add(Op::matmul_act_grad, in, sums)[1]).type, (TensorType{DType::f64, {5}}));
  sums.set("sums_dtype", std::string("i32"));
  EXPECT_NE(seam::testing::error_of([&] { g.add(Op::matmul_act_grad, in, sums); })
                .find("sums_dtype must name a float dtype, got 'i32'"),
            std::string::npos);
  Attrs two = act;
  two.set("dx_sums", int64_t{2});
  EXPECT_NE(seam::testing::error_of([&] { g.add(Op::matmul_act_grad, in, two); }).find("dx_sums must be 0 or 1, got 2"),
            std::string::npos);

  // Rows in two dimensions, as a transformer's MLP has them: dx reaches fc1's weight
  // gradient through reshapes.
  Graph net;
  Var x = net.input("x", {2, 8, 12});
  Var y = net.input("y", {16}, DType::i32);
  Var loss = cross_entropy(reshape(nn::linear(gelu(nn::linear(x, 24, "fc1"), true), 10, "fc2"), {16, 10}), y);
  Model low(net, {.seed = 5, .precision = Precision::bf16});
  const Plan plan = low.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-3)}).plan();
  int summed = 0;
  for (const PlanStep& s : plan.steps)
    if (s.op == Op::matmul_act_grad && s.out.size() == 2) {
      EXPECT_EQ(s.out[0].type.dtype, DType::bf16);
      EXPECT_EQ(s.out[1].type.dtype, DType::f32);
      ++summed;
    }
  EXPECT_EQ(summed, 1) << plan.str();
  EXPECT_EQ(count(plan, Op::linear_grad_weight_bias), 1) << plan.str();  // fc2's, from the loss's gradient
}

// linear_grad_input_bias: dy [M, N] and w [N, K] of one float dtype give dx [M, K] in
// theirs and db [N] in sums_dtype (theirs when empty); anything else is refused by name.
TEST(Fuse, LinearGradInputBiasChecksItsOperands) {
  Graph g;
  Var dy = g.input("dy", {4, 6}), w = g.input("w", {6, 5});
  auto with = [&](Var b, const std::string& sums) {
    return g.add(Op::linear_grad_input_bias, {dy.id(), b.id()}, {{"sums_dtype", sums}});
  };
  auto out = with(w, "");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(g.value(out[0]).type, (TensorType{DType::f32, {4, 5}}));
  EXPECT_EQ(g.value(out[1]).type, (TensorType{DType::f32, {6}}));
  EXPECT_EQ(g.value(with(w, "f64")[1]).type, (TensorType{DType::f64, {6}}));
  auto error = [&](Var b, const std::string& sums) { return seam::testing::error_of([&] { with(b, sums); }); };
  const std::string bad = error(w, "i32"), apart = error(g.input("w2", {5, 6}), ""),
                    mixed = error(g.input("w3", {6, 5}, DType::f64), "");
  EXPECT_NE(bad.find("sums_dtype must name a float dtype, got 'i32'"), std::string::npos) << bad;
  EXPECT_NE(apart.find("dy [M, N] and w [N, K] do not chain"), std::string::npos) << apart;
  EXPECT_NE(mixed.find("dy and w differ in dtype: f32 and f64"), std::string::npos) << mixed;
}

// A bias gradient that neither an activation's gradient nor a layer norm's takes (fc2's:
// its output gradient is the loss's, its input gradient a plain GEMM before tanh's
// derivative) comes from that input gradient's GEMM (bias_grads_into_data_grads), and the
// weight gradient is a plain GEMM; fc1, whose input gradient nothing needs, keeps
// linear_grad_weight_bias. The same bits as unfused; under bf16, db in f32 as dw.
TEST(Fuse, BiasGradientsFromDataGradientsChangeNoBit) {
  Graph g;
  Var x = g.input("x", {32, 20});
  Var y = g.input("y", {32}, DType::i32);
  Var loss = cross_entropy(nn::linear(tanh(nn::linear(x, 24, "fc1")), 10, "fc2"), y);
  Trained fused = train(g, loss, true, 32, 20), plain = train(g, loss, false, 32, 20);
  EXPECT_EQ(count(fused.plan, Op::linear_grad_input_bias), 1) << fused.plan.str();
  EXPECT_EQ(count(fused.plan, Op::linear_grad_weight_bias), 1) << fused.plan.str();
  for (const PlanStep& s : fused.plan.steps) {
    if (s.op == Op::linear_grad_input_bias) {
      EXPECT_EQ(s.out[0].type, (TensorType{DType::f32, {32, 24}}));
      EXPECT_EQ(s.out[1].type, (TensorType{DType::f32, {10}}));
    }
    if (s.op == Op::linear_grad_weight_bias) {
      EXPECT_EQ(s.out[0].type, (TensorType{DType::f32, {24, 20}}));  // fc1's
    }
  }
  EXPECT_EQ(count(plain.plan, Op::linear_grad_input_bias), 0);
  EXPECT_EQ(count(plain.plan, Op::linear_grad_weight_bias), 2);
  EXPECT_EQ(fused.losses, plain.losses);
  EXPECT_EQ(fused.params, plain.params);

  Model low(g, {.seed = 5, .precision = Precision::bf16});
  const Plan plan = low.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-3)}).plan();
  int summed = 0;
  for (const PlanStep& s : plan.steps)
    if (s.op == Op::linear_grad_input_bias) {
      EXPECT_EQ(s.out[0].type.dtype, DType::bf16);
      EXPECT_EQ(s.out[1].type.dtype, DType::f32);
      ++summed;
    }
  EXPECT_EQ(summed, 1) << plan.str();
}

// The input gradient's matmul may come after the weight gradient: db then moves to the
// matmul's place, where nothing before it reads db; where something does, the pair is
// left alone. Values as the graph's.
TEST(Fuse, BiasGradientsMoveToALaterDataGradientOnlyPastNoReader) {
  for (bool read_between : {false, true}) {
    SCOPED_TRACE(read_between ? "db read before the matmul" : "db read after the matmul only");
    Graph g;
    Var dy = g.input("dy", {8, 6}), x = g.input("x", {8, 5}), w = g.input("w", {6, 5});
    const auto wb = g.add(Op::linear_grad_weight_bias, {dy.id(), x.id()});
    Var db = g.var(wb[1]);
    Var early = read_between ? scale(db, 2.0) : db;
    Var dx = matmul(dy, w);
    Var late = add(scale(db, 3.0), early);
    const FuseResult r = bias_grads_into_data_grads(g, {});
    EXPECT_EQ(r.backward, read_between ? 0 : 1);
    int fused = -1, dw = -1;
    for (int k = 0; k < static_cast<int>(r.graph.nodes().size()); ++k) {
      const Node& n = r.graph.node(k);
      if (n.op == Op::linear_grad_input_bias) fused = k;
      if (n.op == Op::matmul && n.attrs.i("transpose_a") == 1) dw = k;
    }
    if (!read_between) {
      ASSERT_GE(fused, 0);
      EXPECT_LT(dw, fused);  // each at its own node's place
    }
    // Both graphs unfused, on the same inputs: the same bits.
    std::vector<std::vector<std::byte>> got[2];
    for (int i = 0; i < 2; ++i) {
      const Graph& h = i ? r.graph : g;
      std::vector<ValueId> outs;
      for (Var v : {dx, g.var(wb[0]), late}) outs.push_back(i ? r.map[static_cast<size_t>(v.id())] : v.id());
      Model m(h);
      Program p = m.compile({.mode = Mode::eval, .outputs = outs, .fuse = false});
      uint64_t seed = 7;
      for (const char* in : {"dy", "x", "w"}) {
        const auto v = seam::testing::random_floats(static_cast<size_t>(h.value(*h.find(in)).type.numel()), seed++);
        p.set_input(in, std::span<const float>(v));
      }
      p.run();
      for (ValueId v : outs) got[i].push_back(p.read(h.value(v).name));
    }
    EXPECT_EQ(got[0], got[1]);
  }
}

// In a GPT without dropout every bias gradient comes from an op that reads or writes its
// dy anyway: the residual projections' from layer norms' gradients, the MLP's first
// layer's from DGELU's, the qkv projection's from its input gradient's GEMM. No
// linear_grad_weight_bias is left.
TEST(Fuse, EveryGptBiasGradientComesFromAnOpOnItsDy) {
  Graph g;
  nn::GptConfig cfg;
  cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 16, cfg.vocab = 32, cfg.block_size = 8;
  Var loss = cross_entropy(nn::gpt(g.input("tokens", {2, 8}, DType::i32), cfg), g.input("y", {2, 8}, DType::i32));
  Model m(g, {.seed = 1});
  const Plan plan = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adamw(1e-3, 0.1)}).plan();
  EXPECT_EQ(count(plan, Op::linear_grad_weight_bias), 0) << plan.str();
  EXPECT_EQ(count(plan, Op::linear_grad_input_bias), 2) << plan.str();
  for (const PlanStep& s : plan.steps) {
    if (s.op == Op::linear_grad_input_bias) {
      EXPECT_EQ(s.out[1].type, (TensorType{DType::f32, {48}}));  // qkv's
    }
  }
}
