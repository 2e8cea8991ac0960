// The matmul family with 16-bit storage (bf16, f16) on the GPU (cuBLASLt,
// src/backend/cuda/matmul.cu) against the CPU, which emulates the same storage (every
// store rounds to nearest even): both read the same 16-bit values and accumulate in fp32,
// so they differ only where two summation orders put a result on either side of a
// rounding boundary (Tolerance::bf16(), Tolerance::f16()).
//
// Two ways in. Through the precision pass (compare_with_cpu at bf16() / f16()): graphs
// of f32 parameters whose GEMMs the pass gives 16-bit inputs, forward and gradients, for
// every epilogue policy. And directly: graphs of explicit 16-bit inputs running each GEMM
// op (the fused ones built by hand) at Precision::f32, where no pass touches them.
// Shapes: one with M, K, N odd or not a multiple of 8 (16-bit leading dimensions that
// are not 16-byte multiples: cuBLASLt must still offer an algorithm, or the step fall
// back to its split variant), and a larger one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../test_util.h"
#include "backend/backend.h"
#include "ops/registry.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/wgmma_gemm.h"
#include "common/half.h"
#include "gpu_check.h"
#include "mlp_case.h"
#include "ops/geometry.h"

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

struct Low {
  DType dtype;
  Precision precision;
  const char* name;
  CompareOptions options() const { return dtype == DType::bf16 ? gpu_testing::bf16() : gpu_testing::f16(); }
  Tolerance tol() const { return dtype == DType::bf16 ? Tolerance::bf16() : Tolerance::f16(); }
};
constexpr Low kLows[] = {{DType::bf16, Precision::bf16, "bf16"}, {DType::f16, Precision::f16, "f16"}};

struct Mnk {
  int64_t m, k, n;
};
// Odd and not multiples of 8 (37 rows, K = 52 = 4 mod 8, N = 29), and a larger one.
constexpr Mnk kOdd{37, 52, 29};
constexpr Mnk kLarge{256, 512, 384};
constexpr Mnk kShapes[] = {kOdd, kLarge};

std::string mnk_name(const Mnk& s) {
  return "M=" + std::to_string(s.m) + " K=" + std::to_string(s.k) + " N=" + std::to_string(s.n);
}

struct Way {
  bool fuse;
  EpiloguePolicy epilogue;
  const char* name;
};
constexpr Way kWays[] = {{false, EpiloguePolicy::fastest, "unfused"},
                         {true, EpiloguePolicy::fastest, "fused, fastest"},
                         {true, EpiloguePolicy::fused, "fused, epilogues"},
                         {true, EpiloguePolicy::split, "fused, split"},
                         {true, EpiloguePolicy::split_t, "fused, split, dy transposed"}};

Shape dims2(bool transposed, int64_t rows, int64_t cols) {
  return transposed ? Shape{cols, rows} : Shape{rows, cols};
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Through the precision pass

TEST(GpuPrecisionMatmul, EveryTransposeLayoutMatchesTheCpu) {
  for (const Low& low : kLows)
    for (const Mnk& s : kShapes)
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
          SCOPED_TRACE(std::string(low.name) + " " + mnk_name(s) + " ta=" + std::to_string(ta) +
                       " tb=" + std::to_string(tb));
          compare_with_cpu(
              [&](GpuCase& c) {
                Var a = c.param("a", dims2(ta, s.m, s.k));
                Var b = c.param("b", dims2(tb, s.k, s.n));
                return matmul(a, b, ta != 0, tb != 0);
              },
              low.options());
        }
}

TEST(GpuPrecisionMatmul, BatchedFoldedStridedAndBroadcastMatchTheCpu) {
  struct Case {
    std::string name;
    Shape a, b;
    bool ta, tb;
  };
  // Strided batches and separate runs address their matrices at element offsets, which
  // are 2 bytes each here.
  const std::vector<Case> cases = {
      {"[B,T,K] x [K,N]: folded", {2, 37, 52}, {52, 29}, false, false},
      {"[B,K,M]^T x [K,N]: strided, b broadcast", {3, 52, 37}, {52, 29}, true, false},
      {"[B,M,K] x [B,N,K]^T", {3, 37, 52}, {3, 29, 52}, false, true},
      {"[2,1,M,K] x [3,K,N]: outer product of batches", {2, 1, 37, 52}, {3, 52, 29}, false, false},
      {"[3,1,M,K] x [1,4,N,K]^T: crossed broadcast", {3, 1, 6, 8}, {1, 4, 10, 8}, false, true},
  };
  for (const Low& low : kLows)
    for (const Case& t : cases) {
      SCOPED_TRACE(std::string(low.name) + " " + t.name);
      compare_with_cpu(
          [&](GpuCase& c) {
            Var a = c.param("a", t.a);
            Var b = c.param("b", t.b);
            return matmul(a, b, t.ta, t.tb);
          },
          low.options());
    }
}

