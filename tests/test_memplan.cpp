// The memory planner: live buffers never overlap (property test over random lifetimes
// and random graphs), reuse changes no result, and reuse pays off on real models.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "passes/memplan.h"
#include "seam/seam.h"
#include "test_util.h"

using namespace seam;

TEST(MemPlan, LiveBuffersNeverOverlap) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 300; ++trial) {
    std::uniform_int_distribution<int> count(1, 60), step(-1, 40), size(1, 1 << 16);
    std::vector<Lifetime> life(static_cast<size_t>(count(rng)));
    for (auto& l : life) {
      int a = step(rng), b = step(rng);
      l = {static_cast<size_t>(size(rng)), std::min(a, b), std::max(a, b)};
    }
    MemPlan p = plan_memory(life, 256);
    size_t max_live = 0;
    for (int t = -1; t <= 40; ++t) {
      size_t live = 0;
      for (auto& l : life)
        if (l.first <= t && t <= l.last) live += (l.bytes + 255) / 256 * 256;
      max_live = std::max(max_live, live);
    }
    for (size_t i = 0; i < life.size(); ++i) {
      ASSERT_EQ(p.offsets[i] % 256, 0u);
      ASSERT_LE(p.offsets[i] + life[i].bytes, p.peak);
      for (size_t j = i + 1; j < life.size(); ++j) {
        bool same_time = life[i].first <= life[j].last && life[j].first <= life[i].last;
        bool same_place = p.offsets[i] < p.offsets[j] + life[j].bytes && p.offsets[j] < p.offsets[i] + life[i].bytes;
        ASSERT_FALSE(same_time && same_place) << "trial " << trial << ": buffers " << i << " and " << j;
      }
    }
    EXPECT_EQ(p.lower_bound, max_live);
    EXPECT_GE(p.peak, max_live);  // no plan can do better than the busiest step
    EXPECT_LE(p.peak, p.naive);
  }
}

namespace {

// A random differentiable graph over a few inputs: elementwise chains, broadcasting,
// matmuls, reductions, views, concat/slice, with values used several times. At n = 32
// (rows of 256 bytes) the slices of rows and the concats are views.
Var random_graph(Graph& g, std::mt19937_64& rng, std::vector<Var>& params, int64_t n = 6) {
  std::vector<Var> pool;
  for (int i = 0; i < 3; ++i) {
    params.push_back(g.param("p" + std::to_string(i), {n, n}, Init::uniform(-1, 1), true, DType::f64));
    pool.push_back(params.back());
  }
  pool.push_back(g.param("row", {n}, Init::uniform(-1, 1), true, DType::f64));
  params.push_back(pool.back());
  std::uniform_int_distribution<int> op(0, 9);
  auto pick = [&] { return pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)]; };
  auto square = [&] {  // an [n, n] operand
    for (int k = 0; k < 20; ++k) {
      Var v = pick();
      if (v.shape() == Shape{n, n}) return v;
    }
    return pool[0];
  };
  for (int i = 0; i < 25; ++i) {
    Var v;
    switch (op(rng)) {
      case 0: v = add(square(), pick()); break;
      case 1: v = mul(square(), pick()); break;
      case 2: v = seam::tanh(square()); break;
      case 3: v = matmul(square(), square(), rng() % 2, rng() % 2); break;
      case 4: v = sigmoid(square()); break;
      case 5: v = sum(square(), {static_cast<int64_t>(rng() % 2)}); break;
      case 6: v = reshape(transpose(reshape(square(), {n, n})), {n, n}); break;
      case 7: v = slice(concat({square(), square()}, 0), 0, 3, 3 + n); break;
      case 8: v = sub(square(), broadcast_to(pick(), {n, n})); break;
      default: v = scale(square(), 0.5); break;
    }
    pool.push_back(v);
  }
  Var total = sum(pool.back());
  for (size_t i = pool.size() - 6; i + 1 < pool.size(); ++i) total = add(total, mean(pool[i]));
  return total;
}

std::vector<double> run_all(Model& m, Var loss, const std::vector<Var>& params, bool reuse, Plan* plan_out) {
  Program p = m.compile({.loss = loss.id(), .gradients = true, .reuse_memory = reuse});
  p.run();
  std::vector<double> out = p.read_as<double>(loss.name());
  for (auto& v : params) {
    auto g = p.grad_as<double>(v.name());
    out.insert(out.end(), g.begin(), g.end());
  }
  if (plan_out) *plan_out = p.plan();
  return out;
}

}  // namespace

