// The whole step as one CUDA Graph: replay gives what eager launches give; step-to-step
// state (learning rate schedule, dropout masks, inputs, metrics) changes under replay
// exactly as on the CPU.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "backend/backend.h"
#include "backend/clocks.h"
#include "backend/cuda/graph_memset.h"
#include "../test_util.h"
#include "gpu_check.h"

using namespace seam;
using seam::gpu_testing::expect_close;
using seam::testing::random_floats;

TEST(GpuGraph, ReplayMatchesEagerLaunchesAndTheCpu) {
  const int64_t batch = 32;
  Graph g;
  Var x = g.input("x", {batch, 64});
  Var y = g.input("y", {batch}, DType::i32);
  Var h = dropout(relu(nn::linear(x, 96, "fc1")), 0.3);
  h = gelu(nn::linear(h, 48, "fc2"), true);
  Var logits = nn::linear(h, 10, "fc3");
  Var loss = cross_entropy(logits, y);
  Var metrics = g.state("metrics", {2}, Init::zeros());
  accumulate(metrics, {loss, count_equal(argmax(logits), y)});
  auto opt = OptimizerConfig::adamw(2e-3, 0.01);
  opt.schedule = {Schedule::Kind::cosine, 3, 1, 0.1, 20, 1e-4};
  opt.clip_norm = 1.0;

  // Eager and replayed, on one stream and with independent steps side by side on four.
  constexpr int kRuns = 5;
  std::vector<std::vector<float>> result[kRuns];
  const struct {
    Device device;
    bool graph;
    int streams;
  } runs[kRuns] = {{Device::cpu, false, 1},
                   {Device::cuda, false, 1},
                   {Device::cuda, true, 1},
                   {Device::cuda, false, 4},
                   {Device::cuda, true, 4}};
  for (int k = 0; k < kRuns; ++k) {
    Model m(g, {.seed = 4,
                .device = runs[k].device,
                .precision = Precision::f32,
                .cuda_graph = runs[k].graph,
                .cuda_streams = runs[k].streams});
    Program p = m.compile({.loss = loss.id(), .optimizer = opt});
    std::vector<int32_t> labels(batch);
    for (int64_t i = 0; i < batch; ++i) labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % 10);
    p.set_input("y", std::span<const int32_t>(labels));  // set once: must persist across steps
    for (int s = 0; s < 20; ++s) {
      auto xs = random_floats(static_cast<size_t>(batch * 64), static_cast<uint64_t>(s));
      p.set_input("x", std::span<const float>(xs));
      p.run();
    }
    EXPECT_EQ(m.state().step, 20);
    for (ValueId id : g.params()) result[k].push_back(Program::cast_bytes<float>(m.read_param(g.value(id).name)));
    result[k].push_back(Program::cast_bytes<float>(m.read_state("metrics")));
    if (runs[k].device == Device::cuda) {
      ExecStats st = p.executable().stats();
      EXPECT_EQ(st.graph, runs[k].graph);
      EXPECT_GT(st.kernels, 10);
      if (runs[k].streams == 1) EXPECT_EQ(st.streams, 1);
      else EXPECT_GE(st.streams, 2);  // the backward's weight gradients beside the input gradients
      std::printf("kernels per step: %d (%d operations) on %d streams\n", st.kernels, st.nodes, st.streams);
    }
  }
  for (int k = 2; k < kRuns; ++k)
    for (size_t i = 0; i < result[0].size(); ++i) {
      const std::string what = std::string(runs[k].graph ? "graph" : "eager") + " on " +
                               std::to_string(runs[k].streams) + " streams vs eager on one, tensor " + std::to_string(i);
      expect_close(result[k][i], result[1][i], {1e-6, 1e-5, 1e-7}, what);
    }
  for (size_t i = 0; i < result[0].size(); ++i)
    expect_close(result[2][i], result[0][i], {1e-4, 1e-3, 1e-5}, "graph vs cpu, tensor " + std::to_string(i));
}

