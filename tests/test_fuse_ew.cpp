// Elementwise fusion: the program text, and fused plans that compute bitwise what the
// unfused ones do (values and gradients) on random elementwise graphs, keep the names of
// the values read outside, and never close a cycle.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstring>
#include <random>

#include "backend/backend.h"
#include "common/half.h"
#ifdef SEAM_HAS_CUDA
#include "backend/cuda/codegen.h"
#endif
#include "ops/fused_ew.h"
#include "plan/explain.h"
#include "fuse_check.h"
#include "test_util.h"
#include "seam/seam.h"

using namespace seam;
using seam::testing::count;
using seam::testing::expect_kernels_compile;
using seam::testing::expect_same_bits;

namespace {

void expect_parse_error(const std::string& text, const std::string& part) {
  try {
    (void)EwProgram::parse(text);
    ADD_FAILURE() << "'" << text << "' parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at character"), std::string::npos) << e.what();
  }
}

// Building a graph by `build` throws an error naming the node (a "fused..." one) and `part`.
void expect_node_error(const std::function<void(Graph&)>& build, const std::string& part) {
  Graph g;
  try {
    build(g);
    ADD_FAILURE() << "no error; expected one containing '" << part << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
    EXPECT_NE(msg.find("fused"), std::string::npos) << msg;
  }
}

}  // namespace

TEST(FusedProgram, TextRoundTripsAndErrorsNameThePlace) {
  const std::string text = "scale[0.10000000000000001](i0);mul(t0,i1);relu_grad(t1,i0);pow[-3.5](t2)->t1,t3";
  EwProgram p = EwProgram::parse(text);
  EXPECT_EQ(p.code.size(), 4u);
  EXPECT_EQ(p.inputs, 2);
  EXPECT_EQ(p.code[0].p, 0.1);
  EXPECT_EQ(p.code[3].p, -3.5);
  EXPECT_EQ(p.str(), text);
  EXPECT_EQ(EwProgram::parse(p.str()).str(), text);
  expect_parse_error("relu(i0)", "no '->'");
  expect_parse_error("frobnicate(i0)->t0", "'frobnicate' is not an elementwise op");
  expect_parse_error("softmax(i0)->t0", "not an elementwise op");
  expect_parse_error("relu(i0,i1)->t0", "takes 1 operand(s), got 2");
  expect_parse_error("relu(t0)->t0", "t0 is not defined yet");
  expect_parse_error("relu(i0)->t1", "t1 is not defined yet");
  expect_parse_error("scale(i0)->t0", "needs its factor");
  expect_parse_error("scale[abc](i0)->t0", "'abc' is not a number");
  expect_parse_error("relu(i0)relu(t0)->t1", "expected ';'");
  expect_parse_error("->", "needs an instruction");
  // Outputs that end in a reduction.
  const std::string reducing = "mul(i0,i1);relu_grad(t0,i2)->t1,sum(t0),mean(t1)";
  EwProgram r = EwProgram::parse(reducing);
  ASSERT_EQ(r.reduce.size(), 3u);
  EXPECT_EQ(r.reduce[0], EwReduce::none);
  EXPECT_EQ(r.reduce[1], EwReduce::sum);
  EXPECT_EQ(r.reduce[2], EwReduce::mean);
  EXPECT_TRUE(r.reduces());
  EXPECT_FALSE(p.reduces());
  EXPECT_EQ(r.str(), reducing);
  expect_parse_error("relu(i0)->sum(t0", "expected ')'");
  // Ending in a layer norm: three outputs for it.
  const std::string normed = "add(i0,i1)->t0,layer_norm[1.0000000000000001e-05](t0,i2,i3)";
  EwProgram ln = EwProgram::parse(normed);
  ASSERT_EQ(ln.outputs.size(), 4u);  // t0 stored, then y, mean, rstd
  EXPECT_TRUE(ln.normalizes());
  EXPECT_EQ(ln.reduce[1], EwReduce::ln_y);
  EXPECT_EQ(ln.reduce[3], EwReduce::ln_rstd);
  EXPECT_EQ(ln.ln_gamma, 2);
  EXPECT_EQ(ln.inputs, 4);
  EXPECT_EQ(ln.str(), normed);
  expect_parse_error("relu(i0)->layer_norm[1e-5](t0,i1,i2),sum(t0)", "not both");
  expect_parse_error("relu(i0)->layer_norm[1e-5](t0,t0,i1)", "expected an input");
  expect_parse_error("relu(i0)->layer_norm[1e-5](t0,i1,i2),layer_norm[1e-5](t0,i1,i2)", "a second layer norm");
  expect_parse_error("relu(i0)->sum(i0)", "expected a temp");
}