TEST(MemPlan, ReuseChangesNoResultOnRandomGraphs) {
  std::mt19937_64 rng(2);
  size_t saved = 0, naive = 0;
  for (int trial = 0; trial < 40; ++trial) {
    Graph g;
    std::vector<Var> params;
    Var loss = random_graph(g, rng, params);
    Model m(g, {.seed = static_cast<uint64_t>(trial)});
    Plan with, without;
    auto a = run_all(m, loss, params, true, &with);
    auto b = run_all(m, loss, params, false, &without);
    ASSERT_EQ(a, b) << "trial " << trial << "\n" << with.str();
    EXPECT_LE(with.arena_bytes, without.arena_bytes);
    saved += with.arena_bytes;
    naive += without.arena_bytes;
  }
  EXPECT_LT(saved, naive);
}

// The same where slices and concats of rows are views (256-byte rows): the concats'
// buffers live from their first input's step, so reusing memory still changes nothing.
TEST(MemPlan, ReuseChangesNoResultWhereSlicesAndConcatsAreViews) {
  std::mt19937_64 rng(3);
  int sliced = 0, copied = 0, concats = 0, joined = 0;
  for (int trial = 0; trial < 12; ++trial) {
    Graph g;
    std::vector<Var> params;
    Var loss = random_graph(g, rng, params, 32);
    Model m(g, {.seed = static_cast<uint64_t>(trial)});
    Plan with, without;
    auto a = run_all(m, loss, params, true, &with);
    auto b = run_all(m, loss, params, false, &without);
    ASSERT_EQ(a, b) << "trial " << trial << "\n" << with.str();
    for (const Node& n : g.nodes()) sliced += n.op == Op::slice, concats += n.op == Op::concat;
    copied += seam::testing::count(with, Op::slice);
    joined += seam::testing::count(without, Op::concat);
  }
  EXPECT_GT(sliced, 0);
  EXPECT_EQ(copied, 0);       // every slice of the graph a view
  EXPECT_LT(joined, concats);  // some concats written in place (not those of a parameter)
}

namespace {
// Prints the peak next to the sum of all intermediates and the busiest step's bytes;
// the planner must stay close to that bound.
void check_peak(const char* what, Model& m, Var loss, double max_fraction) {
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-3)});
  const Plan& plan = p.plan();
  std::printf("%s: %zu steps, arena peak %.2f MiB, sum of all intermediates %.2f MiB (%.0f%%), busiest step %.2f MiB\n",
              what, plan.steps.size(), plan.arena_bytes / 1048576.0, plan.naive_bytes / 1048576.0,
              100.0 * static_cast<double>(plan.arena_bytes) / static_cast<double>(plan.naive_bytes),
              plan.live_bytes / 1048576.0);
  EXPECT_LT(static_cast<double>(plan.arena_bytes), max_fraction * static_cast<double>(plan.naive_bytes)) << plan.str();
  EXPECT_LT(static_cast<double>(plan.arena_bytes), 1.15 * static_cast<double>(plan.live_bytes)) << plan.str();
}
}  // namespace

TEST(MemPlan, PeakIsWellUnderTheSumOfIntermediatesForAnMlp) {
  Graph g;
  Var loss = seam::testing::mlp_loss(g, 128, 784, {1024, 1024}, 10);
  Model m(g);
  check_peak("MLP 784-1024-1024-10, batch 128", m, loss, 0.6);
}

TEST(MemPlan, PeakIsWellUnderTheSumOfIntermediatesForACnn) {
  Graph g;
  Var x = g.input("x", {64, 1, 28, 28});
  Var y = g.input("y", {64}, DType::i32);
  Var h = relu(nn::batch_norm(nn::conv2d(x, 32, 3, "conv1", {.padding = {1, 1}}), "bn1"));
  h = max_pool2d(h, {2, 2});
  h = relu(nn::batch_norm(nn::conv2d(h, 64, 3, "conv2", {.padding = {1, 1}}), "bn2"));
  h = max_pool2d(h, {2, 2});
  h = relu(nn::linear(flatten(h), 128, "fc1"));
  Var loss = cross_entropy(nn::linear(dropout(h, 0.25), 10, "fc2"), y);
  Model m(g);
  // Fused batch norm + ReLU leaves fewer intermediates to sum (41.7 MiB, 60.1 unfused)
  // around the same busiest step (26.2 MiB): the bound is the busiest step's.
  check_peak("CNN conv32-conv64-fc128, batch 64", m, loss, 0.65);
}

