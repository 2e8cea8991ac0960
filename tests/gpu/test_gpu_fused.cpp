// Generated kernels of fused_elementwise groups: against the CPU on random chains of every
// elementwise op (forward and their gradients, broadcast operands, awkward sizes), and the
// kernel cache: a hit compiles nothing, a new signature compiles, a corrupt file is rebuilt.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "backend/backend.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/gemm.h"
#include "../test_util.h"
#include "gpu_check.h"

using namespace seam;
using seam::testing::count;
using namespace seam::gpu_testing;

namespace {

// A random chain over [rows, cols] operands, [cols] and [rows, 1] broadcasts included.
Var random_chain(GpuCase& c, std::mt19937_64& rng, const Shape& shape) {
  const Shape row{shape.back()}, col{shape[0], 1};
  std::vector<Var> pool = {c.param("a", shape, 0.1, 2), c.param("b", shape, -2, 2), c.param("row", row, 0.5, 1.5),
                           c.data("x", shape, -2, 2), c.data("col", col, -1, 1)};
  auto pick = [&] { return pool[rng() % pool.size()]; };
  auto full = [&] {
    for (int k = 0; k < 20; ++k) {
      Var v = pick();
      if (v.shape() == shape) return v;
    }
    return pool[0];
  };
  const int steps = 3 + static_cast<int>(rng() % 8);
  for (int i = 0; i < steps; ++i) {
    Var v;
    switch (rng() % 12) {
      case 0: v = relu(full()); break;
      case 1: v = sigmoid(full()); break;
      case 2: v = seam::tanh(full()); break;
      case 3: v = gelu(full(), rng() % 2 == 0); break;
      case 4: v = silu(full()); break;
      case 5: v = seam::exp(scale(full(), 0.25)); break;
      case 6: v = add(full(), pick()); break;
      case 7: v = sub(pick(), full()); break;
      case 8: v = mul(full(), pick()); break;
      case 9: v = div(full(), add(pool[0], pool[2])); break;
      case 10: v = maximum(full(), pick()); break;
      default: v = leaky_relu(neg(full()), 0.2); break;
    }
    pool.push_back(v);
  }
  return pool.back();
}

// Chains of transcendental ops, each within a few ulps of the CPU's.
CompareOptions tolerant() { return {Precision::f32, {1e-4, 1e-3, 1e-5}}; }

// The generated kernels' cache files under a cache folder.
std::vector<std::string> kernel_files(const TempCacheDir& cache) {
  std::vector<std::string> f;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(cache.dir() + "/seam/kernels", ec)) f.push_back(e.path().string());
  return f;
}

}  // namespace

// Each group as its generated kernel, as one kernel per op, and as timed.
TEST(GpuFused, GeneratedKernelsMatchTheCpu) {
  std::mt19937_64 rng(3);
  const std::vector<Shape> shapes = {{1, 1}, {3, 7}, {5, 129}, {64, 100}, {999, 1027}};
  for (int trial = 0; trial < 30; ++trial) {
    const Shape shape = shapes[static_cast<size_t>(trial) % shapes.size()];
    const uint64_t seed = rng();
    for (EpiloguePolicy e : {EpiloguePolicy::fused, EpiloguePolicy::split, EpiloguePolicy::fastest}) {
      SCOPED_TRACE("trial " + std::to_string(trial) + ", " + shape_str(shape) + ", policy " +
                   std::to_string(static_cast<int>(e)));
      CompareOptions o = tolerant();
      o.epilogue = e;
      compare_with_cpu(
          [&](GpuCase& c) {
            std::mt19937_64 r(seed);
            return random_chain(c, r, shape);
          },
          o);
    }
  }
  // And the GPU plans do use generated kernels.
  GpuCase c;
  std::mt19937_64 r(5);
  Var y = random_chain(c, r, {8, 16});
  Var loss = sum(mul(y, y));
  Model m(c.g, {.device = Device::cuda});
  Program p = m.compile({.loss = loss.id(), .gradients = true});
  EXPECT_GT(count(p.plan(), Op::fused_elementwise), 0) << p.plan().str();
  // Each says which variant it runs and what the compiler reported; where the kernel
  // moves at most half the split's bytes the model kept it untimed, elsewhere both ran.
  int reported = 0;
  for (auto& [step, what] : p.executable().stats().choices) {
    const PlanStep& st = p.plan().steps.at(static_cast<size_t>(step));
    if (st.op != Op::fused_elementwise) continue;
    EXPECT_NE(what.find(" registers, "), std::string::npos) << what;
    std::vector<TensorType> in;
    for (auto& b : st.in) in.push_back(b.type);
    if (fused_clearly_faster(ew_traffic(EwProgram::cached(st.attrs.s("program")), in, st.attrs.ints("axes"))))
      EXPECT_TRUE(what.rfind("fused (the model: ", 0) == 0 || what.find("split ruled out by the model") != std::string::npos)
          << what;
    else
      EXPECT_NE(what.find("too close for the model"), std::string::npos) << what;
    ++reported;
  }
  EXPECT_EQ(reported, count(p.plan(), Op::fused_elementwise));
  // The plan's report compiles each kernel again and reads the same figures.
  for (auto& s : p.plan().steps)
    if (auto r = generated_kernel_report(s)) {
      EXPECT_GT(r->registers, 0) << r->compiler_log;
      EXPECT_EQ(r->spill_bytes, 0) << r->compiler_log;
    }
}