TEST(GpuGraph, LearningRateScheduleAdvancesOnTheDevice) {
  // loss = sum(w * g) with g = 1: every SGD update subtracts exactly the learning rate.
  Graph g;
  Var w = g.param("w", {8}, Init::zeros());
  Var one = g.input("one", {8});
  Var loss = sum(mul(w, one));
  auto opt = OptimizerConfig::sgd(0.8);
  opt.schedule = {Schedule::Kind::step, /*warmup*/ 2, /*step_size*/ 1, /*gamma*/ 0.5};
  Model m(g, {.device = Device::cuda});
  Program p = m.compile({.loss = loss.id(), .optimizer = opt});
  std::vector<float> ones(8, 1.0f);
  p.set_input("one", std::span<const float>(ones));
  float prev = 0;
  for (int s = 0; s < 6; ++s) {
    p.run();
    float now = Program::cast_bytes<float>(m.read_param("w"))[0];
    EXPECT_NEAR(prev - now, opt.schedule.lr_at(opt.lr, s), 1e-6) << "step " << s;
    EXPECT_DOUBLE_EQ(m.state().lr, opt.schedule.lr_at(opt.lr, s));
    prev = now;
  }
}

TEST(GpuGraph, DropoutMasksChangeEveryStepAsOnTheCpu) {
  Graph g;
  Var x = g.input("x", {4, 256});
  Var w = g.param("w", {256}, Init::ones());
  Var d = dropout(x, 0.5);
  Var loss = sum(mul(d, w));
  std::vector<std::vector<float>> masks[2];
  for (int k = 0; k < 2; ++k) {
    Model m(g, {.seed = 11, .device = k ? Device::cuda : Device::cpu});
    Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.0), .outputs = {d.id()}});
    std::vector<float> ones(4 * 256, 1.0f);
    p.set_input("x", std::span<const float>(ones));
    for (int s = 0; s < 3; ++s) {
      p.run();
      masks[k].push_back(p.read_as<float>(d.name()));
    }
  }
  EXPECT_NE(masks[1][0], masks[1][1]);
  EXPECT_NE(masks[1][1], masks[1][2]);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(masks[1][static_cast<size_t>(s)], masks[0][static_cast<size_t>(s)]) << "step " << s;
}

// An input set once keeps its value over later replays (it is carried into the other
// landing slot once, not copied every step), and a new value replaces it at once.
TEST(GpuGraph, AnInputSetOnceKeepsItsValueAndANewOneReplacesIt) {
  Graph g;
  Var x = g.input("x", {256, 64});
  Var w = g.param("w", {64}, Init::uniform(-1, 1));
  Var loss = sum(mul(x, w));
  Model cpu(g, {.seed = 3}), gpu(g, {.seed = 3, .device = Device::cuda});
  Program pc = cpu.compile({.loss = loss.id(), .gradients = true});
  Program pg = gpu.compile({.loss = loss.id(), .gradients = true});
  const auto a = random_floats(256 * 64, 1), b = random_floats(256 * 64, 2);
  auto loss_of = [&](Program& p, const std::vector<float>& v) {
    p.set_input("x", std::span<const float>(v));
    p.run();
    return p.read_as<float>(loss.name()).at(0);
  };
  const float la = loss_of(pc, a), lb = loss_of(pc, b);
  ASSERT_NE(la, lb);
  const std::vector<const std::vector<float>*> sets = {&a, nullptr, nullptr, nullptr, &b, nullptr, nullptr, &a, nullptr};
  float want = 0;
  for (size_t k = 0; k < sets.size(); ++k) {
    if (sets[k]) {
      pg.set_input("x", std::span<const float>(*sets[k]));
      want = sets[k] == &a ? la : lb;
    }
    pg.run();
    EXPECT_NEAR(pg.read_as<float>(loss.name()).at(0), want, 1e-4 * std::fabs(want) + 1e-4) << "run " << k;
  }
}

