// batch_norm and its gradient on the GPU, per channel: over axis 1 of [N, C, ...]
// (layout nchw), or over the last axis of x [N, H, W, C] (layout nhwc, src/ops/layout.h).
// x, y, dy and dx are f32, bf16 or f16 (one dtype); gamma, beta, the running and saved
// statistics and dgamma, dbeta are f32 whatever x is: cuDNN's per-channel descriptor,
// derived from x's, is f32 for 16-bit data, and it computes in f32.
// Semantics as the CPU reference (src/backend/cpu/norm.cpp, as torch.nn.BatchNorm):
//  - training: normalize with the batch mean and biased variance; update the running
//    statistics in place with momentum, the running variance from the UNBIASED batch
//    variance. cudnnBatchNormalizationForwardTraining(Ex) does exactly that (cuDNN's
//    moving variance uses the n / (n - 1) estimate, which is why PyTorch and MXNet feed
//    it their running buffers unchanged); its saved "inverse variance" is 1/sqrt(var+eps).
//  - evaluation: normalize with the running statistics (cuDNN inference), and report
//    them as mean and invstd = 1/sqrt(running_var + eps) (a small kernel here).
//  - gradient in training: cudnnBatchNormalizationBackward(Ex) with the saved
//    mean/invstd; in evaluation (statistics are constants): a kernel here, one block per
//    channel, deterministic (no atomics).
// nchw: x of any rank >= 2 is viewed as [N, C, inner, 1], which SPATIAL mode normalizes
// per C, with the classic calls. nhwc: a 4-d NHWC descriptor [N, C, H, W]. Training
// there prefers cuDNN's channels-last kernels: the *Ex calls in
// CUDNN_BATCHNORM_SPATIAL_PERSISTENT mode, their workspace the executable's shared one.
// The Ex calls may want a reserve space that the forward writes and the backward reads;
// the two are separate steps with no buffer for it, so where cuDNN asks for one (or
// rejects the Ex workspace query) the step takes the classic calls in SPATIAL_PERSISTENT
// mode, and where cuDNN rejects that, SPATIAL. Each step tries its candidates once while
// it is prepared, on its own buffers (running statistics on scratch copies: a trial must
// not move them), keeps the first cuDNN runs, and says which in the executable's choices.
// Either step may take any path, as only the saved mean and invstd pass between them.
// cuDNN documents that SPATIAL_PERSISTENT reduces with scaled integers: finite inputs of
// very large magnitude may overflow to inf/NaN there where SPATIAL stays finite.
// Every output has a buffer of its own, read or not (lower() places all outputs of a
// live step).
// Activation relu and the residual z (fuse_norm_activations): in training, nhwc, cuDNN's
// fused Ex calls come first: CUDNN_BATCHNORM_OPS_BN_ACTIVATION forward (y = relu(bn(x)))
// and backward (dy of relu's output, with beta and y), CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
// forward (y = relu(bn(x) + z)) and backward (also writing dz, relu's masked gradient).
// The fused residual forward wants a reserve space (relu's mask), which only cuDNN's own
// backward reads: the forward keeps it in its scratch and leaves it in the context's
// `carried`, under the place of its saved mean; the gradient step, which reads that mean,
// takes cuDNN's fused backward only with the reserve found there. Where cuDNN takes none
// of them (nchw, evaluation, a refused shape, no reserve carried) the plain batch norm
// runs and the step's own elementwise kernels apply the add and relu (forward, in place
// on y) or relu's mask (backward, into dz or a scratch dy).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/cudnn_util.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/storage.cuh"