TEST(GpuPrecisionMatmul, LinearWithAndWithoutBiasMatchesTheCpu) {
  struct Case {
    Shape x;
    int64_t out;
  };
  const std::vector<Case> cases = {{{kOdd.m, kOdd.k}, kOdd.n}, {{kLarge.m, kLarge.k}, kLarge.n}, {{4, 5, 7}, 9}};
  for (const Low& low : kLows)
    for (const Case& t : cases)
      for (bool bias : {false, true}) {
        SCOPED_TRACE(std::string(low.name) + " " + shape_str(t.x) + " -> " + std::to_string(t.out) +
                     (bias ? " with bias" : " without bias"));
        compare_with_cpu(
            [&](GpuCase& c) {
              Var x = c.param("x", t.x);  // a parameter, so that its gradient is compared too
              Var w = c.param("w", {t.out, t.x.back()});
              if (!bias) return linear(x, w);
              return linear(x, w, c.param("b", {t.out}));
            },
            low.options());
      }
}

// A residual added by the GEMM (linear_add: cuBLASLt's C with beta = 1, with and without
// BIAS; and the split variant, GEMM then add), at f32, bf16 and f16, on the shapes above
// and through a reshape of the GEMM's output: values and the gradients of x, w, b and the
// residual. Not f32 at the large shape: its K = 512 dot products cancel to within f32's
// absolute tolerance of 0 in places, in the plain GEMMs of the gradients as well.
TEST(GpuPrecisionMatmul, ResidualAddedByTheGemmMatchesTheCpu) {
  struct Case {
    Shape x;
    int64_t out;
    bool view;  // the add reads the linear's output reshaped to [x's rows..., out]
  };
  const std::vector<Case> cases = {
      {{kOdd.m, kOdd.k}, kOdd.n, false}, {{kLarge.m, kLarge.k}, kLarge.n, false}, {{4, 5, 8}, 8, true}};
  for (CompareOptions base : {gpu_testing::f32(), gpu_testing::bf16(), gpu_testing::f16()})
    for (EpiloguePolicy e : {EpiloguePolicy::fused, EpiloguePolicy::split})
      for (const Case& t : cases)
        for (bool bias : {false, true}) {
          if (base.precision == Precision::f32 && t.x == Shape{kLarge.m, kLarge.k}) continue;
          SCOPED_TRACE(std::string(precision_name(base.precision)) + " " + shape_str(t.x) + " -> " +
                       std::to_string(t.out) + (bias ? " with bias" : " without bias") +
                       (e == EpiloguePolicy::fused ? ", fused" : ", split") + (t.view ? ", through a view" : ""));
          CompareOptions o = base;
          o.epilogue = e;
          compare_with_cpu(
              [&](GpuCase& c) {
                Var x = c.param("x", t.x);
                Var w = c.param("w", {t.out, t.x.back()});
                Shape ys = t.x;
                ys.back() = t.out;
                Var r = c.param("r", ys);
                if (!t.view) return add(r, bias ? linear(x, w, c.param("b", {t.out})) : linear(x, w));
                Var flat = reshape(x, {numel(t.x) / t.x.back(), t.x.back()});
                return add(reshape(bias ? linear(flat, w, c.param("b", {t.out})) : linear(flat, w), ys), r);
              },
              o);
        }
}

