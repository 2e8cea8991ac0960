// Attention (src/ops/attention.cpp): gradients against finite differences in double, the
// forward against the same computation written with matmul and softmax, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "grad_check.h"
#include "seam/seam.h"
#include "test_util.h"

namespace seam::testing {
namespace {

struct AttentionCase {
  int64_t b, h, tq, tk, d, dv;
  bool causal;
  std::optional<double> scale;
  std::string str() const {
    return "B " + std::to_string(b) + " H " + std::to_string(h) + " Tq " + std::to_string(tq) + " Tk " +
           std::to_string(tk) + " D " + std::to_string(d) + " Dv " + std::to_string(dv) + (causal ? " causal" : "") +
           (scale ? " scale " + std::to_string(*scale) : "");
  }
};

std::vector<AttentionCase> cases() {
  return {
      {1, 1, 1, 1, 4, 4, false, {}},        // one query, one key: p = 1
      {2, 3, 5, 5, 4, 4, true, {}},         // causal
      {1, 2, 3, 7, 5, 2, false, {}},        // more keys than queries, Dv != D
      {2, 1, 6, 6, 3, 5, true, 0.9},        // causal with an explicit scale
      {1, 1, 9, 4, 2, 3, false, 2.5},       // fewer keys than queries, sharp scores
  };
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  for (const AttentionCase& k : cases()) {
    SCOPED_TRACE(k.str());
    check_gradients([&](GradCase& c) {
      return attention(c.param("q", {k.b, k.h, k.tq, k.d}, -2, 2), c.param("k", {k.b, k.h, k.tk, k.d}, -2, 2),
                       c.param("v", {k.b, k.h, k.tk, k.dv}), k.causal, k.scale);
    });
  }
}

// With dropout of the probabilities: the mask is a fixed function of (seed, step, stream,
// index) within a step, so the finite differences see the same mask as the gradient.
TEST(Attention, GradientsWithDropoutMatchFiniteDifferences) {
  for (const AttentionCase& k : cases()) {
    SCOPED_TRACE(k.str());
    check_gradients([&](GradCase& c) {
      return attention(c.param("q", {k.b, k.h, k.tq, k.d}, -2, 2), c.param("k", {k.b, k.h, k.tk, k.d}, -2, 2),
                       c.param("v", {k.b, k.h, k.tk, k.dv}), k.causal, k.scale, 0.3);
    });
  }
}

TEST(Attention, PackedGradientsMatchFiniteDifferences) {
  for (double dropout : {0.0, 0.3})
    for (bool causal : {true, false}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "full") + " dropout " + std::to_string(dropout));
      check_gradients([&](GradCase& c) {
        return attention_qkv(c.param("qkv", {2, 5, 3, 2, 3}, -2, 2), causal, std::nullopt, dropout);
      });
    }
}

// attention_qkv is attention on qkv's q, k and v with the heads moved before T (and o's
// back after it), bit for bit, values and gradients; no copy splits or merges the heads.
TEST(Attention, PackedIsAttentionOnTheSlabs) {
  for (double dropout : {0.0, 0.3}) {
    SCOPED_TRACE("dropout " + std::to_string(dropout));
    std::vector<float> got[2][2];  // [packed][o, dqkv]
    for (int packed = 0; packed < 2; ++packed) {
      Graph g;
      Var qkv = g.param("qkv", {2, 6, 3, 3, 4}, Init::uniform(-2, 2));  // [B, T, 3, H, D]
      auto slab = [&](int64_t i) { return permute(reshape(slice(qkv, 2, i, i + 1), {2, 6, 3, 4}), {0, 2, 1, 3}); };
      // The same node position for both, so that the dropout streams agree.
      const auto at = static_cast<int64_t>(g.nodes().size()) + 6;
      Var o = packed ? g.var(g.add(Op::attention_qkv, {qkv.id()},
                                   {{"causal", int64_t{1}}, {"dropout", dropout}, {"stream", at}})[0])
                     : permute(g.var(g.add(Op::attention, {slab(0).id(), slab(1).id(), slab(2).id()},
                                           {{"causal", int64_t{1}}, {"dropout", dropout}, {"stream", at}})[0]),
                               {0, 2, 1, 3});
      Var loss = sum(mul(o, o));
      Model m(g, {.seed = 4});
      Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {o.id()}});
      p.run();
      got[packed][0] = p.read_as<float>(o.name());
      got[packed][1] = Program::cast_bytes<float>(p.read_grad("qkv"));
      if (packed) {
        EXPECT_EQ(testing::count(p.plan(), Op::slice), 0) << p.plan().str();
        EXPECT_EQ(testing::count(p.plan(), Op::transpose), 0) << p.plan().str();
        EXPECT_EQ(testing::count(p.plan(), Op::attention_qkv_grad), 1);
      }
    }
    EXPECT_EQ(got[0][0], got[1][0]);
    EXPECT_EQ(got[0][1], got[1][1]);
  }
}