namespace seam::cuda {

namespace {

constexpr int kThreads = 256;

// x as [batch, channels, inner] (nchw) or [batch, inner, channels] (nhwc).
struct ChannelLayout {
  int64_t batch, channels, inner;
  int64_t h, w;  // the descriptor's spatial dims: (inner, 1) for nchw, (H, W) for nhwc
  __host__ __device__ int64_t count() const { return batch * inner; }  // values per channel
};

ChannelLayout channel_layout(const StepArgs& a, const Shape& s, bool nhwc) {
  if (nhwc) {
    if (s.size() != 4)
      fail(op_name(a.step.op), " '", a.step.name, "': x must be [N, H, W, C] (layout nhwc), got ", shape_str(s));
    return {s[0], s[3], s[1] * s[2], s[1], s[2]};
  }
  if (s.size() < 2) fail(op_name(a.step.op), " '", a.step.name, "': x needs rank >= 2, got ", shape_str(s));
  ChannelLayout l{s[0], s[1], 1, 1, 1};
  for (size_t d = 2; d < s.size(); ++d) l.inner *= s[d];
  l.h = l.inner;
  return l;
}

void expect_channels(const StepArgs& a, const DeviceTensor& t, int64_t channels, const char* what) {
  if (t.numel() != channels)
    fail(op_name(a.step.op), " '", a.step.name, "': ", what, " has ", t.numel(), " values for ", channels,
         " channels");
}

// The three outputs: x-shaped in x's dtype, then two f32 per channel; checked against x.
struct BnOutputs {
  void* data;
  float* c0;
  float* c1;
};

BnOutputs outputs(const StepArgs& a, const DeviceTensor& x, int64_t channels) {
  for (size_t i = 0; i < 3; ++i) {
    const int64_t want = i == 0 ? x.numel() : channels;
    if (a.out[i].numel() != want)
      fail(op_name(a.step.op), " '", a.step.name, "': output ", i, " ", shape_str(a.out[i].shape()),
           " does not fit x of ", x.numel(), " values in ", channels, " channels");
    expect_dtype(a, a.out[i], {i == 0 ? x.dtype() : DType::f32});
  }
  return {a.out[0].data, a.out[1].as<float>(), a.out[2].as<float>()};
}

// x (and the x-shaped operands, which must match it) in a storage type, the per-channel
// inputs f32.
void expect_dtypes(const StepArgs& a, const DeviceTensor& x, std::initializer_list<size_t> x_like,
                   std::initializer_list<size_t> per_channel) {
  expect_dtype(a, x, kStored);
  for (size_t i : x_like) expect_dtype(a, a.in[i], {x.dtype()});
  for (size_t i : per_channel) expect_dtype(a, a.in[i], {DType::f32});
}

struct BnSetup {
  TensorDesc x;   // [N, C, inner, 1] NCHW, or [N, C, H, W] stored NHWC
  TensorDesc bn;  // [1, C, 1, 1], derived (the same for every spatial mode)
  ActivationDesc relu;
};

std::shared_ptr<BnSetup> bn_setup(const StepArgs& a, const ChannelLayout& l, DType t, bool nhwc) {
  auto s = std::make_shared<BnSetup>();
  set_4d(a, s->x, t, l.batch, l.channels, l.h, l.w, nhwc);
  SEAM_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(s->bn, s->x, CUDNN_BATCHNORM_SPATIAL));
  SEAM_CUDNN_CHECK(cudnnSetActivationDescriptor(s->relu, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  return s;
}

const char* ops_name(cudnnBatchNormOps_t ops) {
  switch (ops) {
    case CUDNN_BATCHNORM_OPS_BN_ACTIVATION: return "CUDNN_BATCHNORM_OPS_BN_ACTIVATION";
    case CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION: return "CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION";
    default: return "CUDNN_BATCHNORM_OPS_BN";
  }
}

// How a training step calls cuDNN. nchw: always the classic call in SPATIAL mode. With
// ops other than CUDNN_BATCHNORM_OPS_BN cuDNN applies the step's residual add and relu;
// otherwise the step's own kernels do (with_residual_relu).
struct BnPath {
  bool ex = false;  // cudnnBatchNormalization*Ex
  cudnnBatchNormOps_t ops = CUDNN_BATCHNORM_OPS_BN;
  cudnnBatchNormMode_t mode = CUDNN_BATCHNORM_SPATIAL;
  size_t workspace = 0;     // the Ex call's, in the executable's shared workspace
  size_t reserve = 0;       // the reserve space: a fused forward's scratch, or carried to its backward
  void* reserve_at = nullptr;
  bool owns_reserve = false;  // the step's own scratch (a forward's)
  bool fused() const { return ops != CUDNN_BATCHNORM_OPS_BN; }
  std::string str() const {
    std::string s = ex ? std::string("Ex (") + ops_name(ops) + "), " : "classic, ";
    s += mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT ? "SPATIAL_PERSISTENT" : "SPATIAL";
    if (ex) s += ", workspace " + std::to_string(workspace) + " bytes";
    if (reserve) s += ", reserve " + std::to_string(reserve) + " bytes";
    return s;
  }
};

struct BnForward {
  const void* x;
  const void* z;  // the residual, or null
  const void* gamma;
  const void* beta;
  void* y;
  float* mean;
  float* invstd;
  double momentum, eps;
};

// One training forward on path p; the status, unchecked, so that a trial can read it.
cudnnStatus_t forward_training(cudnnHandle_t h, const BnSetup& s, const BnPath& p, const BnForward& f, float* rm,
                               float* rv, void* work) {
  const bool add = p.ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
  if (p.ex)
    return cudnnBatchNormalizationForwardTrainingEx(
        h, p.mode, p.ops, &kOne, &kZero, s.x, f.x, add ? s.x.get() : nullptr, add ? f.z : nullptr, s.x, f.y, s.bn,
        f.gamma, f.beta, f.momentum, rm, rv, f.eps, f.mean, f.invstd, p.fused() ? s.relu.get() : nullptr, work,
        p.workspace, p.reserve_at, p.reserve);
  return cudnnBatchNormalizationForwardTraining(h, p.mode, &kOne, &kZero, s.x, f.x, s.x, f.y, s.bn, f.gamma, f.beta,
                                                f.momentum, rm, rv, f.eps, f.mean, f.invstd);
}

struct BnBackward {
  const void* dy;
  const void* x;
  const float* gamma;
  const float* mean;
  const float* invstd;
  void* dx;
  float* dgamma;
  float* dbeta;
  double eps;
  const float* beta = nullptr;  // with activation relu: beta and relu's output y
  const void* y = nullptr;
  void* dz = nullptr;  // with a residual: relu's masked gradient, z's
};

// One training backward on path p; the status, unchecked.
cudnnStatus_t backward_training(cudnnHandle_t h, const BnSetup& s, const BnPath& p, const BnBackward& b, void* work) {
  const bool add = p.ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
  if (p.ex)
    return cudnnBatchNormalizationBackwardEx(h, p.mode, p.ops, &kOne, &kZero, &kOne, &kZero, s.x, b.x,
                                             p.fused() ? s.x.get() : nullptr, p.fused() ? b.y : nullptr, s.x, b.dy,
                                             add ? s.x.get() : nullptr, add ? b.dz : nullptr, s.x, b.dx, s.bn, b.gamma,
                                             p.fused() ? b.beta : nullptr, b.dgamma, b.dbeta, b.eps, b.mean, b.invstd,
                                             p.fused() ? s.relu.get() : nullptr, work, p.workspace, p.reserve_at,
                                             p.reserve);
  return cudnnBatchNormalizationBackward(h, p.mode, &kOne, &kZero, &kOne, &kZero, s.x, b.x, s.x, b.dy, s.x, b.dx, s.bn,
                                         b.gamma, b.dgamma, b.dbeta, b.eps, b.mean, b.invstd);
}

// The nhwc training path of a forward or backward step (see the top of the file): the
// first candidate whose trial call, trial(path, workspace), cuDNN runs. With `ops` other
// than CUDNN_BATCHNORM_OPS_BN (the step's residual add and relu) cuDNN's fused call comes
// first; a backward takes it where it needs no reserve space or `carried` holds the one
// its forward wrote with the same ops. The plain queries pass descriptors as PyTorch's
// channels-last batch norm does (x for every data descriptor, a null dz in the backward).
template <class Trial>
BnPath choose_nhwc(const StepArgs& a, const BnSetup& s, const Shape& xs, bool forward, cudnnBatchNormOps_t ops,
                   const Context::Carried* carried, Trial&& trial) {
  cudnnHandle_t h = cudnn_of(a.ctx);
  constexpr cudnnBatchNormMode_t persistent = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  std::vector<BnPath> candidates;
  std::string notes;  // what was passed over, and why
  auto ex_candidate = [&](cudnnBatchNormOps_t o) {
    const bool fused = o != CUDNN_BATCHNORM_OPS_BN;
    const cudnnActivationDescriptor_t act = fused ? s.relu.get() : nullptr;
    const cudnnTensorDescriptor_t z = o == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION ? s.x.get() : nullptr;
    size_t reserve = 0, ws = 0;
    cudnnStatus_t st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, persistent, o, act, s.x, &reserve);
    if (st == CUDNN_STATUS_SUCCESS)
      st = forward ? cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, persistent, o, s.x, z, s.x, s.bn, act,
                                                                             &ws)
                   : cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, persistent, o, s.x, fused ? s.x.get() : nullptr,
                                                                      s.x, z, s.x, s.bn, act, &ws);
    const std::string who = std::string("Ex (") + ops_name(o) + ")";
    const bool reserve_carried = carried && carried->kind == o && carried->bytes >= reserve;
    if (st != CUDNN_STATUS_SUCCESS) {
      notes += (notes.empty() ? "" : "; ") + who + ": the size queries say " + cudnnGetErrorString(st);
    } else if (reserve > 0 && !forward && !reserve_carried) {
      notes += (notes.empty() ? "" : "; ") + who + ": wants a reserve space of " + std::to_string(reserve) +
               " bytes, which its forward did not leave";
    } else if (reserve > 0 && forward && !fused) {
      notes += (notes.empty() ? "" : "; ") + who + ": wants a reserve space of " + std::to_string(reserve) + " bytes";
    } else {
      BnPath p{true, o, persistent, ws};
      if (reserve > 0 && forward) {  // a fused forward's, left for its backward
        p.reserve = reserve;
        p.reserve_at = a.ctx.scratch(reserve);
        p.owns_reserve = true;
      } else if (reserve > 0) {
        p.reserve = carried->bytes;
        p.reserve_at = carried->data;
      }
      candidates.push_back(p);
    }
  };
  if (ops != CUDNN_BATCHNORM_OPS_BN) ex_candidate(ops);
  ex_candidate(CUDNN_BATCHNORM_OPS_BN);
  candidates.push_back({false, CUDNN_BATCHNORM_OPS_BN, persistent});
  candidates.push_back({false, CUDNN_BATCHNORM_OPS_BN, CUDNN_BATCHNORM_SPATIAL});
  SEAM_CUDNN_CHECK(cudnnSetStream(h, a.ctx.stream));
  for (const BnPath& p : candidates) {
    if (p.workspace) a.ctx.need_workspace(p.workspace);
    const cudnnStatus_t st = trial(p, p.workspace ? a.ctx.workspace() : nullptr);
    if (st == CUDNN_STATUS_SUCCESS) {
      for (const BnPath& q : candidates)
        if (q.owns_reserve && q.reserve_at != p.reserve_at) a.ctx.release(q.reserve_at);
      a.ctx.choices.emplace_back(a.index, std::string(op_name(a.step.op)) + " nhwc: " + p.str() +
                                              (notes.empty() ? "" : " (passed over: " + notes + ")"));
      return p;
    }
    (void)cudaGetLastError();  // a launch cuDNN gave up on leaves no error for the next check
    notes += (notes.empty() ? "" : "; ") + p.str() + ": " + cudnnGetErrorString(st);
  }
  fail(op_name(a.step.op), " '", a.step.name, "': cuDNN runs no training batch norm for x ", shape_str(xs),
       " (layout nhwc, ", dtype_name(a.in[forward ? 0 : 1].dtype()), "): ", notes);
}

