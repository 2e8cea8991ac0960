// The optimizer update on the GPU. Same formulas as the CPU reference
// (src/backend/cpu/optim.cpp: PyTorch's SGD, Adam, AdamW and clip_grad_norm_), in f32
// with the bias corrections and learning rate computed once per launch in double.
#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/nccl.h"
#include "backend/cuda/optim.h"
#include "backend/cuda/storage.cuh"
#include "common/philox.h"
#include "common/stochastic.h"
#include "dist/comm.h"

namespace seam::cuda {

namespace {

constexpr int kThreads = 256;

// Everything the update needs besides the buffers; passed by value. The betas stay double
// for the bias corrections and their complements (1 - beta) are taken in double on the
// host: in float, 1 - 0.999f is 1.3e-5 off 0.001, and Adam's second moment and its bias
// correction would carry that error.
struct Hyper {
  int kind;  // OptimizerConfig::Kind
  float momentum, one_minus_dampening, one_minus_beta1, one_minus_beta2, eps, weight_decay, clip_norm;
  double beta1, beta2;
  bool nesterov;
  double lr;
  int sched_kind;
  int64_t warmup, step_size, total;
  double gamma, min_lr;
  bool scaled, skip_nonfinite;  // dynamic loss scaling; the NaN/Inf guard
  float scale_init, growth, backoff;
  int32_t interval;
};

// The scale this step's backward pass used (the loss_scale op reads the same), or 1.
__device__ float step_scale(const Hyper& h, const DeviceCounters* c) {
  if (!h.scaled) return 1.f;
  return c->loss_scale > 0.f ? c->loss_scale : h.scale_init;
}

__device__ double lr_at(const Hyper& h, int64_t step) {
  if (step < h.warmup) return h.lr * static_cast<double>(step + 1) / static_cast<double>(h.warmup);
  const int64_t t = step - h.warmup;
  if (h.sched_kind == static_cast<int>(Schedule::Kind::step))
    return h.lr * pow(h.gamma, static_cast<double>(t / (h.step_size > 0 ? h.step_size : 1)));
  if (h.sched_kind == static_cast<int>(Schedule::Kind::cosine)) {
    double p = fmin(1.0, static_cast<double>(t) / static_cast<double>(h.total > 0 ? h.total : 1));
    return h.min_lr + (h.lr - h.min_lr) * 0.5 * (1.0 + cos(3.14159265358979323846 * p));
  }
  return h.lr;
}

// 16 bytes of G: four floats or eight 16-bit values.
template <class G>
struct alignas(16) Vec16 {
  G v[16 / sizeof(G)];
};

template <class G, int K>
__device__ __forceinline__ float sumsq_of(const G (&v)[K]) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < K; ++e) s = fmaf(to_float(v[e]), to_float(v[e]), s);
  return s;
}

// Squared norm of the gradients: per-block partial sums, then one block adds them up,
// in a fixed order so the result is the same on every run. Each thread keeps two 16-byte
// loads in flight (one scalar load at a time would leave the read latency-bound at about
// half the memory's bandwidth); the values before g's first 16-byte boundary (a ZeRO-1
// shard starts anywhere) and after its last whole pack are read one by one.
template <class G>
__global__ void sumsq_partial(const G* __restrict__ g, int64_t n, float* __restrict__ partial) {
  constexpr int64_t kPer = 16 / sizeof(G);
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  const auto head = min(n, static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(g) % 16) % 16 / sizeof(G)));
  float s0 = 0.f, s1 = 0.f;
  if (first < head) s0 = to_float(g[first]) * to_float(g[first]);
  g += head, n -= head;
  const auto* gv = reinterpret_cast<const Vec16<G>*>(g);
  const int64_t packs = n / kPer;
  int64_t j = first;
  for (; j + stride < packs; j += 2 * stride) {
    const Vec16<G> a = gv[j], b = gv[j + stride];
    s0 += sumsq_of(a.v);
    s1 += sumsq_of(b.v);
  }
  if (j < packs) s0 += sumsq_of(gv[j].v);
  for (int64_t i = packs * kPer + first; i < n; i += stride) {
    const float x = to_float(g[i]);
    s1 = fmaf(x, x, s1);
  }
  const float s = block_sum(s0 + s1);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// The norm of the unscaled gradients from their sum of squares, and whether the step may