// The bytes the model weighs: one kernel against one kernel per op, counted by hand.
TEST(FusedProgram, TrafficCountsBothWaysOfRunningAGroup) {
  const TensorType rows{DType::f32, {64, 32}}, bias{DType::f32, {32}};
  // add with a broadcast bias, tanh, scale: 3 kernels of 8 KB passes against one.
  EwTraffic t = ew_traffic(EwProgram::parse("add(i0,i1);tanh(t0);scale[0.5](t1)->t2"), {rows, bias}, {});
  EXPECT_EQ(t.fused_bytes, 8192 + 128 + 8192);
  EXPECT_EQ(t.split_bytes, (8192 + 128 + 8192) + 2 * 8192 + 2 * 8192);
  EXPECT_EQ(t.split_kernels, 3);
  EXPECT_TRUE(fused_clearly_faster(t));
  // A product summed over the batch: the split writes and rereads the product; just
  // short of half, so the GPU times both.
  t = ew_traffic(EwProgram::parse("mul(i0,i1)->sum(t0)"), {rows, rows}, {0});
  EXPECT_EQ(t.fused_bytes, 2 * 8192 + 128);
  EXPECT_EQ(t.split_bytes, 3 * 8192 + 8192 + 128);
  EXPECT_EQ(t.split_kernels, 2);
  EXPECT_FALSE(fused_clearly_faster(t));
  // Residual add + layer norm, the sum also stored: y, mean and rstd from both.
  const TensorType x{DType::f32, {8, 16}}, g{DType::f32, {16}};
  t = ew_traffic(EwProgram::parse("add(i0,i1)->t0,layer_norm[1e-5](t0,i2,i3)"), {x, x, g, g}, {});
  EXPECT_EQ(t.fused_bytes, (512 + 512 + 64 + 64) + 512 + 512 + 32 + 32);
  EXPECT_EQ(t.split_bytes, 3 * 512 + (512 + 64 + 64 + 512 + 32 + 32));
  EXPECT_EQ(t.split_kernels, 2);
  EXPECT_FALSE(fused_clearly_faster(t));
}

// Random chains over every elementwise op and its gradients, with broadcast operands;
// the gradients (chains themselves) fuse too.
TEST(FuseElementwise, RandomGraphsFuseAndChangeNoBit) {
  std::mt19937_64 rng(11);
  int fused_total = 0, normed_total = 0, summed_total = 0;
  for (int trial = 0; trial < 60; ++trial) {
    Graph g;
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 5), cols = 1 + static_cast<int64_t>(rng() % 7);
    std::vector<Var> pool = {g.param("a", {rows, cols}, Init::uniform(0.1, 2)),
                             g.param("b", {rows, cols}, Init::uniform(-2, 2)),
                             g.param("row", {cols}, Init::uniform(0.5, 1.5)),
                             g.input("x", {rows, cols}), g.input("col", {rows, 1})};
    auto pick = [&] { return pool[rng() % pool.size()]; };
    auto full_shape = [&] {
      for (int k = 0; k < 20; ++k) {
        Var v = pick();
        if (v.shape() == Shape{rows, cols}) return v;
      }
      return pool[0];
    };
    std::vector<Var> made;
    const int steps = 3 + static_cast<int>(rng() % 10);
    for (int i = 0; i < steps; ++i) {
      Var v;
      switch (rng() % 16) {
        case 0: v = relu(full_shape()); break;
        case 1: v = leaky_relu(full_shape(), 0.1); break;
        case 2: v = sigmoid(full_shape()); break;
        case 3: v = seam::tanh(full_shape()); break;
        case 4: v = gelu(full_shape(), rng() % 2 == 0); break;
        case 5: v = silu(full_shape()); break;
        case 6: v = seam::exp(scale(full_shape(), 0.25)); break;
        case 7: v = seam::log(add(seam::exp(full_shape()), full_shape())); break;
        case 8: v = seam::sqrt(add(mul(full_shape(), full_shape()), pick())); break;
        case 9: v = pow(full_shape(), 2.0); break;
        case 10: v = add(full_shape(), pick()); break;
        case 11: v = sub(pick(), full_shape()); break;
        case 12: v = mul(full_shape(), pick()); break;
        case 13: v = div(full_shape(), add(pool[0], pool[2])); break;  // a, row > 0
        case 14: v = maximum(full_shape(), pick()); break;
        default: v = minimum(neg(full_shape()), pick()); break;
      }
      pool.push_back(v);
      made.push_back(v);
    }
    Var loss = sum(made.back());
    // One value from the middle read outside as well.
    const Var middle = made[made.size() / 2];
    loss = add(loss, mean(middle));
    // A layer norm of a chain value now and then, with its statistics read by its gradient.
    if (rng() % 3 == 0) {
      Var gamma = g.param("lng", {cols}, Init::uniform(0.5, 1.5)), beta = g.param("lnb", {cols}, Init::uniform(-1, 1));
      loss = add(loss, sum(seam::tanh(layer_norm(made[rng() % made.size()], gamma, beta, 1e-5))));
    }
    // Reductions of chain values over random axes, each one's result used again.
    for (int r = static_cast<int>(rng() % 3); r > 0; --r) {
      const Var v = made[rng() % made.size()];
      std::vector<int64_t> axes;
      if (rng() % 2) axes.push_back(static_cast<int64_t>(rng() % 2) - (rng() % 2 ? 2 : 0));
      const bool keep = rng() % 2;
      Var red = rng() % 2 ? sum(v, axes, keep) : seam::mean(v, axes, keep);
      loss = add(loss, sum(seam::tanh(red)));
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    const Plan plan = expect_same_bits(g, loss, {middle}, "trial " + std::to_string(trial));
    fused_total += count(plan, Op::fused_elementwise);
    for (auto& st : plan.steps)
      if (st.op == Op::fused_elementwise) {
        const EwProgram& p = EwProgram::cached(st.attrs.s("program"));
        normed_total += p.normalizes();
        summed_total += p.reduces();
      }
  }
  EXPECT_GT(fused_total, 60);  // most graphs fuse something, forward or backward
  EXPECT_GT(normed_total, 5);  // and some end in a layer norm
  EXPECT_GT(summed_total, 20);  // or in sums
}