// Scratch running statistics for a forward's trial calls, which must leave the model's
// alone; freed stream-ordered behind them.
class TrialStats {
 public:
  TrialStats(int64_t channels, cudaStream_t stream) : stream_(stream) {
    const size_t bytes = 2 * static_cast<size_t>(channels) * sizeof(float);
    SEAM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), bytes, stream_));
    SEAM_CUDA_CHECK(cudaMemsetAsync(p_, 0, bytes, stream_));
    channels_ = channels;
  }
  ~TrialStats() {
    if (p_) (void)cudaFreeAsync(p_, stream_);
  }
  TrialStats(const TrialStats&) = delete;
  TrialStats& operator=(const TrialStats&) = delete;
  float* mean() const { return p_; }
  float* var() const { return p_ + channels_; }

 private:
  cudaStream_t stream_;
  float* p_ = nullptr;
  int64_t channels_ = 0;
};

// Evaluation reports the running statistics: mean = running_mean,
// invstd = 1 / sqrt(running_var + eps) (in double, as the CPU).
__global__ void eval_stats_kernel(const float* __restrict__ rm, const float* __restrict__ rv, double eps,
                                  float* __restrict__ mean, float* __restrict__ invstd, int64_t channels) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    mean[c] = rm[c];
    invstd[c] = static_cast<float>(1.0 / sqrt(static_cast<double>(rv[c]) + eps));
  }
}