TEST(MemPlan, OutputsNobodyReadsStillGetTheirOwnPlace) {
  // In evaluation nothing reads batch_norm's saved mean and invstd; they are written all
  // the same and must not land on live values (here: y, which relu reads next).
  Graph g;
  Var x = g.input("x", {4, 3});
  Var gamma = g.param("gamma", {3}, Init::ones());
  Var beta = g.param("beta", {3}, Init::zeros());
  Var rm = g.state("rm", {3}, Init::constant(0.5));
  Var rv = g.state("rv", {3}, Init::constant(4.0));
  Var z = relu(batch_norm(relu(x), gamma, beta, rm, rv));
  Model m(g);
  Program p = m.compile({.mode = Mode::eval, .outputs = {z.id()}});
  for (auto& s : p.plan().steps)
    for (auto& o : s.out) EXPECT_GT(o.type.numel(), 0) << s.name;
  std::vector<float> xs{1, 2, 3, -1, 5, 6, 7, 8, 9, 10, 11, 12};
  p.set_input("x", std::span<const float>(xs));
  p.run();
  auto out = p.read_as<float>(z.name());
  for (size_t i = 0; i < xs.size(); ++i)
    EXPECT_NEAR(out[i], std::max(0.0f, (std::max(0.0f, xs[i]) - 0.5f) / std::sqrt(4.0f + 1e-5f)), 1e-6) << i;
}

TEST(MemPlan, AnInputSetOnceStaysValidForLaterSteps) {
  Graph g;
  Var x = g.input("x", {16, 8});
  Var y = g.input("y", {16}, DType::i32);
  Var loss = cross_entropy(nn::linear(relu(nn::linear(x, 32, "fc1")), 4, "fc2"), y);
  Model m(g, {.seed = 1});
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
  std::vector<int32_t> labels(16);
  for (int i = 0; i < 16; ++i) labels[static_cast<size_t>(i)] = i % 4;
  p.set_input("y", std::span<const int32_t>(labels));  // once
  std::vector<float> xs(16 * 8);
  for (int s = 0; s < 5; ++s) {
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>((i * 7 + static_cast<size_t>(s)) % 11) / 11.0f;
    p.set_input("x", std::span<const float>(xs));
    EXPECT_NO_THROW(p.run()) << "step " << s;  // a clobbered label would be out of range
  }
  EXPECT_TRUE(std::isfinite(p.read_as<float>(loss.name())[0]));
  // No step writes where an integer input lives (a step replayed alone reads its labels).
  for (auto& in : p.plan().inputs) {
    if (is_float(in.ref.type.dtype)) continue;
    for (auto& st : p.plan().steps)
      for (auto& o : st.out) {
        if (o.region != Region::arena) continue;
        EXPECT_TRUE(o.offset + o.bytes() <= in.ref.offset || in.ref.offset + in.ref.bytes() <= o.offset)
            << st.name << " writes over input " << in.name;
      }
  }
}

TEST(MemPlan, AFloatInputsPlaceIsReusedAndItStillHoldsOnTheNextRun) {
  // x is read only by the first step, so later values take its place; the backend keeps
  // the input where it copies it from as each run begins, so a second run without
  // setting x again computes on x, not on what took its place.
  Graph g;
  Var x = g.input("x", {64, 64});
  Var w = g.param("w", {64, 64}, Init::uniform(-1, 1));
  Var loss = sum(mul(seam::tanh(x), w) * 0.5);
  Model m(g, {.seed = 2});
  Program p = m.compile({.loss = loss.id(), .gradients = true});
  const BufferRef& xr = p.plan().input("x")->ref;
  bool reused = false;
  for (size_t k = 1; k < p.plan().steps.size(); ++k)
    for (const BufferRef& o : p.plan().steps[k].out)
      reused = reused || (o.region == Region::arena && o.offset < xr.offset + xr.bytes() && xr.offset < o.offset + o.bytes());
  EXPECT_TRUE(reused) << p.plan().str();
  std::vector<float> xs(64 * 64);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i % 13) / 13.0f;
  p.set_input("x", std::span<const float>(xs));
  p.run();
  float first = p.read_as<float>(loss.name())[0];
  p.run();
  EXPECT_EQ(p.read_as<float>(loss.name())[0], first);
}

