// The output layer in row chunks (chunk_output_layer): the same loss, count and gradients
// as the whole layer, within the rounding of the chunks' sums, in less arena; the ops it
// is built from (matmul's addend, the loss over a chunk of the labels).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "seam/seam.h"
#include "test_util.h"

namespace seam::testing {
namespace {

// A GPT over a padded vocabulary large beside its width, so that the logits are the
// arena's peak, with its tied output projection; the loss and the count of right guesses.
struct LanguageModel {
  static constexpr int64_t B = 2, T = 11, V = 200, C = 16;
  Graph g;
  Var loss, correct;
  LanguageModel() {
    nn::GptConfig cfg;
    cfg.n_layer = 1, cfg.n_head = 2, cfg.n_embd = C, cfg.vocab = V, cfg.padded_vocab = 256, cfg.block_size = T;
    Var logits = nn::gpt(g.input("tokens", {B, T}, DType::i32), cfg);
    Var y = g.input("y", {B, T}, DType::i32);
    loss = cross_entropy(logits, y);
    correct = count_equal(argmax(logits), y);
  }
};

struct Trained {
  std::vector<float> losses;
  std::vector<int32_t> counts;
  std::vector<std::vector<float>> params;
  Plan plan;
};

// Three AdamW steps on random tokens, a few labels ignored (-100).
Trained train(const LanguageModel& m, int chunks, Precision precision = Precision::f32, size_t budget = 0) {
  Model model(m.g, {.seed = 5, .precision = precision});
  Program p = model.compile({.loss = m.loss.id(),
                             .optimizer = OptimizerConfig::adamw(1e-2, 0.1),
                             .outputs = {m.correct.id()},
                             .output_chunks = chunks,
                             .memory_budget = budget});
  Trained r;
  r.plan = p.plan();
  std::mt19937 rng(3);
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> tokens(LanguageModel::B * LanguageModel::T), y(tokens.size());
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % LanguageModel::V);
    for (auto& t : y) t = rng() % 7 == 0 ? -100 : static_cast<int32_t>(rng() % LanguageModel::V);
    p.set_input("tokens", std::span<const int32_t>(tokens));
    p.set_input("y", std::span<const int32_t>(y));
    p.run();
    r.losses.push_back(p.read_as<float>(m.loss.name())[0]);
    r.counts.push_back(p.read_as<int32_t>(m.correct.name())[0]);
  }
  for (ValueId id : m.g.params()) r.params.push_back(Program::cast_bytes<float>(model.read_param(m.g.value(id).name)));
  return r;
}

TEST(Chunk, TheOutputLayerInChunksMatchesItWhole) {
  const LanguageModel m;
  const Trained whole = train(m, 1);
  EXPECT_EQ(count(whole.plan, Op::cross_entropy_with_grad), 1) << whole.plan.str();
  // 22 rows: even chunks, uneven ones (7, 7, 8), and more chunks than divide evenly.
  size_t arena = whole.plan.arena_bytes;
  for (int chunks : {2, 3, 5}) {
    SCOPED_TRACE(std::to_string(chunks) + " chunks");
    const Trained part = train(m, chunks);
    EXPECT_EQ(count(part.plan, Op::cross_entropy_with_grad), chunks) << part.plan.str();
    EXPECT_EQ(count(part.plan, Op::concat), 1);
    int summed = 0;  // the tied weight's gradient: every chunk's GEMM into the gradient buffer
    for (const PlanStep& s : part.plan.steps)
      summed += s.op == Op::matmul && s.in.size() == 3 && s.in[2].region == Region::grads &&
                s.out[0].region == Region::grads && s.out[0].offset == s.in[2].offset;
    EXPECT_EQ(summed, chunks - 1) << part.plan.str();
    EXPECT_LT(part.plan.arena_bytes, arena);
    arena = part.plan.arena_bytes;
    EXPECT_EQ(part.counts, whole.counts);
    for (size_t s = 0; s < whole.losses.size(); ++s)
      EXPECT_NEAR(part.losses[s], whole.losses[s], 1e-5 * whole.losses[s]);
    // By each tensor's relative L2 error: Adam's step turns a gradient of rounding noise
    // (a bias whose gradient is near 0) into a full step either way. The key third of the
    // qkv projection's bias is left out: its gradient is 0 in exact arithmetic (a key bias
    // adds q . b_k to every score of a row, which softmax ignores), so all three steps it
    // takes are rounding noise's, whose sign the GEMMs' summation order decides.
    for (size_t i = 0; i < whole.params.size(); ++i) {
      const std::string& name = m.g.value(m.g.params()[i]).name;
      const bool qkv_bias = name.ends_with("c_attn.bias");
      double num = 0, den = 0;
      for (size_t j = 0; j < whole.params[i].size(); ++j) {
        if (qkv_bias && j >= static_cast<size_t>(LanguageModel::C) && j < static_cast<size_t>(2 * LanguageModel::C))
          continue;
        const double d = static_cast<double>(part.params[i][j]) - whole.params[i][j];
        num += d * d;
        den += static_cast<double>(whole.params[i][j]) * whole.params[i][j];
      }
      EXPECT_LT(std::sqrt(num / den), 1e-4) << "parameter " << name;
    }
  }
  // Under bf16 (the GEMMs' f32 sums into the master's gradient), within bf16's rounding.
  const Trained half = train(m, 1, Precision::bf16), half4 = train(m, 4, Precision::bf16);
  EXPECT_EQ(count(half4.plan, Op::cross_entropy_with_grad), 4);
  for (size_t s = 0; s < half.losses.size(); ++s) EXPECT_NEAR(half4.losses[s], half.losses[s], 1e-2 * half.losses[s]);
}