// bias add -> gelu -> residual add -> scale, with the gelu read by the caller too: one
// kernel whose outputs are what is read elsewhere, the gelu's value under its own name.
TEST(FuseElementwise, ValuesReadOutsideKeepTheirNames) {
  Graph g;
  Var x = g.input("x", {8, 16});
  Var bias = g.param("bias", {16}, Init::uniform(-1, 1));
  Var h = gelu(add(x, bias), true);
  Var y = scale(add(h, x), 0.5);
  const Plan plan = expect_same_bits(g, sum(y), {h}, "mlp block");
  int groups = 0;
  for (auto& s : plan.steps)
    if (s.op == Op::fused_elementwise) {
      ++groups;
      if (groups == 1) {
        // x + bias (gelu's gradient reads it), h (read outside) and y.
        EXPECT_EQ(s.out.size(), 3u) << plan.str();
        EXPECT_NE(s.attrs.s("program").find("gelu_tanh"), std::string::npos);
      }
    }
  EXPECT_GE(groups, 1) << plan.str();
  EXPECT_NE(plan.output(h.name()), nullptr) << plan.str();
  EXPECT_EQ(count(plan, Op::add) + count(plan, Op::gelu_tanh) + count(plan, Op::scale), 0) << plan.str();
}

// t = relu(x); s = sum(t, over the last dim); u = t * s: u cannot join t's group (s needs
// the whole group first); a second chain through both stays acyclic too.
TEST(FuseElementwise, AChainThatWouldCloseACycleStaysApart) {
  Graph g;
  Var x = g.param("x", {4, 6}, Init::uniform(-1, 1));
  Var t = seam::tanh(relu(x));
  Var s = sum(t, {1}, /*keepdims=*/true);
  Var u = sigmoid(mul(t, s));
  Var v = add(u, t);
  const Plan plan = expect_same_bits(g, sum(v), {}, "cycle");
  EXPECT_GE(count(plan, Op::fused_elementwise), 2) << plan.str();
}

// The backward of y = relu(x * gamma + beta) with per-feature gamma and beta: gamma's
// gradient is sum over rows of dy * x, beta's the sum of dy. Both sums end the group that
// computes dy through relu, so no [rows, features] gradient reaches memory.
TEST(FuseElementwise, BiasGradientSumsEndTheGroup) {
  Graph g;
  Var x = g.input("x", {16, 12});
  Var gamma = g.param("gamma", {12}, Init::uniform(0.5, 1.5));
  Var beta = g.param("beta", {12}, Init::uniform(-1, 1));
  Var y = seam::tanh(relu(add(mul(x, gamma), beta)));
  const Plan plan = expect_same_bits(g, sum(y), {}, "affine");
  // The group could also end in the loss's sum over every axis; the axes two of its
  // reductions share win, and the loss sums the stored y.
  EXPECT_EQ(count(plan, Op::sum), 1) << plan.str();
  int reducing = 0;
  for (auto& s : plan.steps)
    if (s.op == Op::fused_elementwise && EwProgram::parse(s.attrs.s("program")).reduces()) {
      ++reducing;
      EXPECT_EQ(s.attrs.ints("axes"), (std::vector<int64_t>{0})) << plan.str();
      int full = 0;
      for (auto& o : s.out) full += o.type.shape == Shape{16, 12};
      EXPECT_EQ(full, 1) << "y alone is stored at full size\n" << plan.str();
    }
  EXPECT_EQ(reducing, 1) << plan.str();
  expect_kernels_compile(plan);
  // The kernel table says that the group sums on the way.
  const std::string text = explain_plan(plan, plan, DeviceModel{}, false);
  EXPECT_NE(text.find("2 summed over axes [0] on the way"), std::string::npos) << text;
}

// u = silu(gate) * up, then a GEMM: u's gradient comes from the GEMM, and the gradients
// for gate and up both read it. They share no producer group, but read the same operand:
// siblings, one kernel.
TEST(FuseElementwise, SiblingsReadingOneOperandShareAKernel) {
  Graph g;
  Var gate = g.param("gate", {8, 12}, Init::uniform(-2, 2)), up = g.param("up", {8, 12}, Init::uniform(-2, 2));
  Var w = g.param("w", {12, 5}, Init::uniform(-1, 1));
  Var y = matmul(mul(silu(gate), up), w);
  const Plan plan = expect_same_bits(g, sum(y), {}, "gated");
  bool together = false;
  for (auto& s : plan.steps)
    if (s.op == Op::fused_elementwise) {
      const std::string prog = s.attrs.s("program");
      together = together || (prog.find("mul_grad_a") != std::string::npos && prog.find("mul_grad_b") != std::string::npos);
    }
  EXPECT_TRUE(together) << plan.str();
  EXPECT_EQ(count(plan, Op::mul_grad_a) + count(plan, Op::mul_grad_b), 0) << plan.str();
}

// Broadcast operands contiguous along the rows ([16]) and constant along them ([8, 1]),
// with rows of a multiple of 4 (vectorized) and not: same bits as unfused, and with CUDA
// in the build every generated kernel compiles.
TEST(FuseElementwise, BroadcastOperandsOfEveryKind) {
  for (int64_t cols : {16, 7}) {
    Graph g;
    Var x = g.input("x", {8, cols});
    Var row = g.param("row", {cols}, Init::uniform(0.5, 1.5)), col = g.param("col", {8, 1}, Init::uniform(-1, 1));
    Var y = seam::tanh(add(mul(x, row), col));
    const Plan plan = expect_same_bits(g, sum(mul(y, y)), {}, "broadcast " + std::to_string(cols));
    EXPECT_GE(count(plan, Op::fused_elementwise), 1) << plan.str();
    expect_kernels_compile(plan);
    // Forward alone: no reduction ends the group, so it walks elementwise.
    Model m(g);
    Program fwd = m.compile({.outputs = {y.id()}});
    EXPECT_EQ(count(fwd.plan(), Op::fused_elementwise), 1) << fwd.plan().str();
    expect_kernels_compile(fwd.plan());
  }
}