// update: a NaN or Inf anywhere in the gradients makes the sum (and so the norm) non-finite.
__device__ void finish_norm(double sumsq, const Hyper& h, const float* loss, DeviceCounters* c, int* ok) {
  const float norm = static_cast<float>(sqrt(sumsq) / step_scale(h, c));
  c->grad_norm = norm;
  const bool finite = isfinite(norm) && (loss == nullptr || isfinite(*loss));
  *ok = finite || !(h.skip_nonfinite || h.scaled);
}

// The partials added up: the norm, or (`total` not null) this rank's sum of squares,
// which the ranks add up before norm_of_total (ZeRO-1: each holds a shard).
__global__ void sumsq_final(const float* __restrict__ partial, int blocks, Hyper h, const float* loss,
                            DeviceCounters* c, int* ok, double* total) {
  double s = 0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) {
    if (total) *total = s;
    else finish_norm(s, h, loss, c, ok);
  }
}

__global__ void norm_of_total(const double* total, Hyper h, const float* loss, DeviceCounters* c, int* ok) {
  finish_norm(*total, h, loss, c, ok);
}

// The working copies of the values outside this rank's shard [lo, lo + k), from the
// masters the ranks gathered (the update wrote the shard's): rounded as the update rounds.
template <class W>
__global__ void round_outside(W* __restrict__ working, const float* __restrict__ p, int64_t lo, int64_t k, int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n - k; j += stride) {
    const int64_t i = j < lo ? j : j + k;
    working[i] = from_float<W>(p[i]);
  }
}

// The step's factors, the same for every element.
struct StepConsts {
  int64_t t;  // updates done so far
  float lr, scale, step_size, sqrt_bc2, beta1, beta2;
};

// One element's update: p, g (unscaled and clipped on the way in), m, v in registers.
__device__ __forceinline__ void update_one(const Hyper& h, const StepConsts& k, float wd, float& pi, float gi,
                                           float& mi, float& vi) {
  if (h.kind == static_cast<int>(OptimizerConfig::Kind::sgd)) {
    gi += wd * pi;
    if (h.momentum != 0.f) {
      mi = k.t == 0 ? gi : h.momentum * mi + h.one_minus_dampening * gi;
      gi = h.nesterov ? gi + h.momentum * mi : mi;
    }
    pi -= k.lr * gi;
  } else {
    if (h.kind == static_cast<int>(OptimizerConfig::Kind::adamw)) pi *= 1.f - k.lr * wd;
    else gi += wd * pi;
    mi = k.beta1 * mi + h.one_minus_beta1 * gi;
    vi = k.beta2 * vi + h.one_minus_beta2 * gi * gi;
    pi -= k.step_size * mi / (sqrtf(vi) / k.sqrt_bc2 + h.eps);
  }
}

// The last block to finish advances the step counter (every block has read it by then),
// which saves a launch per step; `done` counts finished blocks and is reset for the next.
// The bits of a 16-bit value as a float, for round_stochastic.
template <class P>
__device__ __forceinline__ float half_bits_value(uint16_t b) {
  if constexpr (std::is_same_v<P, bf16_t>) return __bfloat162float(__ushort_as_bfloat16(b));
  else return __half2float(__ushort_as_half(b));
}

// A new value of a parameter stored as P: f32 as it is; 16-bit (no masters) rounded
// stochastically with the draw u, the CPU's for (seed, step, index).
template <class P>
__device__ __forceinline__ P rounded_param(float x, float u) {
  if constexpr (std::is_same_v<P, float>) {
    return x;
  } else {
    const P nearest = from_float<P>(x);
    uint16_t bits;
    memcpy(&bits, &nearest, 2);
    const uint16_t r = round_stochastic(x, bits, half_bits_value<P>, u);
    P out;
    memcpy(&out, &r, 2);
    return out;
  }
}

template <class P>
__device__ __forceinline__ P store_param(float x, const DeviceCounters* c, int64_t step, int64_t i) {
  if constexpr (std::is_same_v<P, float>) return x;
  else return rounded_param<P>(x, dropout_uniform(c->seed, static_cast<uint64_t>(step), kRoundingStream, i));
}

// Four consecutive values: one 16-byte (f32) or 8-byte (16-bit) load or store.
template <class T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

// What the update reads of four consecutive values: gradients, parameters, both moments.
template <class P>
struct Packs {
  Pack4<P> g, p;
  float4 m, v;
};