std::vector<double> random_doubles(size_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

// The additive causal mask of composed(): 0, or -1e300 after the diagonal.
std::vector<double> causal_mask(const AttentionCase& k) {
  std::vector<double> mask(static_cast<size_t>(k.tq * k.tk), 0.0);
  for (int64_t i = 0; i < k.tq && k.causal; ++i)
    for (int64_t j = i + 1; j < k.tk; ++j) mask[static_cast<size_t>(i * k.tk + j)] = -1e300;
  return mask;
}

// The same attention from matmul, an additive mask (the input "mask": 0, or -1e300 after
// the diagonal when causal) before softmax, the dropout op on the probabilities (p > 0,
// drawing from `stream`), and matmul.
Var composed(Var q, Var k, Var v, double scale, double p = 0, int64_t stream = 0) {
  Graph& g = q.graph();
  Var s = mul(matmul(q, transpose(k)), full(g, {}, scale, q.dtype()));
  Var probs = softmax(add(s, g.input("mask", {q.shape()[2], k.shape()[2]}, DType::f64)), -1);
  if (p > 0) probs = g.var(g.add(Op::dropout, {probs.id()}, {{"p", p}, {"stream", stream}})[0]);
  return matmul(probs, v);
}

// Feeds composed()'s mask, runs, and expects o to be ref within 1e-12; returns o.
std::vector<double> run_against_composed(Program& p, const AttentionCase& k, Var o, Var ref) {
  const std::vector<double> mask = causal_mask(k);
  p.set_input("mask", std::span<const double>(mask));
  p.run();
  const auto got = p.read_as<double>(o.name()), want = p.read_as<double>(ref.name());
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
  return got;
}

TEST(Attention, ForwardIsSoftmaxOfScaledScoresTimesValues) {
  for (const AttentionCase& k : cases()) {
    SCOPED_TRACE(k.str());
    Graph g;
    Var q = g.input("q", {k.b, k.h, k.tq, k.d}, DType::f64), kk = g.input("k", {k.b, k.h, k.tk, k.d}, DType::f64),
        v = g.input("v", {k.b, k.h, k.tk, k.dv}, DType::f64);
    const double scale = k.scale.value_or(1.0 / std::sqrt(static_cast<double>(k.d)));
    auto node = g.add(Op::attention, {q.id(), kk.id(), v.id()},
                      {{"causal", int64_t{k.causal}}, {"scale", k.scale.value_or(0.0)}});
    Var o = g.var(node[0]), lse = g.var(node[1]);
    Var ref = composed(q, kk, v, scale);
    Model m(g, {.seed = 1});
    Program p = m.compile({.mode = Mode::eval, .outputs = {o.id(), lse.id(), ref.id()}});
    std::vector<std::vector<double>> in;
    for (const Var& x : {q, kk, v}) {
      in.push_back(random_doubles(static_cast<size_t>(numel(x.shape())), 40 + in.size(), -2, 2));
      p.set_input(x.name(), std::span<const double>(in.back()));
    }
    run_against_composed(p, k, o, ref);
    // lse: log of the softmax's denominator, checked against the scores directly.
    const auto l = p.read_as<double>(lse.name());
    ASSERT_EQ(l.size(), static_cast<size_t>(k.b * k.h * k.tq));
    for (int64_t r = 0; r < k.b * k.h * k.tq; ++r) {
      const int64_t bh = r / k.tq, i = r % k.tq;
      double sum = 0;
      for (int64_t j = 0; j < (k.causal ? i + 1 : k.tk); ++j) {
        double dot = 0;
        for (int64_t e = 0; e < k.d; ++e)
          dot += in[0][static_cast<size_t>((bh * k.tq + i) * k.d + e)] * in[1][static_cast<size_t>((bh * k.tk + j) * k.d + e)];
        sum += std::exp(scale * dot);
      }
      EXPECT_NEAR(l[static_cast<size_t>(r)], std::log(sum), 1e-12) << r;
    }
  }
}

// Dropout inside attention is the dropout op on the probabilities, drawn from the same
// stream: attention(q, k, v; dropout p) = dropout(softmax(scores), p) v, element for element.
TEST(Attention, DropoutIsTheDropoutOpOnTheProbabilities) {
  for (const AttentionCase& k : cases()) {
    SCOPED_TRACE(k.str());
    Graph g;
    Var q = g.param("q", {k.b, k.h, k.tq, k.d}, Init::uniform(-2, 2), true, DType::f64);
    Var kk = g.param("k", {k.b, k.h, k.tk, k.d}, Init::uniform(-2, 2), true, DType::f64);
    Var v = g.param("v", {k.b, k.h, k.tk, k.dv}, Init::uniform(-1, 1), true, DType::f64);
    const double scale = k.scale.value_or(1.0 / std::sqrt(static_cast<double>(k.d)));
    Var o = g.var(g.add(Op::attention, {q.id(), kk.id(), v.id()},
                        {{"causal", int64_t{k.causal}}, {"scale", scale}, {"dropout", 0.4}, {"stream", int64_t{77}}})[0]);
    Var ref = composed(q, kk, v, scale, 0.4, 77);
    Var plain = attention(q, kk, v, k.causal, scale);
    Var loss = sum(add(add(o, ref), plain));
    Model m(g, {.seed = 9});
    Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {o.id(), ref.id(), plain.id()}});
    const auto got = run_against_composed(p, k, o, ref);
    // and it dropped something: o differs from attention without dropout.
    const auto undropped = p.read_as<double>(plain.name());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != undropped[i];
    if (k.tq * k.tk > 4) {
      EXPECT_GT(differ, 0u);
    }
  }
}

