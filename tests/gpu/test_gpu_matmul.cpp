// The matmul family on the GPU (cuBLASLt, src/backend/cuda/matmul.cu) against the CPU:
// matmul in all four transpose layouts on tiny, odd and large shapes, batched (folded,
// strided, broadcast), linear with and without bias (whose weight gradient takes the
// BGRADB epilogue), every fused epilogue against its unfused equivalent, and the GEMM
// algorithm cache (in memory across models, on disk with corrupt lines ignored).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/gemm.h"
#include "../test_util.h"
#include "gpu_check.h"
#include "mlp_case.h"

using namespace seam;
using seam::testing::count;
using seam::gpu_testing::CompareOptions;
using seam::gpu_testing::compare_with_cpu;
using seam::gpu_testing::GpuCase;
using seam::gpu_testing::Mlp;
using seam::gpu_testing::build_mlp;
using seam::gpu_testing::mlp_name;
using seam::gpu_testing::TempCacheDir;
using seam::gpu_testing::Tolerance;

namespace {

// Tolerances for GEMMs whose longest dot product (over the output's and the gradients'
// contractions) has `k` terms of values in [-1, 1]. The relative L2 bounds are
// Tolerance::f32() and Tolerance::tf32()'s; the absolute slack grows with k, because an
// output near zero is the difference of sums of size ~sqrt(k), and two summation orders
// (the CPU's BLAS adds sequentially, the GPU in tiles) differ by ~k ulps of the partial
// sums in f32 (measured on the host: worst 5e-5 at k = 784, 6.5e-5 at k = 1024 over 2e5
// outputs), and TF32's 10-bit inputs by ~sqrt(k) * 5e-4 (worst 1.3e-2 at k = 1024).
Tolerance f32_tol(int64_t k) {
  const Tolerance t = Tolerance::f32();
  return {t.rel, t.elem_rel, std::max(t.atol, 1.5e-7 * static_cast<double>(k))};
}
Tolerance tf32_tol(int64_t k) {
  const Tolerance t = Tolerance::tf32();
  return {t.rel, t.elem_rel, t.atol * std::max(1.0, std::sqrt(static_cast<double>(k)))};
}

CompareOptions exact(int64_t k, bool fuse = true) {
  CompareOptions o(Precision::f32, f32_tol(k));
  o.fuse = fuse;
  return o;
}

CompareOptions tf32(int64_t k, bool fuse = true) {
  CompareOptions o(Precision::tf32, tf32_tol(k));
  o.fuse = fuse;
  return o;
}

// cuBLASLt's GELU epilogues evaluate tanh on their own; like the elementwise tests'
// transcendental tolerance, a little headroom over f32 for them and their derivative.
CompareOptions exact_transcendental(int64_t k, bool fuse) {
  CompareOptions o = exact(k, fuse);
  o.tol.rel = 3e-5;
  o.tol.elem_rel = 3e-4;
  return o;
}

// The ways a GPU plan may compute an MLP: unfused ops, or the fused ops with cuBLASLt's
// epilogues, or the fused ops as plain GEMMs followed by separate kernels.
struct Way {
  bool fuse;
  EpiloguePolicy epilogue;
  const char* name;
};
constexpr Way kWays[] = {{false, EpiloguePolicy::fastest, "unfused"},
                         {true, EpiloguePolicy::fused, "fused, epilogues"},
                         {true, EpiloguePolicy::split, "fused, split"},
                         {true, EpiloguePolicy::split_t, "fused, split, dy transposed"}};

Shape dims2(bool transposed, int64_t rows, int64_t cols) {
  return transposed ? Shape{cols, rows} : Shape{rows, cols};
}

int64_t largest(std::initializer_list<int64_t> v) { return std::max<int64_t>(1, std::max(v)); }

}  // namespace

// ---------------------------------------------------------------------------------------
// matmul