// h = x + r * s feeds a layer norm and is read on (a residual stream): one kernel computes
// h, stores it, and normalizes each row; the layer norm's gradient reads the statistics
// it stored.
TEST(FuseElementwise, ResidualAddAndLayerNormAreOneKernel) {
  Graph g;
  Var x = g.input("x", {6, 16});
  Var r = g.param("r", {6, 16}, Init::uniform(-1, 1)), s = g.param("s", {16}, Init::uniform(0.5, 1.5));
  Var h = add(x, mul(r, s));
  Var y = layer_norm(h, g.param("gamma", {16}, Init::uniform(0.5, 1.5)), g.param("beta", {16}, Init::uniform(-1, 1)),
                     1e-5);
  const Plan plan = expect_same_bits(g, add(sum(seam::tanh(y)), mean(h)), {}, "residual + layer norm");
  EXPECT_EQ(count(plan, Op::layer_norm), 0) << plan.str();
  bool normed = false;
  for (auto& st : plan.steps)
    if (st.op == Op::fused_elementwise && EwProgram::parse(st.attrs.s("program")).normalizes()) {
      normed = true;
      EXPECT_EQ(st.out.size(), 4u) << "h, y, mean, rstd\n" << plan.str();
    }
  EXPECT_TRUE(normed) << plan.str();
  expect_kernels_compile(plan);
  const std::string text = explain_plan(plan, plan, DeviceModel{}, false);
  EXPECT_NE(text.find("add+layer_norm"), std::string::npos) << text;
  EXPECT_NE(text.find("normalized row by row (layer norm)"), std::string::npos) << text;
}

#ifdef SEAM_HAS_CUDA
// Every walk of the generated kernels compiles with 64-bit index arithmetic too (index
// spaces of 2^31 elements and more), vectorized or not, rows in registers or not; and
// with 16-bit operands, on sm_90 and before sm_80 (bf16 rounded on the bits there). The
// dtypes are part of the kernel's key: one program at two storage types is two kernels.
TEST(FuseElementwise, GeneratedKernelsCompileWithWideIndicesAndEveryStorageType) {
  struct Case {
    const char* program;
    cuda::EwLayout layout;
    int vec;
    int row_values = 0;
    std::vector<DType> in = {}, out = {};  // empty: f32
  };
  const DType b = DType::bf16, h = DType::f16, f = DType::f32;
  const cuda::EwLayout ew = cuda::EwLayout::elementwise, cols = cuda::EwLayout::columns, norm = cuda::EwLayout::norm;
  const Case cases[] = {
      {"mul(i0,i1);tanh(t0)->t1", ew, 4},
      {"mul(i0,i1);tanh(t0)->t1", ew, 1},
      {"mul(i0,i1);relu_grad(t0,i1)->t1,sum(t1),sum(t0)", cols, 4},
      {"mul(i0,i1);relu_grad(t0,i1)->t1,mean(t1)", cols, 1},
      {"mul(i0,i1);relu_grad(t0,i1)->sum(t1)", cuda::EwLayout::rows, 1},
      {"add(i0,i1)->t0,layer_norm[1.0000000000000001e-05](t0,i2,i3)", norm, 1},
      {"add(i0,i1)->t0,layer_norm[1.0000000000000001e-05](t0,i2,i3)", norm, 1, 32},  // in registers
      {"add(i0,i1);gelu(t0)->layer_norm[1.0000000000000001e-05](t1,i2,i3)", norm, 1, 4},
      {"cast[f32](i0);add(t0,i1);cast[bf16](t1);tanh(t2)->t2,t3", ew, 4, 0, {b, f}, {b, f}},
      {"mul(i0,i1);cast[f16](t0)->t1", ew, 1, 0, {h, h}, {h}},
      {"mul(i0,i1);cast[bf16](t0);relu_grad(t1,i1)->t2,sum(t2),sum(t0)", cols, 4, 0, {b, b}, {b, f, b}},
      {"mul(i0,i1);cast[f16](t0)->mean(t1)", cols, 1, 0, {h, f}, {h}},
      {"mul(i0,i1)->sum(t0)", cuda::EwLayout::rows, 1, 0, {b, b}, {f}},
      {"add(i0,i1);cast[bf16](t0)->t1,layer_norm[1e-05](t1,i2,i3)", norm, 1, 0, {b, b, f, f}, {b, b, f, f}},
      {"add(i0,i1);cast[f16](t0)->layer_norm[1e-05](t1,i2,i3)", norm, 1, 8, {h, h, h, h}, {h, f, f}},
      // f32 data, y stored in bf16 (a cast absorbed), long rows: computed again each pass
      {"add(i0,i1)->t0,layer_norm[1e-05](t0,i2,i3)", norm, 1, 0, {f, f, f, f}, {f, b, f, f}},
      // dropout masks in every layout: vector lanes, column and row sums, a layer norm
      {"relu(i0);dropout[0.10000000000000001,7](t0)->t1", ew, 4},
      {"relu(i0);dropout[0.5,3](t0);cast[bf16](t1)->t2", ew, 1, 0, {b}, {b}},
      {"dropout_grad[0.20000000000000001,5](i0);relu_grad(t0,i1)->t1,sum(t1)", cols, 4},
      {"dropout_grad[0.20000000000000001,5](i0)->sum(t0)", cuda::EwLayout::rows, 1},
      {"dropout[0.10000000000000001,2](i0);add(t0,i1)->t1,layer_norm[1e-05](t1,i2,i3)", norm, 1, 8},
      {"dropout[0.10000000000000001,2](i0);add(t0,i1)->t1,layer_norm[1e-05](t1,i2,i3)", norm, 1, 0, {b, b, f, f},
       {b, b, f, f}},
  };
  for (const Case& c : cases) {
    cuda::EwSignature s;
    s.program = c.program;
    s.strided = {false, true, true, true};
    s.strided.resize(static_cast<size_t>(EwProgram::cached(c.program).inputs));
    s.vec = c.vec;
    if (c.vec == 4) s.splat.assign(s.strided.size(), false);
    s.layout = c.layout;
    s.row_values = c.row_values;
    const cuda::EwSignature all_f32 = s;
    s.in_dtypes = c.in;
    s.out_dtypes = c.out;
    if (!c.in.empty()) {
      EXPECT_NE(all_f32.hash(), s.hash()) << c.program;
    }
    for (int arch : c.in.empty() ? std::vector<int>{90} : std::vector<int>{90, 75})
      for (bool idx32 : {true, false}) {
        s.arch = arch;
        s.idx32 = idx32;
        const cuda::GeneratedKernel k = cuda::compile_ew(s);
        const std::string what = std::string(c.program) + " sm" + std::to_string(arch) + (idx32 ? " i32" : " i64");
        EXPECT_GT(k.registers, 0) << what << "\n" << k.log;
        EXPECT_EQ(k.spill_bytes, 0) << what << "\n" << k.log;
      }
  }
}
#endif