TEST(GpuFused, KernelCacheHitsCompilesNewSignaturesAndRebuildsCorruptFiles) {
  TempCacheDir cache;
  cuda::forget_loaded_kernels();
  // A factor no other test uses, so that the first compile is this test's.
  std::random_device rd;
  const double factor = 1.0 + static_cast<double>(rd() % 100000) * 1e-6;
  auto run = [&](double f) {
    return compare_with_cpu(
        [&](GpuCase& c) {
          Var x = c.param("x", {33, 65}, -1, 1);
          return seam::tanh(add(scale(sigmoid(x), f), x));
        },
        tolerant());
  };
  auto stats = [] { return cuda::kernel_cache_stats(); };
  const auto s0 = stats();
  run(factor);
  const auto s1 = stats();
  EXPECT_GT(s1.compiled, s0.compiled);
  EXPECT_GT(s1.files_written, s0.files_written);
  const auto files = kernel_files(cache);
  ASSERT_FALSE(files.empty());

  // The same graph again: from this process's table, nothing compiled.
  run(factor);
  const auto s2 = stats();
  EXPECT_EQ(s2.compiled, s1.compiled);
  EXPECT_GT(s2.memory_hits, s1.memory_hits);

  // A new process's view: the table forgotten, the files read back, nothing compiled.
  cuda::forget_loaded_kernels();
  run(factor);
  const auto s3 = stats();
  EXPECT_EQ(s3.compiled, s2.compiled);
  EXPECT_GT(s3.disk_hits, s2.disk_hits);

  // Another signature (another factor in the program) compiles a new kernel.
  run(factor + 0.5);
  const auto s4 = stats();
  EXPECT_GT(s4.compiled, s3.compiled);

  // Corrupt every file: a flipped byte in the cubin, or a cut file. Nothing is trusted:
  // each is rejected, compiled again, rewritten, and the results stay right.
  int k = 0;
  for (const auto& f : kernel_files(cache)) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(0, std::ios::end);
    const auto size = static_cast<std::streamoff>(io.tellg());
    if (k++ % 2 == 0) {
      io.seekp(size - 10);
      io.put('\x5a');
    } else {
      io.close();
      std::filesystem::resize_file(f, static_cast<uintmax_t>(size / 2));
    }
  }
  cuda::forget_loaded_kernels();
  run(factor);
  run(factor + 0.5);
  const auto s5 = stats();
  EXPECT_GE(s5.rejected_files - s4.rejected_files, 2);
  EXPECT_GE(s5.compiled - s4.compiled, 2);
  // Rewritten and good again.
  cuda::forget_loaded_kernels();
  run(factor);
  const auto s6 = stats();
  EXPECT_EQ(s6.compiled, s5.compiled);
  EXPECT_EQ(s6.rejected_files, s5.rejected_files);
}