bool relu_of(const StepArgs& a) { return a.step.attrs.has("activation") && a.step.attrs.s("activation") == "relu"; }

// `l`, then what cuDNN did not apply (`done`: it did): the residual add (y += z) and
// relu's value over y, in place, with the elementwise add and relu kernels.
Launch with_residual_relu(const StepArgs& a, Launch l, const DeviceTensor& y, bool done) {
  if (!relu_of(a) || done) return l;
  std::vector<Launch> parts{std::move(l)};
  if (a.in.size() > 5) parts.push_back(prepare_as_step(a, Op::add, Attrs{}, {y, a.in[5]}, {y}));
  parts.push_back(prepare_as_step(a, Op::relu, Attrs{}, {y}, {y}));
  return in_order(std::move(parts));
}

// inputs: x, gamma, beta, running_mean, running_var, and with a residual z (activation
// relu); outputs: y, mean, invstd.
Launch prepare_batch_norm(const StepArgs& a) {
  const bool residual = a.in.size() > 5;
  if (residual && !relu_of(a)) fail("batch_norm '", a.step.name, "': a residual z is given with activation relu only");
  if (residual) expect_dtypes(a, a.in[0], {5}, {1, 2, 3, 4});
  else expect_dtypes(a, a.in[0], {}, {1, 2, 3, 4});
  const bool nhwc = step_nhwc(a);
  const ChannelLayout l = channel_layout(a, a.in[0].shape(), nhwc);
  for (size_t i = 1; i < 5; ++i) expect_channels(a, a.in[i], l.channels, "an input");
  if (residual && a.in[5].shape() != a.in[0].shape())
    fail("batch_norm '", a.step.name, "': z ", shape_str(a.in[5].shape()), " and x ", shape_str(a.in[0].shape()),
         " differ");
  const BnOutputs out = outputs(a, a.in[0], l.channels);
  const bool training = a.step.attrs.i("training") != 0;
  const double momentum = a.step.attrs.f("momentum");
  const double eps = a.step.attrs.f("eps");
  if (!(eps >= CUDNN_BN_MIN_EPSILON))
    fail("batch_norm '", a.step.name, "': eps = ", eps, " is below cuDNN's minimum CUDNN_BN_MIN_EPSILON = ",
         CUDNN_BN_MIN_EPSILON);
  if (training && l.count() < 2)
    fail("batch_norm '", a.step.name, "' in training needs more than 1 value per channel, got input ",
         shape_str(a.in[0].shape()));
  auto s = bn_setup(a, l, a.in[0].dtype(), nhwc);
  cudnnHandle_t h = cudnn_of(a.ctx);
  const void* x = a.in[0].data;
  const void* gamma = a.in[1].data;
  const void* beta = a.in[2].data;
  float* rm = a.in[3].as<float>();  // persistent state, updated in place when training
  float* rv = a.in[4].as<float>();
  if (training) {
    const BnForward f{x, residual ? a.in[5].data : nullptr, gamma, beta, out.data, out.c0, out.c1, momentum, eps};
    const cudnnBatchNormOps_t ops = residual       ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                                    : relu_of(a) ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION
                                                 : CUDNN_BATCHNORM_OPS_BN;
    BnPath path;
    if (nhwc) {
      TrialStats scratch(l.channels, a.ctx.stream);
      path = choose_nhwc(a, *s, a.in[0].shape(), true, ops, nullptr, [&](const BnPath& p, void* work) {
        return forward_training(h, *s, p, f, scratch.mean(), scratch.var(), work);
      });
    }
    // The reserve for the gradient step, under the saved mean's place (which it reads);
    // an entry an earlier step left at that place is stale.
    const std::pair<Region, size_t> mean_at{a.step.out[1].region, a.step.out[1].offset};
    if (path.owns_reserve) a.ctx.carried[mean_at] = {path.reserve_at, path.reserve, static_cast<int>(path.ops)};
    else a.ctx.carried.erase(mean_at);
    Context* ctx = &a.ctx;
    return with_residual_relu(a,
                              [s, h, path, f, rm, rv, ctx](cudaStream_t stream) {
                                SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
                                SEAM_CUDNN_CHECK(forward_training(h, *s, path, f, rm, rv,
                                                                  path.workspace ? ctx->workspace() : nullptr));
                              },
                              a.out[0], path.fused());
  }
  const int64_t channels = l.channels;
  const unsigned blocks = blocks_for(channels, kThreads);
  return with_residual_relu(
      a,
      [s, h, out, x, gamma, beta, rm, rv, eps, channels, blocks](cudaStream_t stream) {
        SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
        SEAM_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, s->x, x,
                                                                 s->x, out.data, s->bn, gamma, beta, rm, rv, eps));
        eval_stats_kernel<<<blocks, kThreads, 0, stream>>>(rm, rv, eps, out.c0, out.c1, channels);
        SEAM_CUDA_LAUNCH_CHECK();
      },
      a.out[0], false);
}