TEST(GpuMatmul, EveryTransposeLayoutAndShapeMatchesTheCpu) {
  struct Mnk {
    int64_t m, k, n;
  };
  const std::vector<Mnk> shapes = {{1, 1, 1},   {1, 3, 7},     {3, 7, 1},   {7, 3, 129}, {129, 7, 3},
                                   {3, 129, 7}, {129, 129, 129}, {1024, 784, 256}};
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (const Mnk& s : shapes)
        for (bool use_tf32 : {false, true}) {
          SCOPED_TRACE("[" + std::to_string(s.m) + "x" + std::to_string(s.k) + "] x [" + std::to_string(s.k) + "x" +
                       std::to_string(s.n) + "] ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                       (use_tf32 ? " tf32" : " f32"));
          const int64_t k = largest({s.m, s.k, s.n});  // output and both gradients' contractions
          compare_with_cpu(
              [&](GpuCase& c) {
                Var a = c.param("a", dims2(ta, s.m, s.k));
                Var b = c.param("b", dims2(tb, s.k, s.n));
                return matmul(a, b, ta != 0, tb != 0);
              },
              use_tf32 ? tf32(k) : exact(k));
        }
}

TEST(GpuMatmul, BatchedFoldedStridedAndBroadcastMatchTheCpu) {
  struct Case {
    std::string name;
    Shape a, b;
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {"[B,T,K] x [K,N]: folded into one GEMM", {4, 5, 7}, {7, 9}, false, false},
      {"[B,T,K] x [N,K]^T: folded", {2, 3, 129, 8}, {33, 8}, false, true},
      {"[B,K,M]^T x [K,N]: strided, b broadcast", {4, 7, 5}, {7, 9}, true, false},
      {"[B,M,K] x [B,K,N]", {3, 5, 7}, {3, 7, 9}, false, false},
      {"[B,M,K] x [B,N,K]^T", {3, 5, 7}, {3, 9, 7}, false, true},
      {"[B,K,M]^T x [B,N,K]^T", {3, 7, 5}, {3, 9, 7}, true, true},
      {"[M,K] x [B,K,N]: a broadcast", {5, 7}, {4, 7, 9}, false, false},
      {"[1,M,K] x [B,K,N]: a broadcast", {1, 5, 7}, {4, 7, 9}, false, false},
      {"[2,3,M,K] x [2,3,K,N]: two batch dims, one strided batch", {2, 3, 5, 7}, {2, 3, 7, 9}, false, false},
      {"[2,3,M,K] x [3,K,N]: b broadcast over the outer dim", {2, 3, 5, 7}, {3, 7, 9}, false, false},
      {"[2,1,M,K] x [3,K,N]: outer product of batches", {2, 1, 5, 7}, {3, 7, 9}, false, false},
      {"[3,1,M,K] x [1,4,N,K]^T: crossed broadcast", {3, 1, 6, 8}, {1, 4, 10, 8}, false, true},
      {"[2,64,129,33] x [33,17]: large folded", {2, 64, 129, 33}, {33, 17}, false, false},
  };
  for (const Case& t : cases)
    for (bool use_tf32 : {false, true}) {
      SCOPED_TRACE(t.name + (use_tf32 ? " tf32" : " f32"));
      // The longest sum: over a's or b's rows when a gradient is folded or summed over
      // broadcast batches, else over a feature dim; twice that for headroom.
      const int64_t k = 2 * largest({numel(t.a) / t.a.back(), numel(t.b) / t.b.back(), t.a.back(), t.b.back()});
      compare_with_cpu(
          [&](GpuCase& c) {
            Var a = c.param("a", t.a);
            Var b = c.param("b", t.b);
            return matmul(a, b, t.ta, t.tb);
          },
          use_tf32 ? tf32(k) : exact(k));
    }
}

// ---------------------------------------------------------------------------------------
// linear

TEST(GpuLinear, WithAndWithoutBiasMatchTheCpu) {
  struct Case {
    Shape x;
    int64_t out;
  };
  const std::vector<Case> cases = {{{1, 1}, 1},     {{3, 7}, 1},      {{7, 3}, 129},  {{129, 7}, 3},
                                   {{4, 5, 7}, 9},  {{2, 3, 129}, 33}, {{1024, 784}, 256}};
  for (const Case& t : cases)
    for (bool bias : {false, true})
      for (bool use_tf32 : {false, true}) {
        SCOPED_TRACE(shape_str(t.x) + " -> " + std::to_string(t.out) + (bias ? " with bias" : " without bias") +
                     (use_tf32 ? " tf32" : " f32"));
        int64_t rows = 1;
        for (size_t i = 0; i + 1 < t.x.size(); ++i) rows *= t.x[i];
        const int64_t k = largest({rows, t.x.back(), t.out});
        compare_with_cpu(
            [&](GpuCase& c) {
              Var x = c.param("x", t.x);  // a parameter, so that its gradient is compared too
              Var w = c.param("w", {t.out, t.x.back()});
              if (!bias) return linear(x, w);
              return linear(x, w, c.param("b", {t.out}));
            },
            use_tf32 ? tf32(k) : exact(k));
      }
}

TEST(GpuLinear, WeightAndBiasGradientComeFromOneStep) {
  const int64_t rows = 64, in = 40, out = 24;
  Graph g;
  Var x = g.input("x", {rows, in});
  Var r = g.input("r", {rows, out});
  Var w = g.param("w", {out, in}, Init::uniform(-1, 1));
  Var b = g.param("b", {out}, Init::uniform(-1, 1));
  Var loss = sum(mul(linear(x, w, b), r));
  // dy = r: db[j] = sum_i r[i, j], dw[j, k] = sum_i r[i, j] x[i, k], in double.
  std::mt19937_64 rng(41);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> xs(static_cast<size_t>(rows * in)), rs(static_cast<size_t>(rows * out));
  for (auto& v : xs) v = u(rng);
  for (auto& v : rs) v = u(rng);
  std::vector<float> db(static_cast<size_t>(out)), dw(static_cast<size_t>(out * in));
  for (int64_t j = 0; j < out; ++j) {
    double sb = 0;
    for (int64_t i = 0; i < rows; ++i) sb += rs[static_cast<size_t>(i * out + j)];
    db[static_cast<size_t>(j)] = static_cast<float>(sb);
    for (int64_t k = 0; k < in; ++k) {
      double sw = 0;
      for (int64_t i = 0; i < rows; ++i)
        sw += static_cast<double>(rs[static_cast<size_t>(i * out + j)]) * xs[static_cast<size_t>(i * in + k)];
      dw[static_cast<size_t>(j * in + k)] = static_cast<float>(sw);
    }
  }
  // BGRADB in the GEMM, or the plain GEMM (on dy or its transposed copy) and the column
  // sums.
  for (EpiloguePolicy e : {EpiloguePolicy::fused, EpiloguePolicy::split, EpiloguePolicy::split_t}) {
    Model m(g, {.seed = 1, .device = Device::cuda, .precision = Precision::f32, .epilogue = e});
    Program p = m.compile({.loss = loss.id(), .gradients = true});
    EXPECT_EQ(count(p.plan(), Op::linear_grad_weight_bias), 1) << p.plan().str();
    p.set_input("x", std::span<const float>(xs));
    p.set_input("r", std::span<const float>(rs));
    p.run();
    seam::gpu_testing::expect_close(p.grad_as<float>("b"), db, f32_tol(rows), "db");
    seam::gpu_testing::expect_close(p.grad_as<float>("w"), dw, f32_tol(rows), "dw");
    int step = -1;
    for (size_t i = 0; i < p.plan().steps.size(); ++i)
      if (p.plan().steps[i].op == Op::linear_grad_weight_bias) step = static_cast<int>(i);
    std::string chosen;
    for (auto& [s, what] : p.executable().stats().choices)
      if (s == step) chosen = what;
    EXPECT_EQ(chosen, e == EpiloguePolicy::fused   ? "fused (forced)"
                      : e == EpiloguePolicy::split ? "split (forced)"
                                                   : "split_t (forced)");
  }
}

// ---------------------------------------------------------------------------------------
// Epilogues: fused (linear_act, linear_act_aux, matmul_act_grad, linear_grad_weight_bias)
// against the CPU and the unfused GPU plan against the CPU.

namespace {

int64_t mlp_extent(const Mlp& m) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < m.x.size(); ++i) rows *= m.x[i];
  int64_t k = std::max(rows, m.x.back());
  for (int64_t w : m.widths) k = std::max(k, w);
  return k;
}