namespace {

const std::vector<Mlp>& mlps() {
  static const std::vector<Mlp> v = {
      {"relu", {kOdd.m, kOdd.k}, {kOdd.n, 13}, true},   // odd everywhere
      {"relu", {kOdd.m, kOdd.k}, {40, kOdd.n}, false},  // RELU_AUX, DRELU without bias
      {"gelu", {kOdd.m, kOdd.k}, {40, kOdd.n}, true},   // 40 % 8 == 0: the record fuses
      {"gelu", {kOdd.m, kOdd.k}, {kOdd.n, 13}, true},   // 29 % 8 != 0: gelu stays unfused
      {"gelu", {kOdd.m, kOdd.k}, {40, 24, kOdd.n}, false},
      {"relu", {kLarge.m, kLarge.k}, {kLarge.n, 10}, true},
      {"gelu", {kLarge.m, kLarge.k}, {kLarge.n, 10}, true},
  };
  return v;
}

}  // namespace

TEST(GpuPrecisionEpilogue, MlpsMatchTheCpuForEveryPolicy) {
  for (const Low& low : kLows)
    for (const Mlp& m : mlps())
      for (const Way& way : kWays) {
        SCOPED_TRACE(std::string(low.name) + " " + mlp_name(m) + ", " + way.name);
        CompareOptions o = low.options();
        o.fuse = way.fuse;
        o.epilogue = way.epilogue;
        compare_with_cpu([&](GpuCase& c) { return build_mlp(c, m); }, o);
      }
}

TEST(GpuPrecisionEpilogue, ForwardOnlyPlansMatchTheCpu) {
  for (const Low& low : kLows)
    for (const Mlp& m : mlps())
      for (const Way& way : kWays) {
        if (!way.fuse) continue;
        SCOPED_TRACE(std::string(low.name) + " " + mlp_name(m) + ", " + way.name);
        CompareOptions o = low.options();
        o.gradients = false;  // linear_act: RELU(_BIAS), GELU(_BIAS), no record
        o.epilogue = way.epilogue;
        compare_with_cpu([&](GpuCase& c) { return build_mlp(c, m); }, o);
      }
}

TEST(GpuPrecisionEpilogue, MixedPlanRunsItsGemmsFusedInSixteenBits) {
  for (const Low& low : kLows)
    for (const std::string act : {"relu", "gelu"}) {
      SCOPED_TRACE(std::string(low.name) + " " + act);
      GpuCase c;
      const Mlp m{act, {kLarge.m, kLarge.k}, {kLarge.n, 128, 16}, true};
      Var loss = sum(build_mlp(c, m));
      Model model(c.g,
                  {.seed = 2, .device = Device::cuda, .precision = low.precision, .epilogue = EpiloguePolicy::fused});
      Program p = model.compile({.loss = loss.id(), .gradients = true});
      const Plan& plan = p.plan();
      EXPECT_EQ(count(plan, Op::linear_act_aux), 2) << plan.str();
      EXPECT_EQ(count(plan, Op::matmul_act_grad), 2) << plan.str();
      // Two bias gradients from the activation gradients (bias_grads_into_act_grads).
      EXPECT_EQ(count(plan, Op::linear_grad_weight_bias), 1) << plan.str();
      for (const PlanStep& s : plan.steps) {
        if (!is_gemm(s.op)) continue;
        EXPECT_EQ(s.in[0].type.dtype, low.dtype) << s.name << "\n" << plan.str();
      }
      // Every fused step got its cuBLASLt epilogue at 16 bits, or, for a bf16 linear layer
      // (plain or with GELU's record) or GELU's gradient on sm_90, the GEMM of our own with
      // its epilogue.
      for (auto& [step, what] : p.executable().stats().choices) {
        const PlanStep& s = plan.steps.at(static_cast<size_t>(step));
        if (!is_gemm(s.op)) continue;
        if (what == "wgmma (forced)") {
          EXPECT_EQ(low.dtype, DType::bf16) << s.name;
          const bool gelu_op = s.op == Op::linear_act_aux || s.op == Op::matmul_act_grad;
          EXPECT_TRUE(s.op == Op::linear || (gelu_op && act == "gelu")) << s.name;
        } else {
          EXPECT_EQ(what, "fused (forced)") << s.name;
        }
      }
      p.run();
      for (const char* name : {"fc1.weight", "fc1.bias", "fc3.weight"}) {
        const std::vector<float> g = p.grad_as<float>(name);  // f32 gradients of f32 masters
        EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return std::isfinite(v); })) << name;
      }
    }
}

// ---------------------------------------------------------------------------------------
// Directly: explicit 16-bit inputs, every GEMM op, no precision pass