// The evaluation gradient, one block per channel (grid-stride over channels):
// dbeta = sum(dy), dgamma = sum(dy * (x - mean) * invstd), dx = dy * gamma * invstd.
// Sums in double, each thread's share then a fixed-order block reduction: the same
// result on every run. dy, x and dx in storage type T, the rest f32. Value j of a channel
// is (batch b, position k) = (j / inner, j % inner); with Nhwc the channel is the last
// axis, so j sits at j * channels + c: strided loads, which this path (gradients through
// frozen statistics) can afford.
template <class T, bool Nhwc>
__global__ void bn_eval_grad_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                    const float* __restrict__ gamma, const float* __restrict__ mean,
                                    const float* __restrict__ invstd, T* __restrict__ dx,
                                    float* __restrict__ dgamma, float* __restrict__ dbeta, ChannelLayout l) {
  const int64_t n = l.count();
  for (int64_t c = blockIdx.x; c < l.channels; c += gridDim.x) {
    const double m = mean[c], s = invstd[c];
    const double scale = static_cast<double>(gamma[c]) * s;
    double sum_dy = 0, sum_dyx = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      int64_t i;
      if constexpr (Nhwc) {
        i = j * l.channels + c;
      } else {
        const int64_t b = j / l.inner, k = j - b * l.inner;
        i = (b * l.channels + c) * l.inner + k;
      }
      const double d = to_float(dy[i]);
      sum_dy += d;
      sum_dyx += d * (static_cast<double>(to_float(x[i])) - m) * s;
      dx[i] = from_float<T>(static_cast<float>(scale * d));
    }
    sum_dy = block_sum(sum_dy);
    sum_dyx = block_sum(sum_dyx);
    if (threadIdx.x == 0) {
      dgamma[c] = static_cast<float>(sum_dyx);
      dbeta[c] = static_cast<float>(sum_dy);
    }
  }
}