// A skipped step (ok false) changes nothing but the counters: the step, the skips and
// the loss scale. P: how parameters and gradients are stored (f32 masters, or 16 bits
// without). W: the storage type of the working copies the update writes beside f32
// masters (void: none). vec4: every buffer is read and written four values at a time
// (n % 4 == 0, so v = m + n stays 16-byte aligned), and 16-bit parameters draw the four
// roundings from one Philox call (elements 4j .. 4j + 3 are the words of block j).
// The buffers start at value `base` of the flat parameters (a ZeRO-1 shard; a multiple of
// 4 where vec4), whose index keys the rounding draws.
template <class P, class W>
__global__ void update(P* __restrict__ p, const P* __restrict__ g, float* __restrict__ m, float* __restrict__ v,
                       W* __restrict__ working, int64_t n, int64_t n_decay, Hyper h, DeviceCounters* c, const int* ok,
                       unsigned* done, bool vec4, int64_t base) {
  const int64_t step = c->step;
  const bool go = ok == nullptr || *ok;
  // Updates done so far (Adam's bias correction, SGD's first momentum step): skipped
  // steps made none. The schedule counts every step.
  StepConsts k;
  k.t = step - c->skipped_steps;
  k.lr = static_cast<float>(lr_at(h, step));
  k.scale = 1.f / step_scale(h, c);  // unscaling and clipping in one factor
  if (h.clip_norm > 0.f) k.scale *= fminf(1.f, h.clip_norm / (c->grad_norm + 1e-6f));
  const float bc1 = static_cast<float>(1.0 - pow(h.beta1, static_cast<double>(k.t + 1)));
  k.sqrt_bc2 = static_cast<float>(sqrt(1.0 - pow(h.beta2, static_cast<double>(k.t + 1))));
  k.beta1 = static_cast<float>(h.beta1), k.beta2 = static_cast<float>(h.beta2);
  k.step_size = k.lr / bc1;
  const bool has_m = m != nullptr, has_v = v != nullptr;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  const auto load = [&](int64_t j) {
    Packs<P> q;
    q.g = reinterpret_cast<const Pack4<P>*>(g)[j], q.p = reinterpret_cast<const Pack4<P>*>(p)[j];
    q.m = has_m ? reinterpret_cast<const float4*>(m)[j] : float4{};
    q.v = has_v ? reinterpret_cast<const float4*>(v)[j] : float4{};
    return q;
  };
  const auto apply = [&](int64_t j, Packs<P>& q) {
    const int64_t i = 4 * j;
    float* me = &q.m.x; float* ve = &q.v.x;
    float pe[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      pe[e] = to_float(q.p.v[e]);
      float ge = to_float(q.g.v[e]) * k.scale;  // the unscaled, clipped gradient
      update_one(h, k, i + e < n_decay ? h.weight_decay : 0.f, pe[e], ge, me[e], ve[e]);
    }
    Pack4<P> po;
    if constexpr (std::is_same_v<P, float>) {
#pragma unroll
      for (int e = 0; e < 4; ++e) po.v[e] = pe[e];
    } else {
      const Philox4 r =
          dropout_words(c->seed, static_cast<uint64_t>(step), kRoundingStream, static_cast<uint64_t>(base / 4 + j));
#pragma unroll
      for (int e = 0; e < 4; ++e) po.v[e] = rounded_param<P>(pe[e], philox_uniform(r.v[e]));
    }
    if constexpr (!std::is_void_v<W>) {
      Pack4<W> wv;
#pragma unroll
      for (int e = 0; e < 4; ++e) wv.v[e] = from_float<W>(pe[e]);
      reinterpret_cast<Pack4<W>*>(working)[j] = wv;
    }
    reinterpret_cast<Pack4<P>*>(p)[j] = po;
    if (has_m) reinterpret_cast<float4*>(m)[j] = q.m;
    if (has_v) reinterpret_cast<float4*>(v)[j] = q.v;
  };
  // Two packs a thread in flight: both loaded before either is computed, so a thread
  // waits on the memory once for 2 x (16 + 16 + 16 + 16) bytes where f32 masters are
  // updated. With one pack the update read the H200's memory at ~80% of a copy's rate,
  // which more bytes in flight would lift if latency binds it; on the H100, already near
  // its copy rate, the second pack gave 7-9 us of 1.3 ms.
  const int64_t packs = go && vec4 ? n / 4 : 0;
  int64_t j = first;
  for (; j + stride < packs; j += 2 * stride) {
    Packs<P> a = load(j), b = load(j + stride);
    apply(j, a);
    apply(j + stride, b);
  }
  if (j < packs) {
    Packs<P> a = load(j);
    apply(j, a);
  }
  const bool scalar = !vec4;
  for (int64_t i = first; go && scalar && i < n; i += stride) {
    const float clipped = to_float(g[i]) * k.scale;
    float pi = to_float(p[i]), mi = has_m ? m[i] : 0.f, vi = has_v ? v[i] : 0.f;
    update_one(h, k, i < n_decay ? h.weight_decay : 0.f, pi, clipped, mi, vi);
    p[i] = store_param<P>(pi, c, step, base + i);
    if (has_m) m[i] = mi;
    if (has_v) v[i] = vi;
    if constexpr (!std::is_void_v<W>) working[i] = from_float<W>(pi);
  }
  __syncthreads();  // every thread of this block has read the counters
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(done, 1u) == gridDim.x - 1) {
      c->lr = k.lr;
      c->step = step + 1;
      c->grad_scale = go ? k.scale : 1.f;
      if (!go) {
        ++c->skipped_steps;
        ++c->skip_streak;
        if (h.scaled) c->loss_scale = step_scale(h, c) * h.backoff, c->scale_good = 0;
      } else {
        c->skip_streak = 0;
        if (h.scaled) {
          c->loss_scale = step_scale(h, c);
          if (++c->scale_good >= h.interval) c->loss_scale *= h.growth, c->scale_good = 0;
        }
      }
      *done = 0;
    }
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