// A group wider than a generated kernel takes (here 20 inputs) runs as one kernel per op.
TEST(GpuFused, GroupsPastTheKernelLimitsRunOpByOp) {
  compare_with_cpu(
      [](GpuCase& c) {
        Var acc = c.param("p0", {9, 11});
        for (int i = 1; i < 20; ++i) acc = add(seam::tanh(acc), c.param("p" + std::to_string(i), {9, 11}));
        return acc;
      },
      tolerant());
  GpuCase c;
  Var acc = c.param("p0", {9, 11});
  for (int i = 1; i < 20; ++i) acc = add(acc, c.param("p" + std::to_string(i), {9, 11}));
  Model m(c.g, {.device = Device::cuda});
  Program p = m.compile({.outputs = {acc.id()}});
  ASSERT_EQ(count(p.plan(), Op::fused_elementwise), 1) << p.plan().str();
  bool split = false;
  for (auto& [step, what] : p.executable().stats().choices) split = split || what.rfind("split: 20 inputs", 0) == 0;
  EXPECT_TRUE(split);
}

// Groups ending in sums and means: both walks (the innermost dim kept, four columns a
// thread or one, or the innermost dim reduced), one chunk and many (partials added by a
// second kernel), 3-d shapes reduced over middle and outer axes, keepdims or not; each
// forced fused, split and timed.
TEST(GpuFused, GroupsEndingInReductionsMatchTheCpu) {
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
    bool keepdims, mean;
  };
  const std::vector<Case> cases = {
      {{4096, 64}, {0}, false, false},   // columns, many chunks (a bias gradient)
      {{4096, 64}, {0}, true, true},     // columns, many chunks, the mean's scale on the partials
      {{37, 1000}, {0}, true, true},     // columns, one chunk
      {{301, 1001}, {0}, false, false},  // columns, rows not a multiple of 4: one lane a thread
      {{64, 8192}, {1}, true, false},    // rows, many chunks
      {{300, 33}, {-1}, false, true},    // rows, one chunk
      {{6, 50, 40}, {0, 2}, false, false},  // rows over two reduced groups
      {{6, 50, 40}, {1}, true, true},    // columns, kept dims on both sides
      {{128, 257}, {}, false, false},    // everything: one output
  };
  for (const Case& k : cases)
    for (EpiloguePolicy e : {EpiloguePolicy::fused, EpiloguePolicy::split, EpiloguePolicy::fastest}) {
      SCOPED_TRACE(shape_str(k.shape) + " axes " + shape_str(k.axes) + (k.mean ? " mean" : " sum") + ", policy " +
                   std::to_string(static_cast<int>(e)));
      CompareOptions o = tolerant();
      o.epilogue = e;
      compare_with_cpu(
          [&](GpuCase& c) {
            // The backward sums w's and b's gradients over the batch in one group: two
            // reduced outputs, through the partials where there are many rows.
            Var x = c.data("x", k.shape, -2, 2);
            Var w = c.param("w", {k.shape.back()}, 0.5, 1.5);
            Var t = seam::tanh(add(mul(x, w), c.param("b", {k.shape.back()})));
            Var r = k.mean ? seam::mean(t, k.axes, k.keepdims) : sum(t, k.axes, k.keepdims);
            return sigmoid(r);
          },
          o);
    }
  // The forward sum ends the group, as its plan shows.
  GpuCase c;
  Var x = c.data("x", {256, 64});
  Var t = sum(seam::tanh(mul(x, c.param("w", {64}))), {0});
  Model m(c.g, {.device = Device::cuda});
  Program p = m.compile({.outputs = {t.id()}});
  EXPECT_EQ(count(p.plan(), Op::sum), 0) << p.plan().str();
  EXPECT_EQ(count(p.plan(), Op::fused_elementwise), 1) << p.plan().str();
}

// Broadcast operands read four at a time: contiguous along the rows (a float4 at the
// operand's own offset) and constant along them (one value for the four lanes); rows of
// a multiple of 4 and not, forward alone so that the group walks elementwise.
TEST(GpuFused, BroadcastOperandsReadAsVectorsMatchTheCpu) {
  for (const Shape& shape : std::vector<Shape>{{64, 100}, {33, 1028}, {5, 7}, {3, 4, 8}}) {
    SCOPED_TRACE(shape_str(shape));
    CompareOptions o = tolerant();
    o.gradients = false;
    compare_with_cpu(
        [&](GpuCase& c) {
          Var x = c.data("x", shape);
          Var row = c.param("row", {shape.back()}, 0.5, 1.5);
          Shape col_shape = shape;
          col_shape.back() = 1;
          Var col = c.param("col", col_shape);
          return seam::tanh(add(mul(x, row), col));
        },
        o);
  }
}