const std::vector<Mlp>& mlps() {
  static const std::vector<Mlp> v = {
      {"relu", {32, 20}, {64, 10}, true},        // widths % 8 == 0 and not
      {"relu", {32, 20}, {37, 13, 10}, true},    // relu records need no multiple of 8
      {"relu", {7, 129}, {129, 3}, false},       // no bias: RELU_AUX, RELU
      {"relu", {4, 8, 16}, {24, 40, 5}, true},   // batched input through reshapes
      {"gelu", {32, 20}, {64, 48, 10}, true},
      {"gelu", {32, 20}, {37, 10}, true},        // 37 % 8 != 0: no record, gelu stays unfused
      {"gelu", {7, 129}, {136, 3}, false},       // GELU_AUX, DGELU without bias
      {"gelu", {4, 8, 16}, {32, 24, 10}, true},
      {"relu", {256, 784}, {256, 128, 10}, true},  // the MNIST MLP's shapes
      {"gelu", {256, 784}, {256, 128, 10}, true},
  };
  return v;
}

}  // namespace

TEST(GpuEpilogue, FusedAndUnfusedMlpsMatchTheCpu) {
  for (const Mlp& m : mlps())
    for (const Way& way : kWays) {
      SCOPED_TRACE(mlp_name(m) + ", " + way.name);
      const int64_t k = mlp_extent(m);
      const bool gelu = m.act == "gelu";
      CompareOptions o = gelu ? exact_transcendental(k, way.fuse) : exact(k, way.fuse);
      o.epilogue = way.epilogue;
      compare_with_cpu([&](GpuCase& c) { return build_mlp(c, m); }, o);
    }
}