namespace {

// A graph of 16-bit inputs (random values, rounded as the GPU rounds) and the outputs to
// compare; relu records are compared bit by bit over their meaningful bits only.
struct Direct {
  explicit Direct(DType t) : dtype(t) {}
  DType dtype;
  Graph g;
  std::vector<std::pair<std::string, std::vector<std::byte>>> feeds;
  struct Output {
    Var v;
    DType want;             // its dtype
    int64_t mask_cols = 0;  // a relu record of rows of this many bits; 0: values
  };
  std::vector<Output> outputs;
  std::mt19937_64 rng{29};

  Var input(const std::string& name, Shape shape) {
    Var v = g.input(name, shape, dtype);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<uint16_t> bits(static_cast<size_t>(numel(shape)));
    for (auto& b : bits) b = dtype == DType::bf16 ? float_to_bf16(u(rng)) : float_to_f16(u(rng));
    feeds.emplace_back(name, seam::testing::bytes_of(bits));
    return v;
  }
  Var mask(const std::string& name, int64_t rows, int64_t cols) {
    Shape shape{rows, relu_mask_row_bytes(cols)};
    Var v = g.input(name, shape, DType::u8);
    std::uniform_int_distribution<int> u(0, 255);
    std::vector<uint8_t> bytes(static_cast<size_t>(numel(shape)));
    for (auto& b : bytes) b = static_cast<uint8_t>(u(rng));
    feeds.emplace_back(name, seam::testing::bytes_of(bytes));
    return v;
  }
  void out(Var v) { outputs.push_back({v, dtype, 0}); }
  void out_f32(Var v) { outputs.push_back({v, DType::f32, 0}); }
  void out_mask(Var v, int64_t cols) { outputs.push_back({v, DType::u8, cols}); }
  // The outputs of a fused op built by hand (the fusion pass makes them from graphs).
  std::vector<Var> op(Op o, std::vector<Var> in, Attrs attrs = {}) {
    std::vector<ValueId> ids;
    for (Var& v : in) ids.push_back(v.id());
    std::vector<Var> r;
    for (ValueId id : g.add(o, ids, std::move(attrs))) r.push_back(g.var(id));
    return r;
  }
};

std::vector<float> floats_of(const std::vector<std::byte>& b, DType t) {
  std::vector<float> r;
  if (t == DType::f32) {
    r.resize(b.size() / 4);
    std::memcpy(r.data(), b.data(), r.size() * 4);
    return r;
  }
  SEAM_ASSERT(is_half(t));
  for (size_t i = 0; i + 1 < b.size(); i += 2) {
    uint16_t h;
    std::memcpy(&h, b.data() + i, 2);
    r.push_back(t == DType::bf16 ? bf16_to_float(h) : f16_to_float(h));
  }
  return r;
}

// Bit j of row i of a relu record, for j < cols (padding bits mean nothing).
std::vector<float> mask_bits(const std::vector<std::byte>& b, int64_t cols) {
  const int64_t row_bytes = relu_mask_row_bytes(cols), rows = static_cast<int64_t>(b.size()) / row_bytes;
  std::vector<float> r;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const auto byte = static_cast<unsigned>(b[static_cast<size_t>(i * row_bytes + j / 8)]);
      r.push_back(static_cast<float>(byte >> (j % 8) & 1u));
    }
  return r;
}

struct DirectRun {
  std::vector<std::vector<float>> values;
  std::vector<std::pair<Op, std::string>> choices;  // each GEMM step's variant
};

DirectRun run_direct(const Direct& d, Device dev, EpiloguePolicy e) {
  Model m(d.g, {.seed = 5, .device = dev, .precision = Precision::f32, .epilogue = e});
  CompileOptions co;
  for (const Direct::Output& o : d.outputs) co.outputs.push_back(o.v.id());
  Program p = m.compile(co);
  for (auto& [name, bytes] : d.feeds) p.set_input(name, bytes);
  p.run();
  DirectRun r;
  for (const Direct::Output& o : d.outputs) {
    const std::vector<std::byte> bytes = p.read(o.v.name());
    r.values.push_back(o.mask_cols ? mask_bits(bytes, o.mask_cols) : floats_of(bytes, o.v.dtype()));
  }
  if (dev == Device::cuda)
    for (auto& [step, what] : p.executable().stats().choices)
      r.choices.emplace_back(p.plan().steps.at(static_cast<size_t>(step)).op, what);
  return r;
}