// Where the generated kernel moves at most half the split's bytes, the model keeps it and
// nothing is timed; a group that stores most of its values is timed against the split.
TEST(GpuFused, TheModelDecidesClearWinsAndTimesTheRest) {
  auto choice = [](bool clear) {
    GpuCase c;
    Var x = c.data("x", {256, 512});
    Var b = c.param("b", {512});
    Var s = add(x, b);
    Var t = seam::tanh(s);
    Var y = scale(t, 0.5);
    Model m(c.g, {.device = Device::cuda});
    // Alone, y moves a third of the split's bytes; with the sum and tanh's value stored
    // as well, two thirds.
    Program p = m.compile(
        {.outputs = clear ? std::vector<ValueId>{y.id()} : std::vector<ValueId>{y.id(), t.id(), s.id()}});
    EXPECT_EQ(count(p.plan(), Op::fused_elementwise), 1) << p.plan().str();
    for (auto& [step, what] : p.executable().stats().choices)
      if (p.plan().steps.at(static_cast<size_t>(step)).op == Op::fused_elementwise) return what;
    return std::string("no choice recorded");
  };
  const auto before = cuda::gemm_cache_stats();
  const std::string clear = choice(true);
  EXPECT_EQ(clear.rfind("fused (the model: 0.", 0), 0u) << clear;
  EXPECT_EQ(cuda::gemm_cache_stats().variants_timed, before.variants_timed);
  const std::string close = choice(false);
  EXPECT_NE(close.find("too close for the model: 0."), std::string::npos) << close;
  EXPECT_TRUE(close.find("(timed:") != std::string::npos || close.find("(cached pick)") != std::string::npos) << close;
}

// A residual add + layer norm as one generated kernel (a warp per row, any row length),
// its statistics read by the layer norm's gradient; fused, split and timed.
TEST(GpuFused, GroupsEndingInALayerNormMatchTheCpu) {
  for (const Shape& shape : std::vector<Shape>{{64, 1024}, {9, 700}, {33, 100}, {5, 3000}, {7, 1}, {2, 3, 40}})
    for (EpiloguePolicy e : {EpiloguePolicy::fused, EpiloguePolicy::split, EpiloguePolicy::fastest}) {
      SCOPED_TRACE(shape_str(shape) + ", policy " + std::to_string(static_cast<int>(e)));
      CompareOptions o = tolerant();
      o.epilogue = e;
      compare_with_cpu(
          [&](GpuCase& c) {
            const Shape dim{shape.back()};
            Var x = c.data("x", shape);
            Var h = add(x, mul(c.param("r", shape), c.param("s", dim, 0.5, 1.5)));
            Var y = layer_norm(h, c.param("gamma", dim, 0.5, 1.5), c.param("beta", dim), 1e-5);
            return add(seam::tanh(y), h);
          },
          o);
    }
  GpuCase c;
  Var x = c.data("x", {16, 64});
  Var h = add(x, c.param("r", {16, 64}));
  Var y = layer_norm(h, c.param("gamma", {64}), c.param("beta", {64}), 1e-5);
  Model m(c.g, {.device = Device::cuda});
  Program p = m.compile({.outputs = {y.id()}});
  EXPECT_EQ(count(p.plan(), Op::layer_norm), 0) << p.plan().str();
  EXPECT_EQ(count(p.plan(), Op::fused_elementwise), 1) << p.plan().str();
}

// The occupancy rule the choice applies to a generated kernel's compiler report.
TEST(GpuFused, ResidentThreadsFollowRegistersAndSharedMemory) {
  EXPECT_EQ(cuda::resident_threads(32, 0), 2048);
  EXPECT_EQ(cuda::resident_threads(64, 0), 1024);
  EXPECT_EQ(cuda::resident_threads(128, 0), 512);  // the least a kept kernel may have
  EXPECT_LT(cuda::resident_threads(129, 0), 512);
  EXPECT_EQ(cuda::resident_threads(32, 33792), 1536);  // four column sums' 33 KB a block: 6 blocks
  EXPECT_EQ(cuda::resident_threads(32, 100 * 1024), 512);
  // An unknown figure never fits.
  EXPECT_EQ(cuda::resident_threads(-1, 0), 0);
  EXPECT_EQ(cuda::resident_threads(0, 0), 0);
  EXPECT_EQ(cuda::resident_threads(32, -1), 0);
}