// A memory budget takes layer norm gradients from the norms' outputs first, then splits
// the output layer before it recomputes anything: the fewest chunks that fit, and no
// chunks where the logits are not what the peak holds.
TEST(Chunk, AMemoryBudgetChunksTheOutputLayerFirst) {
  const LanguageModel m;
  Model model(m.g, {.seed = 5});
  auto plan = [&](size_t budget, int chunks = 1) {
    return model.compile({.loss = m.loss.id(), .optimizer = OptimizerConfig::adamw(1e-2, 0.1), .output_chunks = chunks,
                          .memory_budget = budget}).plan();
  };
  const Plan whole = plan(0), two = plan(0, 2), four = plan(0, 4);
  ASSERT_LT(four.arena_bytes, two.arena_bytes);
  const size_t own = model.device_bytes();
  const Plan fits = plan(own + whole.arena_bytes);
  EXPECT_EQ(count(fits, Op::cross_entropy_with_grad), 1) << fits.budget_note;
  EXPECT_EQ(fits.budget_note.find("from their outputs"), std::string::npos) << fits.budget_note;
  const Plan p1 = plan(own + whole.arena_bytes - 1);
  EXPECT_EQ(count(p1, Op::cross_entropy_with_grad), 1) << p1.budget_note;
  EXPECT_NE(p1.budget_note.find("layer norm gradients from their outputs"), std::string::npos) << p1.budget_note;
  const Plan p2 = plan(own + p1.arena_bytes - 1);
  EXPECT_EQ(count(p2, Op::cross_entropy_with_grad), 2) << p2.budget_note;
  EXPECT_NE(p2.budget_note.find("the output layer in 2 chunks"), std::string::npos) << p2.budget_note;
  EXPECT_EQ(p2.budget_note.find("recomputing"), std::string::npos) << p2.budget_note;
  const Plan p4 = plan(own + p2.arena_bytes - 1);
  EXPECT_EQ(count(p4, Op::cross_entropy_with_grad), 4) << p4.budget_note;
  EXPECT_EQ(p4.budget_note.find("recomputing"), std::string::npos) << p4.budget_note;
  // Below four chunks' arena: four chunks and recomputation.
  const Plan less = plan(own + p4.arena_bytes - 1);
  EXPECT_EQ(count(less, Op::cross_entropy_with_grad), 4) << less.budget_note;
  EXPECT_NE(less.budget_note.find("recomputing"), std::string::npos) << less.budget_note;
  EXPECT_THROW(plan(0, 0), Error);
}