// Every GEMM op on (M, K, N): matmul in three layouts, linear, linear_act and
// linear_act_aux with each activation, matmul_act_grad with each record,
// linear_grad_weight_bias and linear_grad_input_bias; matmul and linear_grad_weight_bias
// also writing f32 from 16-bit inputs (their dtype attribute), linear_grad_input_bias its
// sums. gelu's record needs a width that is a multiple
// of 8: `wide`.
void build_direct(Direct& d, const Mnk& s, int64_t wide) {
  const Attrs relu{{"act", std::string("relu")}}, gelu{{"act", std::string("gelu_tanh")}};
  Var a = d.input("a", {s.m, s.k}), b = d.input("b", {s.k, s.n});
  Var at = d.input("at", {s.k, s.m}), bt = d.input("bt", {s.n, s.k});
  Var bias = d.input("bias", {s.n});
  Var ww = d.input("ww", {wide, s.k}), wbias = d.input("wbias", {wide});
  d.out(matmul(a, b));
  d.out(matmul(a, bt, false, true));
  d.out(matmul(at, b, true, false));
  d.out_f32(d.op(Op::matmul, {a, bt}, {{"transpose_b", int64_t{1}}, {"dtype", std::string("f32")}})[0]);
  d.out(linear(a, bt, bias));
  d.out(linear(a, bt));
  d.out(d.op(Op::linear_act, {a, bt, bias}, relu)[0]);
  d.out(d.op(Op::linear_act, {a, ww, wbias}, gelu)[0]);
  d.out(d.op(Op::linear_act, {a, bt}, gelu)[0]);
  for (bool with_bias : {true, false}) {
    auto r = with_bias ? d.op(Op::linear_act_aux, {a, bt, bias}, relu) : d.op(Op::linear_act_aux, {a, bt}, relu);
    d.out(r[0]);
    d.out_mask(r[1], s.n);
    auto g = with_bias ? d.op(Op::linear_act_aux, {a, ww, wbias}, gelu) : d.op(Op::linear_act_aux, {a, ww}, gelu);
    d.out(g[0]);
    d.out(g[1]);
  }
  // dx [M, K] = (dy [M, N] w [N, K]) * act'(pre [M, K]); gelu's K is `wide`.
  Var dy = d.input("dy", {s.m, s.n});
  d.out(d.op(Op::matmul_act_grad, {dy, bt, d.mask("mask", s.m, s.k)}, relu)[0]);
  Var wg = d.input("wg", {s.n, wide}), pre = d.input("pre", {s.m, wide});
  d.out(d.op(Op::matmul_act_grad, {dy, wg, pre}, gelu)[0]);
  for (Var v : d.op(Op::linear_grad_weight_bias, {dy, a})) d.out(v);
  for (Var v : d.op(Op::linear_grad_weight_bias, {dy, a}, {{"dtype", std::string("f32")}})) d.out_f32(v);
  // dx [M, K] = dy w with dy's column sums, in dy's dtype and in f32.
  for (Var v : d.op(Op::linear_grad_input_bias, {dy, bt})) d.out(v);
  const auto sums32 = d.op(Op::linear_grad_input_bias, {dy, bt}, {{"sums_dtype", std::string("f32")}});
  d.out(sums32[0]);
  d.out_f32(sums32[1]);
}

}  // namespace