TEST(GpuEpilogue, FusedAndUnfusedMlpsMatchTheCpuInTf32) {
  for (const Mlp& m : mlps())
    for (const Way& way : kWays) {
      SCOPED_TRACE(mlp_name(m) + ", " + way.name + ", tf32");
      CompareOptions o = tf32(mlp_extent(m), way.fuse);
      o.epilogue = way.epilogue;
      // TF32 moves pre-activations by ~1e-4; one that changes sign flips relu's
      // derivative, which moves a gradient by a whole term. Forward only for relu.
      if (m.act == "relu") o.gradients = false;
      compare_with_cpu([&](GpuCase& c) { return build_mlp(c, m); }, o);
    }
}

TEST(GpuEpilogue, ForwardOnlyPlansUseTheEpilogueWithoutRecord) {
  for (const Mlp& m : mlps())
    for (const Way& way : kWays) {
      if (!way.fuse) continue;
      SCOPED_TRACE(mlp_name(m) + ", " + way.name);
      CompareOptions o = m.act == "gelu" ? exact_transcendental(mlp_extent(m), true) : exact(mlp_extent(m), true);
      o.gradients = false;  // linear_act: RELU(_BIAS), GELU(_BIAS)
      o.epilogue = way.epilogue;
      compare_with_cpu([&](GpuCase& c) { return build_mlp(c, m); }, o);
    }
}

TEST(GpuEpilogue, FusedGpuPlanHasTheFusedSteps) {
  for (const std::string act : {"relu", "gelu"}) {
    SCOPED_TRACE(act);
    Graph g;
    Var x = g.input("x", {32, 20});
    Var y = g.input("y", {32}, DType::i32);
    Var h = nn::linear(x, 64, "fc1");
    h = act == "relu" ? relu(h) : gelu(h, true);
    h = nn::linear(h, 48, "fc2");
    h = act == "relu" ? relu(h) : gelu(h, true);
    Var loss = cross_entropy(nn::linear(h, 10, "fc3"), y);
    Model m(g, {.seed = 3, .device = Device::cuda});
    Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
    const Plan& plan = p.plan();
    EXPECT_EQ(count(plan, Op::linear_act_aux), 2) << plan.str();
    EXPECT_EQ(count(plan, Op::matmul_act_grad), 2) << plan.str();
    // fc1's and fc2's bias gradients come from the activation gradients after them
    // (bias_grads_into_act_grads); fc3's, whose output gradient is the loss's, from BGRADB.
    int summed = 0;
    for (const PlanStep& s : plan.steps) summed += s.op == Op::matmul_act_grad && s.out.size() == 2;
    EXPECT_EQ(summed, 2) << plan.str();
    EXPECT_EQ(count(plan, Op::linear_grad_weight_bias), 1) << plan.str();
    EXPECT_EQ(count(plan, Op::relu_grad) + count(plan, Op::gelu_tanh_grad), 0) << plan.str();
    // And it runs: a few steps lower the loss on a fixed batch.
    std::vector<float> xs(32 * 20);
    std::vector<int32_t> ys(32);
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>((i * 37) % 17) / 8.0f - 1.0f;
    for (size_t i = 0; i < ys.size(); ++i) ys[i] = static_cast<int32_t>(i % 10);
    float first = 0, last = 0;
    for (int s = 0; s < 10; ++s) {
      p.set_input("x", std::span<const float>(xs));
      p.set_input("y", std::span<const int32_t>(ys));
      p.run();
      last = p.read_as<float>(loss.name())[0];
      if (s == 0) first = last;
    }
    EXPECT_TRUE(std::isfinite(last));
    EXPECT_LT(last, first);
  }
}

