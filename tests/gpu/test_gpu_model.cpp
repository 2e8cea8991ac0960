// A model's state on the GPU across what else happens to it: a second program compiled
// (its prepare-time timing must not touch the first's gradients), steps timed alone
// (the model must stay bitwise as it was), a program outliving its model, work on the
// legacy default stream (seam's own must never wait for it, nor depend on it), and the
// CUDA backend's table (a preparer for every op, each refusing dtypes it does not take).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <random>
#include <thread>

#include "backend/backend.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/gemm.h"
#include "ops/registry.h"
#include "../model_checks.h"
#include "gpu_check.h"

using namespace seam;
using seam::gpu_testing::TempCacheDir;
using seam::testing::random_floats;
using seam::testing::random_labels;

namespace {

// Blocks the legacy default stream with a host function until opened (or 10 s passed):
// work queued behind it cannot run while it is closed.
class LegacyStreamGate {
 public:
  LegacyStreamGate() { SEAM_CUDA_CHECK(cudaLaunchHostFunc(cudaStreamLegacy, &LegacyStreamGate::wait, this)); }
  ~LegacyStreamGate() {
    open();
    cudaStreamSynchronize(cudaStreamLegacy);
  }
  void open() { open_ = true; }
  bool closed_all_along() const { return !timed_out_; }