TEST(MemPlan, TheGradientSeedIsComputedOnceNotEveryStep) {
  Graph g;
  Var x = g.input("x", {8, 4});
  Var w = g.param("w", {4}, Init::uniform(-1, 1));
  Var unused = g.param("unused", {3}, Init::ones());  // its zero gradient stays a step
  Var loss = sum(mul(x, w));
  Model m(g);
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
  int full_steps = 0;
  for (auto& s : p.plan().steps) full_steps += s.op == Op::full;
  ASSERT_EQ(p.plan().init.size(), 1u);
  EXPECT_EQ(p.plan().init[0].op, Op::full);
  EXPECT_EQ(full_steps, 1) << p.plan().str();  // the zero gradient of `unused`, into the gradient buffer
  std::vector<float> xs(32, 1.0f);
  p.set_input("x", std::span<const float>(xs));
  auto w0 = Program::cast_bytes<float>(m.read_param("w"));
  for (int s = 0; s < 3; ++s) p.run();
  auto w3 = Program::cast_bytes<float>(m.read_param("w"));
  for (size_t i = 0; i < w0.size(); ++i) EXPECT_NEAR(w3[i], w0[i] - 3 * 0.1f * 8, 1e-5);  // d loss/d w = 8 each step
  (void)unused;
}

// Rows of a row-major matrix are one contiguous run: a slice of them is a view at the
// run's start, and a concat of such runs has its inputs written in place into it, so
// neither copies (the output layer's chunks). Runs that start off kAlign (256 bytes), a
// slice along a later axis or with a step, and a concat's input that is read twice copy
// as before. Values and gradients as computed by hand.
TEST(MemPlan, ContiguousSlicesAndConcatsAreViewsNotCopies) {
  Graph g;
  const int64_t rows = 64, cols = 8;  // a row 32 bytes, 32 rows 1 KB
  Var x = g.input("x", {rows, cols});
  Var w = g.param("w", {rows, cols}, Init::uniform(-1, 1));
  Var a = slice(x, 0, 0, 32), b = slice(x, 0, 32, 64);  // views at 0 and 1024 bytes
  Var joined = concat({seam::tanh(a), sigmoid(b)}, 0);   // written in place
  Var odd = slice(x, 0, 1, 33);                          // 32 bytes in: a copy
  Var cols_of = slice(x, 1, 0, 4);                       // along the rows: a copy
  Var twice = concat({cols_of, cols_of}, 1);             // one input twice: a copy
  Var loss = add(add(sum(mul(joined, w)), sum(odd)), sum(twice));
  Model m(g, {.seed = 4});
  Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {joined.id()}});
  const Plan& plan = p.plan();
  EXPECT_EQ(seam::testing::count(plan, Op::slice), 2) << plan.str();
  EXPECT_EQ(seam::testing::count(plan, Op::concat), 1) << plan.str();
  const BufferRef& out = plan.output(joined.name())->ref;
  int inside = 0;
  for (const PlanStep& s : plan.steps)
    if (s.op == Op::tanh || s.op == Op::sigmoid) {
      EXPECT_EQ(s.out[0].offset, out.offset + (s.op == Op::tanh ? 0 : 1024)) << plan.str();
      EXPECT_EQ(s.in[0].offset, plan.input("x")->ref.offset + (s.op == Op::tanh ? 0 : 1024)) << plan.str();
      ++inside;
    }
  EXPECT_EQ(inside, 2) << plan.str();
  std::vector<float> xs = seam::testing::random_floats(static_cast<size_t>(rows * cols), 5);
  p.set_input("x", std::span<const float>(xs));
  const auto w0 = Program::cast_bytes<float>(m.read_param("w"));
  p.run();
  const auto y = p.read_as<float>(joined.name()), dw = p.grad_as<float>("w");
  double want = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const auto k = static_cast<size_t>(i);
    const double v = i < 32 * cols ? std::tanh(double{xs[k]}) : 1.0 / (1.0 + std::exp(-double{xs[k]}));
    EXPECT_NEAR(y[k], v, 1e-6) << i;
    EXPECT_NEAR(dw[k], v, 1e-6) << i;
    want += v * w0[k];
  }
  for (int64_t i = cols; i < 33 * cols; ++i) want += xs[static_cast<size_t>(i)];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 4; ++c) want += 2.0 * xs[static_cast<size_t>(r * cols + c)];
  EXPECT_NEAR(p.read_as<float>(loss.name())[0], want, 1e-4 * std::abs(want) + 1e-4);
}