TEST(GpuPrecisionKernels, EveryGemmOpOnSixteenBitInputsMatchesTheCpu) {
  const EpiloguePolicy policies[] = {EpiloguePolicy::fastest, EpiloguePolicy::fused, EpiloguePolicy::split,
                                     EpiloguePolicy::split_t};
  const char* names[] = {"fastest", "fused", "split", "split_t"};
  for (const Low& low : kLows)
    for (const Mnk& s : kShapes) {
      const int64_t wide = s.n % 8 == 0 ? s.n : 40;
      Direct d(low.dtype);
      build_direct(d, s, wide);
      const DirectRun cpu = run_direct(d, Device::cpu, EpiloguePolicy::fastest);
      for (size_t p = 0; p < std::size(policies); ++p) {
        SCOPED_TRACE(std::string(low.name) + " " + mnk_name(s) + ", epilogues " + names[p]);
        const DirectRun gpu = run_direct(d, Device::cuda, policies[p]);
        ASSERT_EQ(gpu.values.size(), cpu.values.size());
        for (size_t i = 0; i < cpu.values.size(); ++i) {
          const Direct::Output& o = d.outputs[i];
          const std::string what = "output " + std::to_string(i) + " (" + o.v.name() + ")";
          EXPECT_EQ(o.v.dtype(), o.want) << what;
          seam::gpu_testing::expect_close(gpu.values[i], cpu.values[i], o.mask_cols ? Tolerance::exact() : low.tol(),
                                          what);
        }
        // On the aligned shape cuBLASLt has every epilogue at 16 bits: a forced policy
        // gets what it asked for. On the odd one a fused variant may be missing (cuBLASLt
        // 13 on the H200 has them all) and the step falls back to split, which the values
        // above checked. Where a bf16 step offers the GEMM of our own (sm_90: linear, a
        // plain matmul, linear_grad_input_bias, and linear_act_aux and matmul_act_grad
        // with gelu), fused forces it, and split forces the cuBLASLt GEMM of linear and
        // matmul, whose epilogue is then split.
        if (policies[p] == EpiloguePolicy::fastest || s.n % 8 != 0) continue;
        for (auto& [op, what] : gpu.choices) {
          if (!is_gemm(op)) continue;
          const bool own = low.dtype == DType::bf16 &&
                           (op == Op::linear || op == Op::linear_act_aux || op == Op::matmul_act_grad ||
                            op == Op::matmul || op == Op::linear_grad_input_bias);
          if (own && policies[p] == EpiloguePolicy::fused && what == "wgmma (forced)") continue;
          if (own && (op == Op::linear || op == Op::matmul) && policies[p] != EpiloguePolicy::fused &&
              what == "cublaslt (forced)")
            continue;
          const bool split_t = policies[p] == EpiloguePolicy::split_t && op == Op::linear_grad_weight_bias;
          const std::string want = policies[p] == EpiloguePolicy::fused ? "fused (forced)"
                                   : split_t                            ? "split_t (forced)"
                                                                        : "split (forced)";
          EXPECT_EQ(what, want) << op_name(op);
        }
      }
    }
}

// ---------------------------------------------------------------------------------------
// The algorithm cache keeps 16-bit GEMMs apart from f32 ones

TEST(GpuPrecisionGemmCache, SixteenBitGemmsAreChosenApartFromF32) {
  TempCacheDir home;
  // Shapes no other test uses, so that the f32 model has to choose every algorithm;
  // multiples of 8, so that every variant is there at 16 bits too.
  auto compile_one = [](DType t) {
    Graph g;
    Var x = g.input("x", {48, 88}, t);
    Var w = g.input("w", {56, 88}, t);
    Var b = g.input("b", {56}, t);
    auto r = g.add(Op::linear_act_aux, {x.id(), w.id(), b.id()}, {{"act", std::string("relu")}});
    Var y = matmul(g.var(r[0]), g.input("w2", {56, 24}, t));
    Model m(g, {.seed = 1, .device = Device::cuda});
    Program p = m.compile({.outputs = {y.id(), r[1]}});
    EXPECT_EQ(count(p.plan(), Op::linear_act_aux), 1) << p.plan().str();
  };
  const auto s0 = cuda::gemm_cache_stats();
  compile_one(DType::f32);
  const auto s1 = cuda::gemm_cache_stats();
  EXPECT_GT(s1.tuned, s0.tuned);
  EXPECT_GT(s1.variants_timed, s0.variants_timed);
  std::map<std::string, int64_t> timed;  // variant choices timed at each 16-bit type
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    const auto before = cuda::gemm_cache_stats();
    compile_one(t);
    const auto after = cuda::gemm_cache_stats();
    // The same GEMMs as the f32 model's and at least its variant choices (bf16 adds one:
    // our Hopper GEMM is offered for the plain product), none taken from its choices.
    EXPECT_EQ(after.tuned - before.tuned, s1.tuned - s0.tuned);
    EXPECT_EQ(after.memory_hits, before.memory_hits);
    timed[dtype_name(t)] = static_cast<int64_t>(after.variants_timed - before.variants_timed);
    EXPECT_GE(timed[dtype_name(t)], static_cast<int64_t>(s1.variants_timed - s0.variants_timed));
    EXPECT_EQ(after.variant_hits, before.variant_hits);
  }
  // The file names each GEMM's types (cudaDataType_t: 0 f32, 14 bf16, 2 f16) and each
  // pick its storage type, under a header of the version that has them.
  std::ifstream in(cuda::gemm_cache_path());
  ASSERT_TRUE(in) << cuda::gemm_cache_path();
  std::string header;
  std::getline(in, header);
  EXPECT_NE(header.find("cache v2;"), std::string::npos) << header;
  int f32 = 0, bf16 = 0, f16 = 0, bf16_picks = 0, f16_picks = 0;
  for (std::string l; std::getline(in, l);) {
    f32 += l.find(" type=0 dtype=0 ") != std::string::npos;
    bf16 += l.find(" type=14 dtype=14 ") != std::string::npos;
    f16 += l.find(" type=2 dtype=2 ") != std::string::npos;
    // A pick's key: the step's, its storage type, then the variants it was timed among.
    bf16_picks += l.rfind("pick ", 0) == 0 && l.find(":bf16:") != std::string::npos;
    f16_picks += l.rfind("pick ", 0) == 0 && l.find(":f16:") != std::string::npos;
  }
  EXPECT_GT(f32, 0);
  EXPECT_EQ(bf16, f32);
  EXPECT_EQ(f16, f32);
  EXPECT_EQ(bf16_picks, timed["bf16"]);  // a pick a timed choice, under its own type
  EXPECT_EQ(f16_picks, timed["f16"]);
}