// Two reductions of one group's value over different axes: the first ends the group, the
// second stays a sum of the stored value.
TEST(FuseElementwise, OneGroupReducesOverOneSetOfAxes) {
  Graph g;
  Var x = g.param("x", {5, 7}, Init::uniform(-1, 1));
  Var t = seam::exp(relu(x));
  Var rows = sum(t, {1}, /*keepdims=*/true), cols = seam::mean(t, {0});
  const Plan plan = expect_same_bits(g, add(sum(seam::tanh(rows)), sum(seam::sqrt(cols))), {}, "two reductions");
  EXPECT_GE(count(plan, Op::sum) + count(plan, Op::mean), 1) << plan.str();
  expect_kernels_compile(plan);
}

// `seam plan`'s table: each kernel with what it covers and why, and the totals against the
// unfused plan; with CUDA in the build, the generated kernel's registers from NVRTC.
TEST(ExplainPlan, NamesWhatEachKernelCoversAndTheSavings) {
  Graph g;
  Var x = g.input("x", {64, 32});
  Var bias = g.param("bias", {32}, Init::uniform(-1, 1));
  Var y = scale(seam::tanh(add(x, bias)), 0.5);
  Var loss = sum(y);
  Model m(g);
  Program fused = m.compile({.loss = loss.id(), .gradients = true});
  Program plain = m.compile({.loss = loss.id(), .gradients = true, .fuse = false});
  const std::string text = explain_plan(fused.plan(), plain.plan(), DeviceModel{}, true);
  EXPECT_NE(text.find("add+tanh+scale"), std::string::npos) << text;
  EXPECT_NE(text.find("fused: 3 elementwise ops in one pass"), std::string::npos) << text;
  EXPECT_NE(text.find("kept over one kernel per op by the model: 0."), std::string::npos) << text;
  const size_t at = text.find("fusion: ");
  ASSERT_NE(at, std::string::npos) << text;
  int before = 0, after = 0;
  ASSERT_EQ(std::sscanf(text.c_str() + at, "fusion: %d -> %d kernels", &before, &after), 2) << text;
  EXPECT_EQ(before, static_cast<int>(plain.plan().steps.size()));
  EXPECT_EQ(after, static_cast<int>(fused.plan().steps.size()));
  EXPECT_LT(after, before);
  // With measured times: a column of them and their sum.
  std::vector<double> ms(fused.plan().steps.size(), 0.002);
  const std::string timed = explain_plan(fused.plan(), plain.plan(), DeviceModel{}, false, ms);
  EXPECT_NE(timed.find("meas. us"), std::string::npos) << timed;
  EXPECT_NE(timed.find("measured: " + std::to_string(2 * ms.size()) + ".0 us"), std::string::npos) << timed;
#ifdef SEAM_HAS_CUDA
  // The registers column holds a number for the generated kernel.
  const size_t row = text.find("fused_elementwise");
  ASSERT_NE(row, std::string::npos) << text;
  const std::string line = text.substr(row, text.find('\n', row) - row);
  char dashes[32];
  std::snprintf(dashes, sizeof dashes, " %5s %10s  ", "-", "-");
  EXPECT_NE(text.find(dashes), std::string::npos) << text;  // the library steps have none
  EXPECT_EQ(line.find(dashes), std::string::npos) << line;
#endif
}