// The budget check reads registers and local memory from the loaded function: a cache
// file (or a compiler log) without them changes nothing.
TEST(GpuFused, KernelFiguresComeFromTheLoadedFunction) {
  TempCacheDir cache;
  cuda::forget_loaded_kernels();
  std::random_device rd;
  const double factor = 1.0 + static_cast<double>(rd() % 100000) * 1e-6;  // a kernel of this test's own
  GpuCase c;
  Var x = c.param("x", {64, 96}, -1, 1);
  Var y = seam::tanh(add(scale(sigmoid(x), factor), x));
  auto figures = [&] {
    Model m(c.g, {.device = Device::cuda});
    Program p = m.compile({.outputs = {y.id()}});
    std::vector<std::string> seen;
    for (auto& [step, what] : p.executable().stats().choices)
      if (p.plan().steps.at(static_cast<size_t>(step)).op == Op::fused_elementwise) seen.push_back(what);
    for (auto& s : p.plan().steps)
      if (auto r = generated_kernel_report(s)) {
        EXPECT_GT(r->registers, 0);
        EXPECT_EQ(r->spill_bytes, 0);
      }
    return seen;
  };
  const auto fresh = figures();
  ASSERT_FALSE(fresh.empty());
  // Every file now says the compiler reported nothing.
  for (const auto& f : kernel_files(cache)) {
    std::ifstream in(f, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    // The header line, the key line, then the figures.
    const size_t key_end = text.find('\n', text.find('\n') + 1), info_end = text.find('\n', key_end + 1);
    ASSERT_NE(info_end, std::string::npos) << f;
    std::string line = text.substr(key_end + 1, info_end - key_end - 1);
    const size_t bytes = line.find(" bytes=");
    ASSERT_NE(bytes, std::string::npos) << line;
    line = "registers=-1 spill=-1 smem=0" + line.substr(bytes);
    std::ofstream out(f, std::ios::binary | std::ios::trunc);
    out << text.substr(0, key_end + 1) << line << text.substr(info_end);
  }
  cuda::forget_loaded_kernels();
  const auto before = cuda::kernel_cache_stats();
  const auto cached = figures();
  EXPECT_GT(cuda::kernel_cache_stats().disk_hits, before.disk_hits);
  EXPECT_EQ(cuda::kernel_cache_stats().compiled, before.compiled);
  ASSERT_EQ(cached.size(), fresh.size());
  for (size_t i = 0; i < cached.size(); ++i) {
    EXPECT_NE(cached[i].find(" registers, "), std::string::npos) << cached[i];
    EXPECT_EQ(cached[i].find("-1 "), std::string::npos) << cached[i];
  }
}

// Dropout inside groups (its generated kernel draws the op's own masks): relu -> dropout
// -> tanh with its gradients, and dropout -> residual add -> layer norm, at shapes with
// and without a multiple of four (the vector loop's lanes and the scalar tail), each as
// the generated kernel and as one kernel per op, against the CPU.
TEST(GpuFused, GroupsWithDropoutMatchTheCpu) {
  for (const Shape& shape : {Shape{5, 33}, Shape{64, 128}})
    for (EpiloguePolicy e : {EpiloguePolicy::fused, EpiloguePolicy::split}) {
      SCOPED_TRACE(shape_str(shape) + ", policy " + std::to_string(static_cast<int>(e)));
      CompareOptions o(Precision::f32, Tolerance::f32());
      o.epilogue = e;
      compare_with_cpu([&](GpuCase& c) { return seam::tanh(dropout(relu(c.param("x", shape)), 0.4)); }, o);
      compare_with_cpu(
          [&](GpuCase& c) {
            Var x = c.param("x", shape);
            Var h = add(dropout(c.param("h", shape), 0.2), x);
            return layer_norm(h, c.param("g", {shape.back()}, 0.5, 1.5), c.param("b", {shape.back()}));
          },
          o);
    }
}