std::string error_of(const std::function<void(Graph&)>& build) {
  Graph g;
  try {
    build(g);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Attention, BadOperandsAreErrorsNamingTheProblem) {
  auto has = [](const std::string& text, const std::string& what) {
    EXPECT_NE(text.find(what), std::string::npos) << text;
  };
  has(error_of([](Graph& g) { attention(g.input("q", {2, 3, 4}), g.input("k", {2, 3, 4}), g.input("v", {2, 3, 4})); }),
      "q, k and v must be [B, H, T, D], got [2,3,4]");
  has(error_of([](Graph& g) {
        attention(g.input("q", {1, 2, 4, 8}), g.input("k", {1, 2, 4, 6}), g.input("v", {1, 2, 4, 8}));
      }),
      "must be [B, H, Tk, D] of q's B, H and D");
  has(error_of([](Graph& g) {
        attention(g.input("q", {1, 2, 4, 8}), g.input("k", {1, 2, 5, 8}), g.input("v", {1, 2, 4, 8}));
      }),
      "must be [B, H, Tk, Dv] of k's B, H and Tk");
  has(error_of([](Graph& g) {
        attention(g.input("q", {1, 2, 4, 8}), g.input("k", {1, 2, 6, 8}), g.input("v", {1, 2, 6, 8}), true);
      }),
      "causal attention needs as many queries as keys, got Tq = 4, Tk = 6");
  has(error_of([](Graph& g) {
        attention(g.input("q", {1, 1, 2, 2}), g.input("k", {1, 1, 2, 2}), g.input("v", {1, 1, 2, 2}), false, -1.0);
      }),
      "scale must be positive");
  has(error_of([](Graph& g) {
        attention(g.input("q", {1, 1, 2, 2}), g.input("k", {1, 1, 2, 2}, DType::f64), g.input("v", {1, 1, 2, 2}));
      }),
      "q, k and v must share one dtype");
  has(error_of([](Graph& g) {
        g.add(Op::attention, {g.input("q", {1, 1, 2, 2}).id(), g.input("k", {1, 1, 2, 2}).id(),
                              g.input("v", {1, 1, 2, 2}).id()},
              {{"scale", std::numeric_limits<double>::infinity()}});
      }),
      "scale must be positive and finite");
  has(error_of([](Graph& g) { attention_qkv(g.input("qkv", {2, 1, 2, 4, 8})); }),
      "qkv must be [B, T, 3, H, D], got [2,1,2,4,8]");
}

TEST(Attention, CausalMaskingIgnoresLaterKeys) {
  // Changing the values of key positions after query i leaves o[i] unchanged.
  Graph g;
  Var q = g.input("q", {1, 1, 4, 3}), k = g.input("k", {1, 1, 4, 3}), v = g.input("v", {1, 1, 4, 3});
  Var o = attention(q, k, v, true);
  Model m(g, {.seed = 1});
  Program p = m.compile({.mode = Mode::eval, .outputs = {o.id()}});
  auto run = [&](float late) {
    const auto qv = random_floats(12, 1), kv = random_floats(12, 2);
    auto vv = random_floats(12, 3);
    for (size_t i = 9; i < 12; ++i) vv[i] = late;  // key 3's value
    p.set_input("q", std::span<const float>(qv));
    p.set_input("k", std::span<const float>(kv));
    p.set_input("v", std::span<const float>(vv));
    p.run();
    return p.read_as<float>(o.name());
  };
  const auto a = run(5.f), b = run(-7.f);
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(a[i], b[i]) << i;  // queries 0-2
  EXPECT_NE(a[9], b[9]);
}

}  // namespace
}  // namespace seam::testing