// A fused_elementwise node built by hand is checked like any op: its program, the inputs
// it reads, their shapes and dtypes, each error naming the node.
TEST(FusedProgram, TheOpRejectsBadProgramsAndOperands) {
  const auto expect_error = expect_node_error;
  auto add = [](Graph& g, const std::vector<Var>& xs, const std::string& program) {
    std::vector<ValueId> ids;
    for (Var v : xs) ids.push_back(v.id());
    g.add_named(Op::fused_elementwise, ids, {{"program", program}}, "fused");
  };
  expect_error([&](Graph& g) { add(g, {g.input("a", {4, 3}), g.input("b", {4, 3})}, "add(i0,i2)->t0"); },
               "reads input i2 of 2");
  expect_error([&](Graph& g) { add(g, {g.input("a", {4, 3}), g.input("b", {4, 2})}, "add(i0,i1)->t0"); },
               "do not broadcast");
  expect_error(
      [&](Graph& g) { add(g, {g.input("a", {4, 3}), g.input("b", {4, 3}, DType::f64)}, "add(i0,i1)->t0"); },
      "differ in dtype");
  expect_error([&](Graph& g) { add(g, {g.input("a", {4, 3})}, "relu(i0)"); }, "no '->'");
  expect_error([&](Graph& g) { add(g, {g.input("a", {4, 3}, DType::i32)}, "relu(i0)->t0"); }, "i32");
  expect_error(
      [&](Graph& g) {
        g.add_named(Op::fused_elementwise, {g.input("a", {4, 3}).id()}, {{"program", "relu(i0)->t0"}, {"axes", std::vector<int64_t>{0}}},
                    "fused");
      },
      "no output of the program is a sum or mean");
  expect_error(
      [&](Graph& g) {
        g.add_named(Op::fused_elementwise, {g.input("a", {4, 3}).id()},
                    {{"program", "relu(i0)->sum(t0)"}, {"axes", std::vector<int64_t>{2}}}, "fused");
      },
      "axis 2 is out of range");
  // And a good one: outputs at the broadcast shape, one per listed temp, named by the node.
  Graph g;
  Var a = g.input("a", {4, 3}), b = g.input("b", {3});
  auto out = g.add_named(Op::fused_elementwise, {a.id(), b.id()}, {{"program", "mul(i0,i1);relu(t0)->t0,t1"}},
                         std::vector<std::string>{"prod", "act"});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(g.value(out[1]).type.shape, (Shape{4, 3}));
  EXPECT_EQ(g.value(out[1]).name, "act");
  // Reduced outputs at sum's shape.
  auto red = g.add_named(Op::fused_elementwise, {a.id(), b.id()},
                         {{"program", "mul(i0,i1)->t0,sum(t0),mean(t0)"}, {"axes", std::vector<int64_t>{0}}},
                         std::vector<std::string>{"p", "s", "m"});
  EXPECT_EQ(g.value(red[0]).type.shape, (Shape{4, 3}));
  EXPECT_EQ(g.value(red[1]).type.shape, (Shape{3}));
  EXPECT_EQ(g.value(red[2]).type.shape, (Shape{3}));
}

// Mixed precision: cast[<dtype>] in the text, each temp's dtype as one kernel per op would
// store it, and the bytes each way counted at each operand's own size.
TEST(FusedProgram, CastsRoundTripAndValuesKeepTheirDtypes) {
  const std::string text = "cast[f32](i0);add(t0,i1);cast[bf16](t1);mul(t2,i0);cast[f16](t3)->t2,t4";
  const EwProgram p = EwProgram::parse(text);
  ASSERT_EQ(p.code.size(), 5u);
  EXPECT_EQ(p.code[0].op, Op::cast);
  EXPECT_EQ(p.code[0].dtype, DType::f32);
  EXPECT_EQ(p.code[2].dtype, DType::bf16);
  EXPECT_EQ(p.code[4].dtype, DType::f16);
  EXPECT_EQ(p.str(), text);
  EXPECT_EQ(ew_arity(Op::cast), 1);
  EXPECT_EQ(std::string(ew_attr(Op::cast)), "dtype");
  // bf16 in, f32 bias: the add is f32, the cast's bf16, and a bf16 times bf16 stays bf16.
  EXPECT_EQ(p.temp_dtypes({DType::bf16, DType::f32}),
            (std::vector<DType>{DType::f32, DType::f32, DType::bf16, DType::bf16, DType::f16}));
  // Operands that disagree compute in f32.
  EXPECT_EQ(EwProgram::parse("add(i0,i1)->t0").temp_dtypes({DType::bf16, DType::f16}), std::vector<DType>{DType::f32});
  expect_parse_error("cast(i0)->t0", "cast needs its dtype in [...]");
  expect_parse_error("cast[i32](i0)->t0", "'i32' is not a float dtype");
  expect_parse_error("cast[bf17](i0)->t0", "'bf17' is not a float dtype");
  // The outputs' dtypes: listed, or by default the first input's (f32 statistics of a
  // 16-bit layer norm).
  const EwProgram ln = EwProgram::parse("add(i0,i1)->t0,layer_norm[1e-05](t0,i2,i3)");
  EXPECT_EQ(ew_output_dtypes(ln, "", DType::bf16),
            (std::vector<DType>{DType::bf16, DType::bf16, DType::f32, DType::f32}));
  EXPECT_EQ(ew_output_dtypes(p, "f32,f16", DType::bf16), (std::vector<DType>{DType::f32, DType::f16}));
  EXPECT_EQ(ew_dtypes_str({DType::bf16, DType::f32}), "bf16,f32");
  EXPECT_THROW(ew_output_dtypes(p, "f32", DType::f32), Error);

  // bf16 [64, 32] in (4 KB), an f32 bias: the split casts to f32 (4 + 8 KB), adds (8 +
  // 0.125 + 8 KB) and casts back (8 + 4 KB); one kernel reads 4.125 KB and writes 4.
  const TensorType x{DType::bf16, {64, 32}}, bias{DType::f32, {32}};
  EwTraffic t = ew_traffic(EwProgram::parse("cast[f32](i0);add(t0,i1);cast[bf16](t1)->t2"), {x, bias}, {},
                           {DType::bf16});
  EXPECT_EQ(t.fused_bytes, 4096 + 128 + 4096);
  EXPECT_EQ(t.split_bytes, (4096 + 8192) + (8192 + 128 + 8192) + (8192 + 4096));
  EXPECT_EQ(t.split_kernels, 3);
  // The rounding after a bf16 op is the op's own store, no kernel; a sum of bf16 values
  // stored in f32.
  t = ew_traffic(EwProgram::parse("mul(i0,i1);cast[bf16](t0)->sum(t1)"), {x, x}, {0}, {DType::f32});
  EXPECT_EQ(t.fused_bytes, 2 * 4096 + 32 * 4);
  EXPECT_EQ(t.split_bytes, 3 * 4096 + 4096 + 32 * 4);
  EXPECT_EQ(t.split_kernels, 2);
}