// ---------------------------------------------------------------------------------------
// The algorithm cache

namespace {

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// Shapes no other test uses, so that the first model has to choose algorithms.
Var cache_case(GpuCase& c) {
  Var x = c.data("x", {53, 91});
  Var h = relu(linear(x, c.param("w1", {61, 91}, -0.1, 0.1), c.param("b1", {61}, -0.1, 0.1)));
  return matmul(h, c.param("w2", {61, 27}, -0.1, 0.1));
}

}  // namespace

TEST(GpuGemmCache, SecondModelReusesTheInMemoryChoice) {
  TempCacheDir home;
  Graph g;
  Var x = g.input("x", {45, 83});
  Var y = relu(nn::linear(x, 59, "fc1"));
  y = nn::linear(y, 19, "fc2");
  Var loss = sum(y);
  auto compile_one = [&] {
    Model m(g, {.seed = 1, .device = Device::cuda});
    Program p = m.compile({.loss = loss.id(), .gradients = true});
    return count(p.plan(), Op::linear_act_aux) + count(p.plan(), Op::linear) + count(p.plan(), Op::matmul) +
           count(p.plan(), Op::matmul_act_grad) + count(p.plan(), Op::linear_grad_weight_bias);
  };
  const auto before = cuda::gemm_cache_stats();
  const int gemms = compile_one();
  const auto mid = cuda::gemm_cache_stats();
  EXPECT_GT(gemms, 0);
  EXPECT_GT(mid.tuned, before.tuned);  // a fresh cache folder: nothing to read
  compile_one();
  const auto after = cuda::gemm_cache_stats();
  EXPECT_EQ(after.tuned, mid.tuned);
  EXPECT_EQ(after.disk_hits, mid.disk_hits);
  EXPECT_EQ(after.rejected, mid.rejected);
  EXPECT_GE(after.memory_hits - mid.memory_hits, gemms);
  // The first model's cache wrote the file when it was destroyed.
  EXPECT_TRUE(std::filesystem::exists(cuda::gemm_cache_path())) << cuda::gemm_cache_path();
}

