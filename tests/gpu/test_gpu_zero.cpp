// ZeRO-1 on the GPU over one device. In a group of one every NCCL collective is the
// identity, so the sharded path can run here: a whole model through it must give the
// plain step's bits, and the sharded update of any [lo, hi) (standing for a rank's shard
// of a larger group) must give those values what the update of them alone gives, leave
// the others as they were but for their working copies, which are the masters rounded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cuda/check.h"
#include "backend/cuda/nccl.h"
#include "backend/cuda/optim.h"
#include "common/half.h"
#include "dist/comm.h"
#include "gpu_check.h"
#include "model_core.h"
#include "test_util.h"

using namespace seam;
using namespace seam::gpu_testing;

namespace {

// What one update leaves in the buffers.
struct After {
  std::vector<float> p, g, opt, grad_norm;  // 16-bit parameters and gradients widened
  std::vector<uint16_t> working;            // the working copies' bits (f32 masters only)
  int64_t step = 0;
};

struct Update {
  OptimizerConfig config;
  DType param = DType::f32;          // f32 masters, or bf16 parameters without them
  std::optional<DType> working;      // the masters' working copies
  int64_t n = 0, n_decay = 0;
};

// Values stored as t (16-bit ones rounded to nearest even), as a model holds them.
std::vector<std::byte> as_stored(const std::vector<float>& v, DType t) {
  return encode(std::vector<double>(v.begin(), v.end()), t);
}

// One update on the GPU of parameters p with gradients g and moments `opt` (slot after
// slot, `shard` ? its values : all of them), at step 3. `shard`: only [lo, hi) of the
// values, through NCCL over a group of one.
After run_update(const Update& u, const std::vector<float>& p, const std::vector<float>& g,
                 const std::vector<float>& opt, const std::pair<int64_t, int64_t>* shard) {
  const size_t ps = dtype_size(u.param);
  Layout layout;
  layout.param_dtype = u.param;
  layout.param_bytes = static_cast<size_t>(u.n) * ps;
  layout.decay_bytes = static_cast<size_t>(u.n_decay) * ps;
  auto up = [](const void* host, size_t bytes) {
    void* d = nullptr;
    SEAM_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(bytes, 16)));
    if (bytes > 0) SEAM_CUDA_CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return static_cast<std::byte*>(d);
  };
  const auto pb = as_stored(p, u.param), gb = as_stored(g, u.param);
  Regions r;
  r.params = up(pb.data(), pb.size());
  r.grads = up(gb.data(), gb.size());
  r.opt = up(opt.data(), opt.size() * sizeof(float));
  std::vector<uint16_t> stale(static_cast<size_t>(u.n), 0x7fc0);  // a NaN's bits: every copy must be written
  if (u.working) r.working = up(stale.data(), stale.size() * 2);
  cuda::DeviceCounters counters{3, 77, 0.f, 0.f, 0.f, 0, 0, 0};
  r.counters = up(&counters, sizeof counters);
  After out;
  {
    const std::shared_ptr<dist::Comm> one = dist::single_process();
    std::unique_ptr<cuda::Nccl> nccl = shard ? std::make_unique<cuda::Nccl>(*one) : nullptr;
    cuda::Context ctx;
    SEAM_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
    cudaDeviceProp prop{};
    SEAM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    ctx.sm_count = prop.multiProcessorCount;
    ctx.counters = reinterpret_cast<cuda::DeviceCounters*>(r.counters);
    cuda::OptimizerShard s;
    if (shard) s = {shard->first, shard->second, nccl.get()};
    cuda::Launch launch = cuda::prepare_optimizer(u.config, layout, r, ctx, nullptr, u.working, shard ? &s : nullptr);
    launch(ctx.stream);
    SEAM_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    SEAM_CUDA_CHECK(cudaStreamDestroy(ctx.stream));
  }
  auto down = [](std::byte* d, size_t bytes) {
    std::vector<std::byte> h(bytes);
    if (bytes > 0) SEAM_CUDA_CHECK(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
    SEAM_CUDA_CHECK(cudaFree(d));
    return h;
  };
  out.p = seam::testing::as_floats(down(r.params, pb.size()), u.param);
  out.g = seam::testing::as_floats(down(r.grads, gb.size()), u.param);
  out.opt = seam::testing::as_floats(down(r.opt, opt.size() * sizeof(float)), DType::f32);
  if (u.working) {
    const auto w = down(r.working, stale.size() * 2);
    out.working.resize(stale.size());
    std::memcpy(out.working.data(), w.data(), w.size());
  }
  const auto c = down(r.counters, sizeof counters);
  std::memcpy(&counters, c.data(), sizeof counters);
  out.grad_norm = {counters.grad_norm};
  out.step = counters.step;
  return out;
}