// output_chunks where no output layer qualifies (a biased head; fusion off) chunks nothing
// and the plan says so; where one does, the note stays empty.
TEST(Chunk, OutputChunksSayWhenNothingIsChunked) {
  const LanguageModel m;
  Model model(m.g, {.seed = 5});
  auto compile = [&](const Var& loss, Model& md, bool fuse, size_t budget = 0) {
    return md.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adamw(1e-2, 0.1), .fuse = fuse,
                       .output_chunks = 2, .memory_budget = budget}).plan();
  };
  const Plan chunked = compile(m.loss, model, true);
  EXPECT_EQ(count(chunked, Op::cross_entropy_with_grad), 2);
  EXPECT_EQ(chunked.budget_note, "");
  const Plan unfused = compile(m.loss, model, false);
  EXPECT_NE(unfused.budget_note.find("output_chunks 2: nothing chunked (fusion is off"), std::string::npos)
      << unfused.budget_note;

  Graph g;  // a classifier whose head has a bias
  Var x = g.input("x", {8, 16}), y = g.input("y", {8}, DType::i32);
  Var loss = cross_entropy(nn::linear(x, 300, "head"), y);
  Model biased(g, {.seed = 5});
  const Plan p = compile(loss, biased, true);
  EXPECT_EQ(count(p, Op::cross_entropy_with_grad), 1);
  EXPECT_NE(p.budget_note.find("output_chunks 2: nothing chunked (no output layer qualifies"), std::string::npos)
      << p.budget_note;
  // Under a budget the note follows the budget's, which claims no chunks.
  const Plan under = compile(loss, biased, true, biased.device_bytes() + (size_t{64} << 20));
  EXPECT_EQ(under.budget_note.find("chunks,"), std::string::npos) << under.budget_note;
  EXPECT_NE(under.budget_note.find("; output_chunks 2: nothing chunked"), std::string::npos) << under.budget_note;
}

// matmul's addend: y = a b + c, in place where the planner puts y over c; its gradient dy.
TEST(Chunk, MatmulAddsItsAddend) {
  Graph g;
  Var a = g.input("a", {5, 7}), b = g.input("b", {7, 3}), c = g.input("c", {5, 3});
  Var y = g.var(g.add(Op::matmul, {a.id(), b.id(), c.id()})[0]);
  Var z = matmul(a, b);
  Model model(g, {});
  Program p = model.compile({.mode = Mode::eval, .outputs = {y.id(), z.id()}});
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> av(35), bv(21), cv(15);
  for (auto* v : {&av, &bv, &cv})
    for (auto& e : *v) e = nd(rng);
  p.set_input("a", std::span<const float>(av));
  p.set_input("b", std::span<const float>(bv));
  p.set_input("c", std::span<const float>(cv));
  p.run();
  const auto ys = p.read_as<float>(y.name()), zs = p.read_as<float>(z.name());
  for (size_t i = 0; i < ys.size(); ++i) EXPECT_NEAR(ys[i], zs[i] + cv[i], 1e-5) << i;
  // Through the passes that rebuild matmuls: a transpose of the sum is not the operands
  // swapped, and under bf16 the cast to f32 of its result stays a cast (the addend has
  // the GEMM's dtype).
  Graph t;
  Var ta = t.input("a", {5, 7}), tb = t.input("b", {7, 3}), tc = t.input("c", {5, 3});
  Var sum_t = transpose(t.var(t.add(Op::matmul, {ta.id(), tb.id(), tc.id()})[0]));
  Var total = sum(cast(t.var(t.add(Op::matmul, {ta.id(), tb.id(), tc.id()})[0]), DType::f32));
  for (Precision pr : {Precision::f32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(pr));
    Model tm(t, {.precision = pr});
    Program tp = tm.compile({.mode = Mode::eval, .outputs = {sum_t.id(), total.id()}});
    tp.set_input("a", std::span<const float>(av));
    tp.set_input("b", std::span<const float>(bv));
    tp.set_input("c", std::span<const float>(cv));
    tp.run();
    const auto st = tp.read_as<float>(sum_t.name());
    const double tol = pr == Precision::f32 ? 1e-5 : 5e-2;
    double want_total = 0;
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 3; ++j) {
        const double want = zs[static_cast<size_t>(i * 3 + j)] + cv[static_cast<size_t>(i * 3 + j)];
        EXPECT_NEAR(st[static_cast<size_t>(j * 5 + i)], want, tol * 4) << i << "," << j;
        want_total += want;
      }
    EXPECT_NEAR(tp.read_as<float>(total.name())[0], want_total, tol * 20);
  }
  const std::string e = error_of([&] {
    Graph h;
    Var x = h.input("a", {5, 7}), w = h.input("b", {7, 3}), bad = h.input("c", {3, 5});
    h.add(Op::matmul, {x.id(), w.id(), bad.id()});
  });
  EXPECT_NE(e.find("c must be y's f32[5,3], got f32[3,5]"), std::string::npos) << e;
}