TEST(GpuGemmCache, FileRoundTripsAndCorruptLinesAreIgnored) {
  // 1. A fresh folder: every GEMM is timed, and the file is written.
  TempCacheDir first;
  const auto s0 = cuda::gemm_cache_stats();
  compare_with_cpu(cache_case, exact(91));
  const auto s1 = cuda::gemm_cache_stats();
  EXPECT_GT(s1.tuned, s0.tuned);
  EXPECT_GT(s1.files_written, s0.files_written);
  const std::string path = cuda::gemm_cache_path();
  ASSERT_FALSE(path.empty());
  const std::string file_name = std::filesystem::path(path).filename().string();
  std::vector<std::string> lines = read_lines(path);
  ASSERT_GE(lines.size(), 3u) << path;
  size_t entries = 0;
  for (auto& l : lines) entries += l.rfind("gemm ", 0) == 0;
  EXPECT_EQ(entries, static_cast<size_t>(s1.tuned - s0.tuned));
  // The fused steps (the relu with its record, the weight and bias gradient; h's gradient
  // comes from a transposed matmul, which stays unfused; and the comparison's own
  // sum(out * r), an elementwise group ending in a sum) timed their variants and saved
  // the picks.
  size_t picks = 0;
  for (auto& l : lines) picks += l.rfind("pick ", 0) == 0;
  EXPECT_EQ(picks, 3u);
  EXPECT_EQ(picks, static_cast<size_t>(s1.variants_timed - s0.variants_timed));

  // 2. The same file read by a fresh process-wide table (another folder): no timing,
  //    every entry checked and used.
  {
    TempCacheDir second;
    std::filesystem::create_directories(second.dir() + "/seam");
    std::filesystem::copy_file(path, second.dir() + "/seam/" + file_name);
    compare_with_cpu(cache_case, exact(91));
    const auto s2 = cuda::gemm_cache_stats();
    EXPECT_EQ(s2.tuned, s1.tuned);
    EXPECT_EQ(s2.rejected, s1.rejected);
    EXPECT_EQ(s2.malformed_lines, s1.malformed_lines);
    EXPECT_GE(s2.disk_hits - s1.disk_hits, static_cast<int64_t>(entries));
    EXPECT_EQ(s2.variants_timed, s1.variants_timed);
    EXPECT_GE(s2.variant_hits - s1.variant_hits, static_cast<int64_t>(picks));
  }
  const auto s2 = cuda::gemm_cache_stats();

  // 3. Corrupt it: garbage lines, a line cut short, bad hex, one well-formed entry whose
  //    algorithm is nonsense and one pick naming no variant. Results stay right; the bad
  //    entry and the bad pick are timed again.
  TempCacheDir third;
  std::filesystem::create_directories(third.dir() + "/seam");
  const std::string bad_path = third.dir() + "/seam/" + file_name;
  std::string poisoned;
  {
    std::ofstream out(bad_path);
    bool poisoned_one = false, poisoned_pick = false;
    for (auto& l : lines) {
      if (!poisoned_pick && l.rfind("pick ", 0) == 0) {
        size_t at = l.find(" use=");
        ASSERT_NE(at, std::string::npos) << l;
        out << l.substr(0, at) << " use=nonsense" << l.substr(l.find(' ', at + 1)) << '\n';
        poisoned_pick = true;
        continue;
      }
      if (!poisoned_one && l.rfind("gemm ", 0) == 0) {
        size_t at = l.find(" algo=");
        ASSERT_NE(at, std::string::npos) << l;
        size_t end = l.find(' ', at + 1);
        std::string words;
        for (int w = 0; w < 8; ++w) words += (w ? ":" : "") + std::string(16, 'f');
        poisoned = l.substr(0, at) + " algo=" + words + l.substr(end);
        out << poisoned << '\n';
        poisoned_one = true;
        continue;
      }
      out << l << '\n';
    }
    out << "this is not a cache line\n";
    out << "gemm ta=0 tb=1 m=3\n";
    out << "gemm ta=zz tb=0 m=1 n=1 k=1 lda=1 ldb=1 ldc=1 batch=1 sa=0 sb=0 sc=0 type=0 compute=68 epi=1 "
           "auxld=0 bias=0 aa=256 ab=256 ad=256 abias=0 aaux=0 algo=0:1 ws=0 ns=0\n";
    out << std::string(10000, 'x') << '\n';
    out << "gemm\n";
    out << "pick two words use=fused ns=1\n";
    out << "pick k use= ns=1\n";
    out << "pick k use=fused ns=-4\n";
  }
  compare_with_cpu(cache_case, exact(91));
  const auto s3 = cuda::gemm_cache_stats();
  EXPECT_GE(s3.malformed_lines - s2.malformed_lines, 8);
  EXPECT_EQ(s3.rejected - s2.rejected, 1);
  EXPECT_EQ(s3.tuned - s2.tuned, 1);
  EXPECT_EQ(s3.variants_timed - s2.variants_timed, 1);
  EXPECT_GE(s3.disk_hits - s2.disk_hits, static_cast<int64_t>(entries) - 1);
  // The file was rewritten without the bad lines.
  std::vector<std::string> rewritten = read_lines(bad_path);
  size_t good = 0, good_picks = 0;
  for (auto& l : rewritten) {
    EXPECT_NE(l, poisoned);
    EXPECT_EQ(l.find("not a cache line"), std::string::npos);
    EXPECT_EQ(l.find("ta=zz"), std::string::npos);
    EXPECT_LT(l.size(), 4096u);
    EXPECT_EQ(l.find("use=nonsense"), std::string::npos);
    EXPECT_EQ(l.find("pick k "), std::string::npos);
    good += l.rfind("gemm ", 0) == 0;
    good_picks += l.rfind("pick ", 0) == 0;
  }
  EXPECT_EQ(good, entries);
  EXPECT_EQ(good_picks, picks);

  // 4. A file of another GPU or cuBLASLt version (another header) is ignored whole.
  TempCacheDir fourth;
  std::filesystem::create_directories(fourth.dir() + "/seam");
  {
    std::ofstream out(fourth.dir() + "/seam/" + file_name);
    out << "# seam gemm algorithm cache v1; gpu Some Other GPU; sm_00 x1; cuBLASLt 1\n";
    for (size_t i = 1; i < lines.size(); ++i) out << lines[i] << '\n';
  }
  compare_with_cpu(cache_case, exact(91));
  const auto s4 = cuda::gemm_cache_stats();
  EXPECT_EQ(s4.disk_hits, s3.disk_hits);
  EXPECT_EQ(s4.tuned - s3.tuned, static_cast<int64_t>(entries));
}