__global__ void reset_grad_scale(DeviceCounters* c) { c->grad_scale = 1.f; }

Launch gradients_as_written(Context& ctx) {
  DeviceCounters* c = ctx.counters;
  return [c](cudaStream_t stream) {
    reset_grad_scale<<<1, 1, 0, stream>>>(c);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

Launch prepare_optimizer(const OptimizerConfig& c, const Layout& layout, const Regions& r, Context& ctx,
                         const float* loss, std::optional<DType> working, const OptimizerShard* shard) {
  if (working && (*working != DType::bf16 && *working != DType::f16))
    fail("the CUDA optimizer writes bf16 or f16 working copies, not ", dtype_name(*working));
  const DType pt = layout.param_dtype;
  if (pt != DType::f32 && !is_half(pt))
    fail("the CUDA optimizer updates f32, bf16 or f16 parameters, the model's are ", dtype_name(pt));
  if (working && pt != DType::f32) fail("working copies are of f32 masters, the parameters are ", dtype_name(pt));
  Hyper h{static_cast<int>(c.kind), static_cast<float>(c.momentum), static_cast<float>(1.0 - c.dampening),
          static_cast<float>(1.0 - c.beta1), static_cast<float>(1.0 - c.beta2), static_cast<float>(c.eps),
          static_cast<float>(c.weight_decay), static_cast<float>(c.clip_norm), c.beta1, c.beta2, c.nesterov, c.lr,
          static_cast<int>(c.schedule.kind), c.schedule.warmup_steps, c.schedule.step_size, c.schedule.total_steps,
          c.schedule.gamma, c.schedule.min_lr,
          c.loss_scaling.mode == LossScaling::Mode::dynamic, c.skip_nonfinite,
          static_cast<float>(c.loss_scaling.init), static_cast<float>(c.loss_scaling.growth),
          static_cast<float>(c.loss_scaling.backoff), static_cast<int32_t>(std::min<int64_t>(c.loss_scaling.interval, INT32_MAX))};
  const auto n = static_cast<int64_t>(layout.param_bytes / dtype_size(pt));
  const auto n_decay = static_cast<int64_t>(layout.decay_bytes / dtype_size(pt));
  // This rank's values [lo, lo + k): all of them, or its ZeRO-1 shard.
  const int64_t lo = shard ? shard->lo : 0, k = shard ? shard->hi - shard->lo : n;
  if (lo < 0 || k < 0 || lo + k > n) fail("the optimizer's shard [", lo, ", ", lo + k, ") is not within the ", n, " values");
  Nccl* nccl = shard ? shard->nccl : nullptr;
  if (shard && !nccl) fail("a sharded update needs the ranks' NCCL communicator");
  std::vector<size_t> gathered;  // the ranks' shards, in bytes
  if (shard) {
    gathered = zero_split(static_cast<size_t>(n), nccl->host().size());
    for (size_t& b : gathered) b *= dtype_size(pt);
  }
  std::byte* p = r.params + lo * dtype_size(pt);
  std::byte* g = r.grads + lo * dtype_size(pt);
  // Only the moments the optimizer has: momentum SGD one, Adam two; of this rank's values.
  float* m = c.state_slots() > 0 ? reinterpret_cast<float*>(r.opt) : nullptr;
  float* v = m && c.state_slots() > 1 ? m + k : nullptr;
  void* w = working ? r.working + lo * dtype_size(*working) : nullptr;
  // cudaMalloc'd buffers and an arena region: then every one is aligned as vec4 needs
  // when the shard starts at a multiple of 4 values.
  const bool vec4 = k % 4 == 0 && lo % 4 == 0 && aligned(p, 4 * dtype_size(pt)) && aligned(g, 4 * dtype_size(pt)) &&
                    aligned(r.opt, 16) && aligned(w, 8);
  if (!aligned(r.grads, 16)) fail("the gradient buffer is not 16-byte aligned");
  const int64_t k_decay = std::clamp<int64_t>(n_decay - lo, 0, k);
  DeviceCounters* counters = ctx.counters;
  const int cap = ctx.sm_count * 8;
  const unsigned blocks = blocks_for(k, kThreads, cap);
  // The norm pass runs where something reads it: clipping, the guard, the loss scale.
  const bool norm = c.needs_norm();
  float* partial = norm ? static_cast<float*>(ctx.scratch(blocks * sizeof(float))) : nullptr;
  int* ok = norm ? static_cast<int*>(ctx.scratch(sizeof(int))) : nullptr;
  auto* total = norm && shard ? static_cast<double*>(ctx.scratch(sizeof(double))) : nullptr;
  auto* done = static_cast<unsigned*>(ctx.scratch(sizeof(unsigned)));
  std::byte* params = r.params;
  std::byte* working_all = working ? r.working : nullptr;
  Launch launch;
  dispatch_storage(pt, "optimizer", [&]<class P>() {
    auto* pp = reinterpret_cast<P*>(p);
    auto* gp = reinterpret_cast<P*>(g);
    launch = [=](cudaStream_t s) {
      if (partial) {
        sumsq_partial<P><<<blocks, kThreads, 0, s>>>(gp, k, partial);
        SEAM_CUDA_LAUNCH_CHECK();
        sumsq_final<<<1, 1024, 0, s>>>(partial, static_cast<int>(blocks), h, loss, counters, ok, total);
        SEAM_CUDA_LAUNCH_CHECK();
        if (total) {
          nccl->all_reduce_sum(total, 1, DType::f64, s);
          norm_of_total<<<1, 1, 0, s>>>(total, h, loss, counters, ok);
          SEAM_CUDA_LAUNCH_CHECK();
        }
      }
      auto run = [&]<class W>(W* wp) {
        update<P, W><<<blocks, kThreads, 0, s>>>(pp, gp, m, v, wp, k, k_decay, h, counters, ok, done, vec4, lo);
        SEAM_CUDA_LAUNCH_CHECK();
        if (!nccl) return;
        // Every rank's new shard to every rank (a skipped step sends the values unchanged),
        // then the working copies of the others' shards.
        nccl->all_gather(params, gathered, s);
        if constexpr (!std::is_void_v<W>) {
          if (n > k) {
            round_outside<W><<<blocks_for(n - k, kThreads, cap), kThreads, 0, s>>>(
                reinterpret_cast<W*>(working_all), reinterpret_cast<const float*>(params), lo, k, n);
            SEAM_CUDA_LAUNCH_CHECK();
          }
        }
      };
      if constexpr (std::is_same_v<P, float>) {
        if (working && *working == DType::bf16) run(static_cast<bf16_t*>(w));
        else if (working) run(static_cast<f16_t*>(w));
        else run(static_cast<void*>(nullptr));
      } else {
        run(static_cast<void*>(nullptr));
      }
    };
  });
  return launch;
}

}  // namespace seam::cuda