// The epilogue pass folds an activation's gradient into the plain GEMM that makes its
// incoming gradient (matmul_act_grad); a GEMM with an addend is not plain: its sum must
// reach the derivative whole.
TEST(Chunk, AnActivationGradientLeavesAGemmWithAnAddend) {
  Graph g;
  Var x = g.input("x", {6, 8}), w = g.input("w", {16, 8}), dy = g.input("dy", {6, 4}), w2 = g.input("w2", {4, 16}),
      c = g.input("c", {6, 16});
  Var pre = linear(x, w);
  Var h = gelu(pre, true);  // the forward the pass fuses (linear_act_aux), pre its record
  Var with_addend = g.var(g.add(Op::gelu_tanh_grad, {g.add(Op::matmul, {dy.id(), w2.id(), c.id()})[0], pre.id()})[0]);
  Var added = g.var(g.add(Op::gelu_tanh_grad, {add(matmul(dy, w2), c).id(), pre.id()})[0]);
  Model model(g, {});
  Program p = model.compile({.mode = Mode::eval, .outputs = {h.id(), with_addend.id(), added.id()}});
  EXPECT_EQ(count(p.plan(), Op::linear_act_aux), 1) << p.plan().str();
  EXPECT_EQ(count(p.plan(), Op::matmul_act_grad), 0) << p.plan().str();
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0, 1);
  for (auto [name, n] : {std::pair{"x", 48}, {"w", 128}, {"dy", 24}, {"w2", 64}, {"c", 96}}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& e : v) e = nd(rng);
    p.set_input(name, std::span<const float>(v));
  }
  p.run();
  const auto a = p.read_as<float>(with_addend.name()), b = p.read_as<float>(added.name());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * (1 + std::fabs(b[i]))) << i;
}

// The loss over chunks of the rows: each divides by the count of every label's rows, adds
// the chunks' losses and counts before it, and reads its labels from row_offset on.
TEST(Chunk, TheLossOverAChunkDividesByEveryRow) {
  const std::string e = error_of([] {
    Graph g;
    Var z = g.input("z", {4, 6}), y = g.input("y", {5}, DType::i32);
    Var dy = full(g, {}, 1.0, DType::f32);
    g.add(Op::cross_entropy_with_grad, {z.id(), y.id(), dy.id()}, {{"row_offset", int64_t{2}}});
  });
  EXPECT_NE(e.find("a chunk of 4 rows from row 2 needs that many labels; there are 5"), std::string::npos) << e;
  const std::string acc = error_of([] {
    Graph g;
    Var z = g.input("z", {4, 6}), y = g.input("y", {4}, DType::i32);
    Var dy = full(g, {}, 1.0, DType::f32);
    g.add(Op::cross_entropy_with_grad, {z.id(), y.id(), dy.id(), dy.id()});
  });
  EXPECT_NE(acc.find("loss_acc needs row_offset >= 0"), std::string::npos) << acc;
  const std::string count = error_of([] {
    Graph g;
    Var z = g.input("z", {4, 6}), y = g.input("y", {4}, DType::i32);
    Var dy = full(g, {}, 1.0, DType::f32);
    g.add(Op::cross_entropy_with_grad, {z.id(), y.id(), dy.id(), dy.id(), dy.id()}, {{"row_offset", int64_t{0}}});
  });
  EXPECT_NE(count.find("correct_acc needs count_correct and an i32 scalar"), std::string::npos) << count;
  const std::string smooth = error_of([] {
    Graph g;
    Var z = g.input("z", {4, 6}), y = g.input("y", {4}, DType::i32);
    Var dy = full(g, {}, 1.0, DType::f32);
    g.add(Op::cross_entropy_with_grad, {z.id(), y.id(), dy.id()},
          {{"row_offset", int64_t{0}}, {"label_smoothing", 1.5}});
  });
  EXPECT_NE(smooth.find("label_smoothing must be in [0, 1], got 1.5"), std::string::npos) << smooth;
}

}  // namespace
}  // namespace seam::testing