std::vector<float> slice(const std::vector<float>& v, int64_t lo, int64_t hi) {
  return {v.begin() + lo, v.begin() + hi};
}

// The moments of values [lo, hi), slot after slot, out of all of them.
std::vector<float> moments_of(const std::vector<float>& opt, int slots, int64_t n, int64_t lo, int64_t hi) {
  std::vector<float> out;
  for (int k = 0; k < slots; ++k)
    for (int64_t i = lo; i < hi; ++i) out.push_back(opt[static_cast<size_t>(k * n + i)]);
  return out;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (!(std::abs(got[i] - want[i]) <= rel * std::max(1e-3, static_cast<double>(std::abs(want[i]))))) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << ", want " << want[i];
      ++bad;
    }
}

// Random parameters, gradients and moments (second moments positive) for n values.
struct Start {
  std::vector<float> p, g, opt;
};
Start random_start(int64_t n, int slots, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> pos(1e-6f, 1e-3f);
  Start s;
  for (int64_t i = 0; i < n; ++i) s.p.push_back(nd(rng)), s.g.push_back(0.3f * nd(rng));
  for (int k = 0; k < slots; ++k)
    for (int64_t i = 0; i < n; ++i) s.opt.push_back(k == 1 ? pos(rng) : 0.01f * nd(rng));
  return s;
}

TEST(GpuZero, AShardsUpdateIsTheUpdateOfItsValuesAloneAndTheRestKeepTheirMasters) {
  OptimizerConfig adamw = OptimizerConfig::adamw(1e-2, 0.1);
  adamw.clip_norm = 0.5;  // below the shards' norms: the clipping factor is the shard's
  OptimizerConfig sgd = OptimizerConfig::sgd(0.05, 0.9);
  sgd.weight_decay = 0.01;
  const int64_t n = 1000, n_decay = 300;
  // Shards starting at a multiple of 4 values (four at a time) and elsewhere (one at a time),
  // across the end of the decayed values and not, and empty.
  const std::pair<int64_t, int64_t> shards[] = {{0, 1000}, {8, 604}, {5, 778}, {300, 1000}, {400, 400}};
  for (const OptimizerConfig& c : {adamw, sgd})
    for (std::optional<DType> working : {std::optional<DType>{}, std::optional<DType>{DType::bf16}})
      for (const auto& sh : shards) {
        const auto [lo, hi] = sh;
        const std::string what = std::string(c.kind == OptimizerConfig::Kind::sgd ? "sgd" : "adamw") +
                                 (working ? " with bf16 working copies" : "") + ", shard [" + std::to_string(lo) +
                                 ", " + std::to_string(hi) + ")";
        SCOPED_TRACE(what);
        const int slots = c.state_slots();
        const Start st = random_start(n, slots, 11);
        const After sharded =
            run_update({c, DType::f32, working, n, n_decay}, st.p, st.g, moments_of(st.opt, slots, n, lo, hi), &sh);
        // The shard's values as a model of their own (decayed where they were).
        const After alone = run_update({c, DType::f32, working, hi - lo, std::clamp<int64_t>(n_decay - lo, 0, hi - lo)},
                                       slice(st.p, lo, hi), slice(st.g, lo, hi), moments_of(st.opt, slots, n, lo, hi),
                                       nullptr);
        expect_near(slice(sharded.p, lo, hi), alone.p, 1e-6, "parameters");
        expect_near(slice(sharded.g, lo, hi), alone.g, 1e-6, "clipped gradients");
        expect_near(sharded.opt, alone.opt, 1e-6, "moments");
        if (hi > lo) {
          EXPECT_NEAR(sharded.grad_norm[0], alone.grad_norm[0], 1e-6 * alone.grad_norm[0]);
        }
        EXPECT_EQ(sharded.step, 4);
        for (int64_t i = 0; i < n; ++i) {
          if (i >= lo && i < hi) continue;
          ASSERT_EQ(sharded.p[static_cast<size_t>(i)], st.p[static_cast<size_t>(i)]) << "value " << i << " moved";
          ASSERT_EQ(sharded.g[static_cast<size_t>(i)], st.g[static_cast<size_t>(i)]) << "gradient " << i << " moved";
        }
        for (size_t i = 0; i < sharded.working.size(); ++i)
          ASSERT_EQ(sharded.working[i], float_to_half(sharded.p[i], DType::bf16)) << "working copy " << i;
      }
}