 private:
  static void CUDART_CB wait(void* self) {
    auto* g = static_cast<LegacyStreamGate*>(self);
    const auto t0 = std::chrono::steady_clock::now();
    while (!g->open_) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
        g->timed_out_ = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::atomic<bool> open_{false}, timed_out_{false};
};

}  // namespace

TEST(GpuModel, CompilingASecondProgramLeavesTheFirstsGradients) {
  TempCacheDir cache;  // nothing chosen yet: each program times its GEMMs and variants
  // One set of parameters under two batch sizes: the second program's shapes are new, so
  // preparing it runs its GEMMs (algorithms, fused or split weight gradients) on its own
  // arena, writing weight gradients the first program produced.
  Graph g;
  Var w1 = g.param("w1", {48, 64}, Init::uniform(-0.2, 0.2)), b1 = g.param("b1", {48}, Init::uniform(-0.2, 0.2));
  Var w2 = g.param("w2", {10, 48}, Init::uniform(-0.2, 0.2));
  auto loss_of = [&](int64_t batch, const std::string& tag) {
    Var x = g.input("x" + tag, {batch, 64});
    Var y = g.input("y" + tag, {batch}, DType::i32);
    return cross_entropy(linear(relu(linear(x, w1, b1)), w2), y);
  };
  Var loss_a = loss_of(8, "a"), loss_b = loss_of(24, "b");
  Model m(g, {.seed = 3, .device = Device::cuda});
  Program first = m.compile({.loss = loss_a.id(), .gradients = true});
  const auto xa = random_floats(8 * 64, 1);
  const auto ya = random_labels(8, 10, 2);
  first.set_input("xa", std::span<const float>(xa));
  first.set_input("ya", std::span<const int32_t>(ya));
  first.run();
  std::vector<std::vector<std::byte>> before;
  for (const char* p : {"w1", "b1", "w2"}) before.push_back(first.read_grad(p));
  const auto timed_before = cuda::gemm_cache_stats();
  Program second = m.compile({.loss = loss_b.id(), .gradients = true});
  EXPECT_GT(cuda::gemm_cache_stats().tuned, timed_before.tuned) << "the second program chose nothing by running";
  size_t i = 0;
  for (const char* p : {"w1", "b1", "w2"}) EXPECT_EQ(first.read_grad(p), before[i++]) << "gradient of " << p;
}

// A state the host sets (a resumed checkpoint's step, another seed) reaches the device
// whether or not sync_state is read before the first step: the step counter drives the
// warmup's learning rate and Adam's bias correction, the seed and step the dropout masks.
TEST(GpuModel, AStateSetOnTheHostReachesTheDeviceAlsoThroughSyncState) {
  Graph g;
  Var x = g.input("x", {16, 32});
  Var y = g.input("y", {16}, DType::i32);
  Var loss = cross_entropy(nn::linear(dropout(relu(nn::linear(x, 64, "fc1")), 0.3), 10, "fc2"), y);
  OptimizerConfig adam = OptimizerConfig::adam(1e-2);
  adam.schedule.warmup_steps = 100;
  const auto xs = random_floats(16 * 32, 4);
  const auto ys = random_labels(16, 10, 5);
  auto params_after = [&](bool sync_first) {
    Model m(g, {.seed = 3, .device = Device::cuda});
    Program p = m.compile({.loss = loss.id(), .optimizer = adam});
    m.state().step = 40;
    m.state().seed = 99;
    if (sync_first) EXPECT_EQ(p.sync_state().step, 40);
    p.set_input("x", std::span<const float>(xs));
    p.set_input("y", std::span<const int32_t>(ys));
    p.run();
    EXPECT_EQ(p.sync_state().step, 41);
    return std::pair{m.read_param("fc1.weight"), m.read_param("fc2.bias")};
  };
  EXPECT_TRUE(params_after(true) == params_after(false));
}

TEST(GpuModel, TimingStepsLeavesTheModelBitwiseAsItWas) {
  seam::testing::expect_timing_leaves_the_model_as_it_was(Device::cuda);
  seam::testing::expect_timing_leaves_the_model_as_it_was(Device::cuda, Precision::bf16);
}

TEST(GpuModel, ABatchThatDoesNotFitNamesItsLargestBuffersAndTheDevicesFreeMemory) {
  // A training step at a batch of 2^32 images of 784 pixels (12 TiB of input alone), then
  // the same model at a batch that fits: the failed compile leaves the model usable, and
  // its step matches the CPU's.
  auto build = [](Graph& g, int64_t batch) {
    Var x = g.input("x", {batch, 784});
    Var y = g.input("y", {batch}, DType::i32);
    return cross_entropy(nn::linear(relu(nn::linear(x, 256, "fc1")), 10, "fc2"), y);
  };
  Graph big;
  Var big_loss = build(big, int64_t{1} << 32);
  Var fine = relu(nn::linear(big.input("small", {4, 784}), 3, "fine"));
  Model m(big, {.seed = 3, .device = Device::cuda});
  try {
    Program p = m.compile({.loss = big_loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* part : {"cannot allocate the arena of", "its largest buffers: input 'x' f32[4294967296,784]",
                             "out of GPU memory", "bytes free"})
      EXPECT_NE(what.find(part), std::string::npos) << part << " in: " << what;
  }
  {  // the model that failed compiles and runs a program that fits
    Program p = m.compile({.mode = Mode::eval, .outputs = {fine.id()}});
    const auto xs = random_floats(4 * 784, 4);
    p.set_input("small", std::span<const float>(xs));
    p.run();
    EXPECT_EQ(p.read_as<float>(fine.name()).size(), 12u);
  }
  const int64_t batch = 64;
  const auto xs = random_floats(static_cast<size_t>(batch * 784), 5);
  const auto ys = random_labels(static_cast<size_t>(batch), 10, 6);
  std::vector<float> loss[2];
  for (Device d : {Device::cpu, Device::cuda}) {
    Graph g;
    Var l = build(g, batch);
    Model small(g, {.seed = 3, .device = d, .precision = Precision::f32});
    Program p = small.compile({.loss = l.id(), .optimizer = OptimizerConfig::sgd(0.1)});
    p.set_input("x", std::span<const float>(xs));
    p.set_input("y", std::span<const int32_t>(ys));
    p.run();
    loss[d == Device::cuda] = p.read_as<float>(l.name());
  }
  ASSERT_EQ(loss[1].size(), 1u);
  EXPECT_NEAR(loss[1][0], loss[0][0], 1e-5 * std::abs(loss[0][0]));
}

TEST(GpuModel, AProgramOutlivesItsModel) { seam::testing::expect_a_program_outlives_its_model(Device::cuda); }

TEST(GpuStreams, ScratchIsZeroedBeforeItsStreamUsesIt) {
  // The zeroing must be ordered before the first work of the stream the scratch belongs
  // to. With the legacy default stream held, a zeroing queued there would run only after
  // the stream's own write below, and wipe it.
  constexpr size_t kBytes = size_t{1} << 20;
  cudaStream_t s = nullptr;
  SEAM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint8_t* host = nullptr;
  SEAM_CUDA_CHECK(cudaMallocHost(&host, 2 * kBytes));
  bool closed = false;
  {
    cuda::Context ctx;
    ctx.stream = s;
    {
      LegacyStreamGate gate;
      void* p = ctx.scratch(kBytes);
      SEAM_CUDA_CHECK(cudaMemcpyAsync(host, p, kBytes, cudaMemcpyDeviceToHost, s));  // zero already
      SEAM_CUDA_CHECK(cudaMemsetAsync(p, 0xab, kBytes, s));                          // the stream's own use
      SEAM_CUDA_CHECK(cudaStreamSynchronize(s));
      closed = gate.closed_all_along();
      gate.open();
      SEAM_CUDA_CHECK(cudaDeviceSynchronize());  // whatever the legacy stream held has run now
      SEAM_CUDA_CHECK(cudaMemcpy(host + kBytes, p, kBytes, cudaMemcpyDeviceToHost));
    }
  }
  EXPECT_TRUE(closed) << "making scratch memory waited for the legacy default stream";
  size_t not_zero = 0, not_written = 0;
  for (size_t i = 0; i < kBytes; ++i) not_zero += host[i] != 0, not_written += host[kBytes + i] != 0xab;
  EXPECT_EQ(not_zero, 0u) << "scratch memory was read before it was zeroed";
  EXPECT_EQ(not_written, 0u) << "the zeroing ran after the stream had written the memory";
  SEAM_CUDA_CHECK(cudaFreeHost(host));
  SEAM_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(GpuStreams, PreparingAndRunningNeverWaitOnTheLegacyDefaultStream) {
  // No GEMMs and no generated kernels (their libraries may synchronize on their own):
  // the steps, the fused loss with its row counter, the clipped optimizer with its
  // finished-blocks counter, and the error slot.
  Graph g;
  Var x = g.input("x", {64, 10});
  Var y = g.input("y", {64}, DType::i32);
  Var logits = add(mul(x, g.param("w", {10}, Init::uniform(-1, 1))), g.param("b", {10}, Init::zeros()));
  Var loss = cross_entropy(logits, y);
  auto opt = OptimizerConfig::sgd(0.1, 0.9);
  opt.clip_norm = 0.1;
  Model m(g, {.seed = 6, .device = Device::cuda});
  const auto xs = random_floats(64 * 10, 7);
  const auto ys = random_labels(64, 10, 8);
  auto train = [&](Program& p, std::vector<std::byte>* first_loss) {
    for (int s = 0; s < 3; ++s) {
      p.set_input("x", std::span<const float>(xs));
      p.set_input("y", std::span<const int32_t>(ys));
      p.run();
      if (s == 0 && first_loss) *first_loss = p.read(loss.name());
    }
  };
  // Once before, so that every kernel is loaded: CUDA loads a module at its first launch,
  // and that may wait for the whole device.
  {
    Program warm = m.compile({.loss = loss.id(), .optimizer = opt, .fuse_elementwise = false});
    train(warm, nullptr);
    warm.check();
  }
  std::vector<std::byte> first_loss;
  bool closed = false;
  {
    LegacyStreamGate gate;
    Program p = m.compile({.loss = loss.id(), .optimizer = opt, .fuse_elementwise = false});
    train(p, &first_loss);
    const auto last = p.read(loss.name());
    closed = gate.closed_all_along();
    EXPECT_NE(first_loss, last);  // it trained
    gate.open();
  }
  EXPECT_TRUE(closed) << "compiling or running waited for the legacy default stream";
}

TEST(GpuBackend, EveryOpHasACudaPreparer) {
  for (int i = 0; i < kNumOps; ++i) {
    const auto op = static_cast<Op>(i);
    if (op_def(op).view_of >= 0) continue;  // views run no kernel
    EXPECT_NO_THROW(cuda::preparer_for(op)) << op_name(op);
  }
}

TEST(GpuBackend, PreparersRefuseDtypesTheyDoNotTake) {
  cudaStream_t s = nullptr;
  SEAM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* buf = nullptr;
  SEAM_CUDA_CHECK(cudaMalloc(&buf, 4096));
  {
    cuda::Context ctx;
    ctx.stream = s;
    ctx.sm_count = 1;
    auto refused = [&](Op op, Attrs attrs, std::vector<TensorType> in, std::vector<TensorType> out) {
      PlanStep st{op, std::move(attrs), {}, {}, "step", 0};
      cuda::StepArgs a{st, 0, {}, {}, ctx};
      for (auto& t : in) a.in.push_back({buf, t});
      for (auto& t : out) a.out.push_back({buf, t});
      try {
        cuda::preparer_for(op)(a);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("takes f32"), std::string::npos) << e.what();
        return;
      }
      ADD_FAILURE() << op_name(op) << " took " << in[0].str();
    };
    // Integers where the kernels compute in f32.
    refused(Op::relu, {}, {{DType::i32, {8}}}, {{DType::i32, {8}}});
    refused(Op::add, {}, {{DType::u8, {8}}, {DType::u8, {8}}}, {{DType::u8, {8}}});
    refused(Op::sum, {{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}}, {{DType::i32, {4, 2}}},
            {{DType::i32, {2}}});
    refused(Op::softmax, {{"axis", int64_t{-1}}}, {{DType::i32, {2, 4}}}, {{DType::i32, {2, 4}}});
    // An embedding's ids must be i32, its table f32.
    refused(Op::embedding, {}, {{DType::i32, {4}}, {DType::i32, {8, 2}}}, {{DType::i32, {4, 2}}});
  }
  SEAM_CUDA_CHECK(cudaFree(buf));
  SEAM_CUDA_CHECK(cudaStreamDestroy(s));
}