// The schema of mixed groups: inputs of their own dtypes, outputs of the listed ones, and
// errors naming what is wrong.
TEST(FusedProgram, TheOpTakesADtypePerOperand) {
  auto build = [](Graph& g, const std::vector<Var>& xs, const std::string& program, const std::string& dtypes) {
    std::vector<ValueId> ids;
    for (Var v : xs) ids.push_back(v.id());
    std::vector<std::string> names;
    for (size_t j = 0; j < EwProgram::parse(program).outputs.size(); ++j)
      names.push_back("fused" + std::to_string(g.nodes().size()) + "_" + std::to_string(j));
    return g.add_named(Op::fused_elementwise, ids, {{"program", program}, {"dtypes", dtypes}}, names);
  };
  const auto expect_error = expect_node_error;
  {
    Graph g;
    Var x = g.input("x", {4, 3}, DType::bf16), b = g.input("b", {3});
    auto out = build(g, {x, b}, "cast[f32](i0);add(t0,i1);cast[bf16](t1)->t2,t1", "bf16,f32");
    EXPECT_EQ(g.value(out[0]).type, (TensorType{DType::bf16, {4, 3}}));
    EXPECT_EQ(g.value(out[1]).type, (TensorType{DType::f32, {4, 3}}));
    // No list: the first input's dtype.
    out = build(g, {x, b}, "cast[f32](i0);add(t0,i1)->t1", "");
    EXPECT_EQ(g.value(out[0]).type.dtype, DType::bf16);
    // A layer norm of f16 data: y f16, its statistics f32.
    Var h = g.input("h", {4, 3}, DType::f16);
    out = build(g, {h, b, b}, "relu(i0)->layer_norm[1e-05](t0,i1,i2)", "");
    EXPECT_EQ(g.value(out[0]).type.dtype, DType::f16);
    EXPECT_EQ(g.value(out[1]).type, (TensorType{DType::f32, {4}}));
  }
  auto x16 = [](Graph& g) { return g.input("x", {4, 3}, DType::bf16); };
  expect_error([&](Graph& g) { build(g, {x16(g)}, "relu(i0)->t0", "bf16,f32"); },
               "names 2 dtype(s) for the program's 1 outputs");
  expect_error([&](Graph& g) { build(g, {x16(g)}, "relu(i0)->t0", "i32"); }, "'i32' is not a float dtype");
  expect_error([&](Graph& g) { build(g, {g.input("x", {4, 3}, DType::f64)}, "relu(i0)->t0", "f32"); },
               "output 0 is f32 where another operand is f64");
  expect_error([&](Graph& g) { build(g, {x16(g), g.input("b", {3}, DType::f64)}, "add(i0,i1)->t0", ""); },
               "input 0 is bf16 where another operand is f64");
  expect_error(
      [&](Graph& g) {
        Var b = g.input("b", {3});
        build(g, {x16(g), b, b}, "relu(i0)->layer_norm[1e-05](t0,i1,i2)", "bf16,bf16,bf16");
      },
      "mean and rstd (outputs 1 and 2) must be f32 for its bf16 y, got bf16");
}

// A bf16 activation read into an f32 residual stream and back, as the precision pass
// leaves it: the casts join the elementwise ops around them, forward and backward, the
// 16-bit values round where the unfused ops would store them, and every bit (bf16
// outputs, f32 gradients) is the unfused plan's.
TEST(FuseElementwise, CastsJoinGroupsAndChangeNoBit) {
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    Graph g;
    Var x = g.input("x", {8, 16}, low);
    Var bias = g.param("bias", {16}, Init::uniform(-1, 1));
    Var r = add(cast(x, DType::f32), bias);           // f32
    Var h = gelu(cast(r, low), true);                 // 16-bit, stored in 16 bits
    Var y = mul(cast(h, DType::f32), g.param("s", {16}, Init::uniform(0.5, 1.5)));
    const Plan plan = expect_same_bits(g, sum(mul(y, y)), {h}, "residual");
    EXPECT_EQ(count(plan, Op::cast), 0) << plan.str();
    bool mixed = false;
    for (auto& s : plan.steps) {
      if (s.op != Op::fused_elementwise) continue;
      const std::string prog = s.attrs.s("program");
      // The rounding the gelu's store does is a cast right after it.
      if (prog.find("gelu_tanh(") != std::string::npos) {
        EXPECT_NE(prog.find("cast[" + std::string(dtype_name(low)) + "]"), std::string::npos) << prog;
        EXPECT_NE(prog.find("cast[f32]"), std::string::npos) << prog;
      }
      for (size_t j = 0; j < s.out.size(); ++j)
        if (s.out[j].type.dtype != s.in[0].type.dtype) {
          mixed = true;
          EXPECT_EQ(ew_output_dtypes(EwProgram::cached(prog), s.attrs.s("dtypes"), s.in[0].type.dtype)[j],
                    s.out[j].type.dtype);
        }
    }
    EXPECT_TRUE(mixed) << "some group stores another dtype than it loads first\n" << plan.str();
    EXPECT_NE(plan.output(h.name()), nullptr);
    EXPECT_EQ(plan.output(h.name())->ref.type.dtype, low);
    EXPECT_NE(plan.str().find("dtypes="), std::string::npos) << plan.str();
    expect_kernels_compile(plan);
  }
}