template <class T, bool Nhwc>
Launch eval_grad_launch(const BnBackward& b, const ChannelLayout& l, unsigned blocks) {
  return [b, l, blocks](cudaStream_t stream) {
    bn_eval_grad_kernel<T, Nhwc><<<blocks, kThreads, 0, stream>>>(
        static_cast<const T*>(b.dy), static_cast<const T*>(b.x), b.gamma, b.mean, b.invstd, static_cast<T*>(b.dx),
        b.dgamma, b.dbeta, l);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// inputs: dy, x, gamma, mean, invstd (the forward's outputs), and with activation relu
// beta and y; outputs: dx, dgamma, dbeta, and with a residual dz. With relu, where cuDNN's
// fused call does not take the step, dy is masked by y > 0 (the elementwise relu_grad
// kernel) into dz or a scratch buffer, which the plain batch norm's gradient reads.
Launch prepare_batch_norm_grad(const StepArgs& a) {
  const bool relu = relu_of(a);
  const bool residual = a.out.size() == 4;
  if (residual && !relu) fail("batch_norm_grad '", a.step.name, "': dz is written with activation relu only");
  if (relu != (a.in.size() == 7))
    fail("batch_norm_grad '", a.step.name, "': beta and y are given with activation relu, and only then (got ",
         a.in.size(), " inputs)");
  if (relu) expect_dtypes(a, a.in[1], {0, 6}, {2, 3, 4, 5});
  else expect_dtypes(a, a.in[1], {0}, {2, 3, 4});
  const bool nhwc = step_nhwc(a);
  const ChannelLayout l = channel_layout(a, a.in[1].shape(), nhwc);
  if (a.in[0].shape() != a.in[1].shape() || (relu && a.in[6].shape() != a.in[1].shape()))
    fail("batch_norm_grad '", a.step.name, "': dy ", shape_str(a.in[0].shape()), (relu ? ", y " : ""),
         relu ? shape_str(a.in[6].shape()) : "", " and x ", shape_str(a.in[1].shape()), " differ");
  for (size_t i = 2; i < (relu ? 6u : 5u); ++i) expect_channels(a, a.in[i], l.channels, "an input");
  const BnOutputs out = outputs(a, a.in[1], l.channels);
  const bool training = a.step.attrs.i("training") != 0;
  // With the saved mean and inverse std given, cuDNN does not recompute the statistics;
  // eps must still be valid (>= CUDNN_BN_MIN_EPSILON).
  const double eps = a.step.attrs.has("eps") ? a.step.attrs.f("eps") : 1e-5;
  const double eps_ok = eps >= CUDNN_BN_MIN_EPSILON ? eps : 1e-5;
  BnBackward b{a.in[0].data,      a.in[1].data, a.in[2].as<float>(), a.in[3].as<float>(), a.in[4].as<float>(),
               out.data,          out.c0,       out.c1,              eps_ok};
  if (relu) {
    b.beta = a.in[5].as<float>();
    b.y = a.in[6].data;
  }
  if (residual) {
    expect_dtype(a, a.out[3], {a.in[1].dtype()});
    if (a.out[3].shape() != a.in[1].shape())
      fail("batch_norm_grad '", a.step.name, "': dz ", shape_str(a.out[3].shape()), " and x ",
           shape_str(a.in[1].shape()), " differ");
    b.dz = a.out[3].data;
  }
  if (training && l.count() < 2)
    fail("batch_norm_grad '", a.step.name, "' in training needs more than 1 value per channel, got input ",
         shape_str(a.in[1].shape()));
  BnPath path;
  std::shared_ptr<BnSetup> s;
  cudnnHandle_t h = cudnn_of(a.ctx);
  if (training) {
    s = bn_setup(a, l, a.in[1].dtype(), nhwc);
    if (nhwc) {
      auto found = a.ctx.carried.find({a.step.in[3].region, a.step.in[3].offset});
      path = choose_nhwc(a, *s, a.in[1].shape(), false,
                         residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                         : relu   ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION
                                  : CUDNN_BATCHNORM_OPS_BN,
                         found == a.ctx.carried.end() ? nullptr : &found->second,
                         [&](const BnPath& p, void* work) { return backward_training(h, *s, p, b, work); });
    }
  }
  std::vector<Launch> parts;
  if (relu && !path.fused()) {
    DeviceTensor masked = residual ? a.out[3] : a.in[0];
    if (!residual) masked.data = a.ctx.scratch(a.in[0].type.bytes());
    parts.push_back(prepare_as_step(a, Op::relu_grad, Attrs{}, {a.in[0], a.in[6]}, {masked}));  // y > 0 ? dy : 0
    b.dy = masked.data;
  }
  if (training) {
    Context* ctx = &a.ctx;
    parts.push_back([s, h, path, b, ctx](cudaStream_t stream) {
      SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
      SEAM_CUDNN_CHECK(backward_training(h, *s, path, b, path.workspace ? ctx->workspace() : nullptr));
    });
  } else {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(l.channels, 65535));
    dispatch_storage(a.in[1].dtype(), "batch_norm_grad", [&]<class T>() {
      parts.push_back(nhwc ? eval_grad_launch<T, true>(b, l, blocks) : eval_grad_launch<T, false>(b, l, blocks));
    });
  }
  return parts.size() == 1 ? parts[0] : in_order(std::move(parts));
}

}  // namespace

void register_batch_norm(PreparerTable& t) {
  set(t, Op::batch_norm, prepare_batch_norm);
  set(t, Op::batch_norm_grad, prepare_batch_norm_grad);
}

}  // namespace seam::cuda