TEST(GpuGraph, MemsetNodesBecomeKernelsThatWriteTheSameBytes) {
  // A captured step: copy a random pattern in, memset parts of it (bytes, then a 2-D
  // block with a pitch), copy it out. After the rewrite no memset node is left, and the
  // result is the pattern with exactly those bytes set, in the captured order.
  const size_t n = 1 << 20, pitch = 4096, width = 1000, height = 37;
  std::vector<unsigned char> pattern(n);
  std::mt19937 rng(11);
  for (auto& b : pattern) b = static_cast<unsigned char>(rng());
  unsigned char *src = nullptr, *buf = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, n), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&buf, n), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, n), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src, pattern.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(buf, src, n, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(buf + 12345, 0xAB, 100003, s), cudaSuccess);
  ASSERT_EQ(cudaMemset2DAsync(buf + 500000, pitch, 0x5C, width, height, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dst, buf, n, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  auto count = [&](cudaGraphNodeType want) {
    size_t k = 0;
    EXPECT_EQ(cudaGraphGetNodes(g, nullptr, &k), cudaSuccess);
    std::vector<cudaGraphNode_t> nodes(k);
    EXPECT_EQ(cudaGraphGetNodes(g, nodes.data(), &k), cudaSuccess);
    int c = 0;
    for (auto node : nodes) {
      cudaGraphNodeType t;
      EXPECT_EQ(cudaGraphNodeGetType(node, &t), cudaSuccess);
      c += t == want;
    }
    return c;
  };
  EXPECT_EQ(count(cudaGraphNodeTypeMemset), 2);
  cuda::memsets_as_kernels(g);
  EXPECT_EQ(count(cudaGraphNodeTypeMemset), 0);
  EXPECT_EQ(count(cudaGraphNodeTypeKernel), 2);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::vector<unsigned char> got(n), want = pattern;
  std::fill(want.begin() + 12345, want.begin() + 12345 + 100003, 0xAB);
  for (size_t r = 0; r < height; ++r)
    std::fill(want.begin() + 500000 + r * pitch, want.begin() + 500000 + r * pitch + width, 0x5C);
  ASSERT_EQ(cudaMemcpy(got.data(), dst, n, cudaMemcpyDeviceToHost), cudaSuccess);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += got[i] != want[i];
  EXPECT_EQ(wrong, 0u);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  cudaFree(src);
  cudaFree(buf);
  cudaFree(dst);
}

// A watch over ~0.3 s of copies on the GPU reads its clock and power from NVML (which
// every machine with the driver has): samples every 5 ms, plausible clocks and watts,
// shares within [0, 1].
TEST(GpuClocks, AWindowOfWorkReportsItsClockAndPower) {
  const size_t n = size_t{256} << 20;
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, n), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, n), cudaSuccess);
  ASSERT_EQ(cudaMemset(a, 1, n), cudaSuccess);
  ClockWatch w(5);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_EQ(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, nullptr), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  }
  const std::optional<ClockReport> r = w.stop();
  ASSERT_EQ(cudaFree(a), cudaSuccess);
  ASSERT_EQ(cudaFree(b), cudaSuccess);
  ASSERT_TRUE(r.has_value()) << "NVML (libnvidia-ml.so.1, or SEAM_NVML) gave no sample";
  EXPECT_GE(r->samples, 10);
  EXPECT_GT(r->sm_mhz_min, 100);
  EXPECT_LE(r->sm_mhz_min, r->sm_mhz_mean);
  EXPECT_LE(r->sm_mhz_mean, r->sm_mhz_max);
  EXPECT_LT(r->sm_mhz_max, 5000);
  EXPECT_GT(r->watts_mean, 10);
  EXPECT_LE(r->watts_mean, r->watts_max);
  for (double share : {r->power_capped, r->thermal}) {
    EXPECT_GE(share, 0);
    EXPECT_LE(share, 1);
  }
}