// A residual add of bf16 values ending in a layer norm with f32 gamma and beta (y bf16,
// the statistics f32), and a bf16 product summed into f32: groups ending in a layer norm
// or in sums, at mixed dtypes, bitwise as unfused.
TEST(FuseElementwise, MixedGroupsEndingInANormOrASum) {
  Graph g;
  Var x = g.input("x", {6, 16}, DType::bf16), res = g.input("res", {6, 16}, DType::bf16);
  Var h = add(x, res);
  Var y = layer_norm(h, g.param("gamma", {16}, Init::uniform(0.5, 1.5)), g.param("beta", {16}, Init::uniform(-1, 1)),
                     1e-5);
  ASSERT_EQ(y.dtype(), DType::bf16);
  Var z = g.input("z", {16, 12}, DType::bf16);
  Var cols = g.add1(Op::sum, {mul(z, z).id()},
                    {{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}, {"dtype", std::string("f32")}});
  ASSERT_EQ(cols.dtype(), DType::f32);
  Var loss = add(sum(seam::tanh(cast(y, DType::f32))), sum(cols));
  const Plan plan = expect_same_bits(g, loss, {cols}, "norm and sum");
  EXPECT_EQ(count(plan, Op::layer_norm) + count(plan, Op::cast), 0) << plan.str();
  bool normed = false, summed_f32 = false;
  for (auto& s : plan.steps) {
    if (s.op != Op::fused_elementwise) continue;
    const EwProgram& p = EwProgram::cached(s.attrs.s("program"));
    if (p.normalizes()) {
      normed = true;
      ASSERT_EQ(s.out.size(), 4u) << "h (the gradient reads it), y, mean, rstd\n" << plan.str();
      EXPECT_EQ(s.out[1].type.dtype, DType::bf16);
      EXPECT_EQ(s.out[2].type.dtype, DType::f32);
      EXPECT_EQ(s.out[3].type.dtype, DType::f32);
    }
    if (p.reduces() && s.out.size() == 1 && s.in[0].type.dtype == DType::bf16) {  // the column sums
      summed_f32 = true;
      EXPECT_EQ(s.attrs.s("dtypes"), "f32") << plan.str();
    }
  }
  EXPECT_TRUE(normed) << plan.str();
  EXPECT_TRUE(summed_f32) << plan.str();
  expect_kernels_compile(plan);
}

// A cast of a group's sum that only a non-elementwise op reads (here a reshape; a GEMM
// as often): the group stores the sum in the cast's dtype, rounded as the cast would.
TEST(FuseElementwise, ACastOfAGroupsSumIsItsStore) {
  Graph g;
  Var z = g.param("z", {16, 12}, Init::uniform(-1, 1));
  Var s = cast(seam::mean(mul(z, z), {0}), DType::bf16);
  Var y = reshape(s, {3, 4});
  const Plan plan = expect_same_bits(g, sum(seam::tanh(cast(y, DType::f32))), {}, "a mean for a reshape");
  bool stored = false;
  for (auto& st : plan.steps)
    for (size_t j = 0; st.op == Op::fused_elementwise && j < st.out.size(); ++j)
      stored = stored || st.out[j].type == TensorType{DType::bf16, {12}};
  EXPECT_TRUE(stored) << plan.str();
  // One cast is left, in the backward: the gradient's, between the reshape and the mean's
  // broadcast, next to no elementwise op.
  EXPECT_EQ(count(plan, Op::cast), 1) << plan.str();
}

// Casts next to no elementwise op stay casts: a 16-bit working copy of a parameter for a
// GEMM, as the precision pass makes them.
TEST(FuseElementwise, ACastBetweenLibraryCallsStaysACast) {
  Graph g;
  Var x = g.input("x", {4, 8}, DType::bf16);
  Var w = g.param("w", {8, 5}, Init::uniform(-1, 1));
  Var y = matmul(x, cast(w, DType::bf16));
  Model m(g);
  Program p = m.compile({.outputs = {y.id()}});
  EXPECT_EQ(count(p.plan(), Op::cast), 1) << p.plan().str();
  EXPECT_EQ(count(p.plan(), Op::fused_elementwise), 0) << p.plan().str();
}

// A block at the bf16 policy (the precision pass on): linear + GELU, a residual add in
// f32 and a layer norm whose bf16 output feeds the next GEMM. Every cast next to an
// elementwise op, forward and backward, is inside a group, the layer norm's output stored
// in bf16 by its group; the casts left make working copies for GEMMs of what a GEMM
// reads first (parameters, the f32 input). As unfused but for the GEMMs writing f32 where
// their result was cast to it (fold_casts): a bf16 rounding fewer.
TEST(FuseElementwise, AtTheBf16PolicyCastsLeftOnlyFeedGemms) {
  Graph g;
  Var x = g.input("x", {8, 16});
  Var h = gelu(nn::linear(x, 16, "fc1"), true);
  Var y = nn::layer_norm(add(h, x), "ln");
  Var loss = sum(seam::tanh(nn::linear(y, 4, "fc2")));
  const Plan plan = expect_same_bits(g, loss, {}, "bf16 block", Precision::bf16, 2e-2);
  EXPECT_GT(count(plan, Op::fused_elementwise), 2) << plan.str();
  for (auto& s : plan.steps) {
    if (s.op == Op::cast) {
      bool input = s.in[0].region == Region::params;
      for (auto& b : plan.inputs) input = input || (b.ref.region == s.in[0].region && b.ref.offset == s.in[0].offset);
      EXPECT_TRUE(input) << s.name << "\n" << plan.str();
    }
    if (s.op == Op::fused_elementwise && EwProgram::cached(s.attrs.s("program")).normalizes()) {
      EXPECT_EQ(s.attrs.s("dtypes"), "f32,bf16,f32,f32") << "the residual sum in f32, y in bf16\n" << plan.str();
    }
  }
}