// A concat of an in-place concat joins it: the inner one's inputs are written at their
// offsets within the outer run, and neither concat copies; the inner value, an output
// too, is read from its place inside the outer one.
TEST(MemPlan, NestedConcatsAreWrittenInPlace) {
  Graph g;
  const int64_t rows = 96, cols = 8;  // 32 rows 1 KB
  Var x = g.input("x", {rows, cols});
  Var w = g.param("w", {rows, cols}, Init::uniform(-1, 1));
  Var inner = concat({seam::tanh(slice(x, 0, 0, 32)), sigmoid(slice(x, 0, 32, 64))}, 0);
  Var outer = concat({inner, seam::exp(slice(x, 0, 64, 96))}, 0);
  Var loss = sum(mul(outer, w));
  Model m(g, {.seed = 8});
  Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {outer.id(), inner.id()}});
  const Plan& plan = p.plan();
  EXPECT_EQ(seam::testing::count(plan, Op::concat), 0) << plan.str();
  const BufferRef& out = plan.output(outer.name())->ref;
  EXPECT_EQ(plan.output(inner.name())->ref.offset, out.offset) << plan.str();
  int inside = 0;
  for (const PlanStep& s : plan.steps) {
    const size_t at = s.op == Op::tanh ? 0 : s.op == Op::sigmoid ? 1024 : 2048;
    if (s.op != Op::tanh && s.op != Op::sigmoid && s.op != Op::exp) continue;
    EXPECT_EQ(s.out[0].offset, out.offset + at) << plan.str();
    ++inside;
  }
  EXPECT_EQ(inside, 3) << plan.str();
  std::vector<float> xs = seam::testing::random_floats(static_cast<size_t>(rows * cols), 9);
  p.set_input("x", std::span<const float>(xs));
  p.run();
  const auto y = p.read_as<float>(outer.name()), yi = p.read_as<float>(inner.name()), dw = p.grad_as<float>("w");
  ASSERT_EQ(yi.size(), static_cast<size_t>(64 * cols));
  for (int64_t i = 0; i < rows * cols; ++i) {
    const auto k = static_cast<size_t>(i);
    const double v = i < 32 * cols   ? std::tanh(double{xs[k]})
                     : i < 64 * cols ? 1.0 / (1.0 + std::exp(-double{xs[k]}))
                                     : std::exp(double{xs[k]});
    EXPECT_NEAR(y[k], v, 1e-6 * std::max(1.0, std::abs(v))) << i;
    EXPECT_NEAR(dw[k], v, 1e-6 * std::max(1.0, std::abs(v))) << i;
    if (k < yi.size()) {
      EXPECT_EQ(yi[k], y[k]) << i;
    }
  }
}

// Under bf16 a parameter's cast is its working copy, in the working copies' region, and
// no step writes it: a concat of two such copies still copies them (written in place,
// nothing would fill it) and holds their values.
TEST(MemPlan, AConcatOfWorkingCopiesStillCopies) {
  Graph g;
  Var x = g.input("x", {64, 8});
  Var a = g.param("a", {32, 8}, Init::uniform(-1, 1)), b = g.param("b", {32, 8}, Init::uniform(-1, 1));
  Var joined = concat({cast(a, DType::bf16), cast(b, DType::bf16)}, 0);  // 512 bytes each: aligned
  Var loss = sum(mul(cast(joined, DType::f32), x));
  Model m(g, {.seed = 6, .precision = Precision::bf16});
  Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {joined.id()}});
  EXPECT_EQ(seam::testing::count(p.plan(), Op::concat), 1) << p.plan().str();
  for (const PlanStep& s : p.plan().steps)
    if (s.op == Op::concat)
      for (const BufferRef& in : s.in) EXPECT_EQ(in.region, Region::working) << p.plan().str();
  std::vector<float> xs(64 * 8, 1.0f);
  p.set_input("x", std::span<const float>(xs));
  p.run();
  const std::vector<float> y = seam::testing::as_floats(p.read(joined.name()), DType::bf16);
  const auto av = Program::cast_bytes<float>(m.read_param("a")), bv = Program::cast_bytes<float>(m.read_param("b"));
  ASSERT_EQ(y.size(), av.size() + bv.size());
  for (size_t i = 0; i < y.size(); ++i) {
    const float want = i < av.size() ? av[i] : bv[i - av.size()];
    EXPECT_NEAR(y[i], want, 4e-3 * std::abs(want)) << i;  // the working copy's bf16 rounding
  }
}