// ---------------------------------------------------------------------------------------
// A residual and a bias added by one GEMM at a language model's shapes

// linear_add with a bias (cuBLASLt's BIAS epilogue with beta = 1, or on sm_90 the GEMM of
// our own with its bias_add epilogue) and without on GPT-2 124M's residual
// projections, 16384 tokens of 768 and of 3072 features into 768: the shapes at which
// cuBLASLt picks its own kernels, not the small ones above. A CPU model of this size takes
// minutes, so every 61st row is checked on the host, in double, from the same bf16 inputs.
TEST(GpuPrecisionMatmul, BiasAndResidualAddedByTheGemmAtLanguageModelShapes) {
  constexpr int64_t kRows = 16384, kOut = 768, kStride = 61;
  for (int64_t in : {int64_t{768}, int64_t{3072}})
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(std::to_string(kRows) + " x " + std::to_string(in) + " -> " + std::to_string(kOut) +
                   (with_bias ? " with bias" : " without bias"));
      Direct d(DType::bf16);
      Var x = d.input("x", {kRows, in}), w = d.input("w", {kOut, in}), r = d.input("r", {kRows, kOut});
      d.out(with_bias ? d.op(Op::linear_add, {x, w, r, d.input("b", {kOut})})[0] : d.op(Op::linear_add, {x, w, r})[0]);
      const DirectRun gpu = run_direct(d, Device::cuda, EpiloguePolicy::fused);
      // The policy forces the GEMM of our own where it takes the step (a bias, sm_90),
      // cuBLASLt's fused epilogue elsewhere.
      const bool ours = with_bias && seam::cuda::wgmma_gemm_runs_here();
      for (auto& [op, what] : gpu.choices) {
        if (op == Op::linear_add) {
          EXPECT_EQ(what, ours ? "wgmma (forced)" : "fused (forced)");
        }
      }
      auto fed = [&](const char* name) {
        for (auto& [n, bytes] : d.feeds)
          if (n == name) return floats_of(bytes, DType::bf16);
        ADD_FAILURE() << name;
        return std::vector<float>{};
      };
      const std::vector<float> xs = fed("x"), ws = fed("w"), rs = fed("r");
      const std::vector<float> bs = with_bias ? fed("b") : std::vector<float>(kOut, 0.0f);
      std::vector<float> got, want;
      for (int64_t i = 0; i < kRows; i += kStride)
        for (int64_t j = 0; j < kOut; ++j) {
          double s = double{rs[static_cast<size_t>(i * kOut + j)]} + bs[static_cast<size_t>(j)];
          for (int64_t k = 0; k < in; ++k)
            s += double{xs[static_cast<size_t>(i * in + k)]} * ws[static_cast<size_t>(j * in + k)];
          want.push_back(static_cast<float>(s));
          got.push_back(gpu.values[0][static_cast<size_t>(i * kOut + j)]);
        }
      seam::gpu_testing::expect_close(got, want, Tolerance::bf16(), "sampled rows of y");
    }
}