// bf16 parameters without masters round each new value stochastically, with a draw
// keyed by the value's place in the whole model: a shard's values round as the whole
// update rounds them (no clipping here, so each value's update is its own).
TEST(GpuZero, AShardOfBf16ParametersRoundsWithTheWholeModelsDraws) {
  const OptimizerConfig adamw = OptimizerConfig::adamw(1e-2, 0.1);
  const int64_t n = 4096, n_decay = 1500;
  const Start st = random_start(n, 2, 12);
  // Start from bf16 values, as such a model holds them.
  std::vector<float> p = st.p, g = st.g;
  for (float& v : p) v = half_to_float(float_to_half(v, DType::bf16), DType::bf16);
  for (float& v : g) v = half_to_float(float_to_half(v, DType::bf16), DType::bf16);
  const After whole = run_update({adamw, DType::bf16, {}, n, n_decay}, p, g, st.opt, nullptr);
  for (const std::pair<int64_t, int64_t>& sh : {std::pair<int64_t, int64_t>{1024, 3072}, {1003, 2901}}) {
    const auto [lo, hi] = sh;
    SCOPED_TRACE("shard [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
    const After part = run_update({adamw, DType::bf16, {}, n, n_decay}, p, g, moments_of(st.opt, 2, n, lo, hi), &sh);
    // The f32 arithmetic of one value at a time and of four may round apart in the last
    // f32 bit, and a draw next to that can flip a rounding: rarely. Draws of the wrong
    // place would flip about a third of them.
    int64_t differ = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const float a = part.p[static_cast<size_t>(i)], b = whole.p[static_cast<size_t>(i)];
      if (a == b) continue;
      ++differ;
      const float ulp = std::abs(b) * 0x1p-7f;
      EXPECT_LE(std::abs(a - b), ulp) << "value " << i;
    }
    EXPECT_LE(differ, (hi - lo) / 200) << differ << " of " << hi - lo << " values rounded apart";
    expect_near(part.opt, moments_of(whole.opt, 2, n, lo, hi), 1e-6, "moments");
    for (int64_t i = 0; i < n; ++i) {
      if (i >= lo && i < hi) continue;
      ASSERT_EQ(part.p[static_cast<size_t>(i)], p[static_cast<size_t>(i)]) << "value " << i;
    }
  }
}

// The reduce-scatter (a grouped ncclReduce), the norm summed over the ranks and the
// gather (a grouped ncclBroadcast), captured into the step's CUDA Graph or not.
TEST(GpuZero, ZeroOneOverAGroupOfOneGivesThePlainStepsBits) {
  for (const char* example : {"fmnist_cnn", "gpt_fortunes"})
    for (bool graph : {true, false}) {
      SCOPED_TRACE(std::string(example) + (graph ? " in a CUDA Graph" : " launched op by op"));
      const std::shared_ptr<dist::Comm> one = dist::single_process();
      const auto plain = train_example(example, {.graph = graph, .ranks = one});
      const auto zero = train_example(example, {.graph = graph, .ranks = one, .zero = 1});
      ASSERT_EQ(plain.size(), zero.size());
      for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(plain[i].data == zero[i].data) << plain[i].name;
    }
}

}  // namespace
