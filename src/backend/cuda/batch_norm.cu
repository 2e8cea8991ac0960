// batch_norm and its gradient on the GPU, per channel over axis 1 of [N, C, ...]. x, y, dy
// and dx are f32, bf16 or f16 (one dtype); gamma, beta, the running and saved statistics
// and dgamma, dbeta are f32 whatever x is: cuDNN's per-channel descriptor, derived from
// x's, is f32 for 16-bit data, and it computes in f32.
// Semantics as the CPU reference (src/backend/cpu/norm.cpp, as torch.nn.BatchNorm):
//  - training: normalize with the batch mean and biased variance; update the running
//    statistics in place with momentum, the running variance from the UNBIASED batch
//    variance. cudnnBatchNormalizationForwardTraining does exactly that (cuDNN's
//    moving variance uses the n / (n - 1) estimate, which is why PyTorch and MXNet feed
//    it their running buffers unchanged); its saved "inverse variance" is 1/sqrt(var+eps).
//  - evaluation: normalize with the running statistics (cuDNN inference), and report
//    them as mean and invstd = 1/sqrt(running_var + eps) (a small kernel here).
//  - gradient in training: cudnnBatchNormalizationBackward with the saved mean/invstd;
//    in evaluation (statistics are constants): a kernel here, one block per channel,
//    deterministic (no atomics).
// x of any rank >= 2 is viewed as [N, C, inner, 1], which SPATIAL mode normalizes per C.
// Every output has a buffer of its own, read or not (lower() places all outputs of a
// live step).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/cudnn_util.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/storage.cuh"

namespace seam::cuda {

namespace {

constexpr int kThreads = 256;

struct ChannelLayout {
  int64_t batch, channels, inner;
  __host__ __device__ int64_t count() const { return batch * inner; }  // values per channel
};

ChannelLayout channel_layout(const StepArgs& a, const Shape& s) {
  if (s.size() < 2) fail(op_name(a.step.op), " '", a.step.name, "': x needs rank >= 2, got ", shape_str(s));
  ChannelLayout l{s[0], s[1], 1};
  for (size_t d = 2; d < s.size(); ++d) l.inner *= s[d];
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
  TensorDesc x;   // [N, C, inner, 1]
  TensorDesc bn;  // [1, C, 1, 1], derived
};

std::shared_ptr<BnSetup> bn_setup(const StepArgs& a, const ChannelLayout& l, DType t) {
  auto s = std::make_shared<BnSetup>();
  set_nchw(a, s->x, t, l.batch, l.channels, l.inner, 1);
  SEAM_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(s->bn, s->x, CUDNN_BATCHNORM_SPATIAL));
  return s;
}

// Evaluation reports the running statistics: mean = running_mean,
// invstd = 1 / sqrt(running_var + eps) (in double, as the CPU).
__global__ void eval_stats_kernel(const float* __restrict__ rm, const float* __restrict__ rv, double eps,
                                  float* __restrict__ mean, float* __restrict__ invstd, int64_t channels) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    mean[c] = rm[c];
    invstd[c] = static_cast<float>(1.0 / sqrt(static_cast<double>(rv[c]) + eps));
  }
}

// inputs: x, gamma, beta, running_mean, running_var; outputs: y, mean, invstd.
Launch prepare_batch_norm(const StepArgs& a) {
  expect_dtypes(a, a.in[0], {}, {1, 2, 3, 4});
  const ChannelLayout l = channel_layout(a, a.in[0].shape());
  for (size_t i = 1; i < 5; ++i) expect_channels(a, a.in[i], l.channels, "an input");
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
  auto s = bn_setup(a, l, a.in[0].dtype());
  cudnnHandle_t h = cudnn_of(a.ctx);
  const void* x = a.in[0].data;
  const void* gamma = a.in[1].data;
  const void* beta = a.in[2].data;
  float* rm = a.in[3].as<float>();  // persistent state, updated in place when training
  float* rv = a.in[4].as<float>();
  if (training)
    return [s, h, out, x, gamma, beta, rm, rv, momentum, eps](cudaStream_t stream) {
      SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
      SEAM_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
          h, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, s->x, x, s->x, out.data, s->bn, gamma, beta, momentum, rm,
          rv, eps, out.c0, out.c1));
    };
  const int64_t channels = l.channels;
  const unsigned blocks = blocks_for(channels, kThreads);
  return [s, h, out, x, gamma, beta, rm, rv, eps, channels, blocks](cudaStream_t stream) {
    SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
    SEAM_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, s->x, x, s->x,
                                                             out.data, s->bn, gamma, beta, rm, rv, eps));
    eval_stats_kernel<<<blocks, kThreads, 0, stream>>>(rm, rv, eps, out.c0, out.c1, channels);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// The evaluation gradient, one block per channel (grid-stride over channels):
// dbeta = sum(dy), dgamma = sum(dy * (x - mean) * invstd), dx = dy * gamma * invstd.
// Sums in double, each thread's share then a fixed-order block reduction: the same
// result on every run. dy, x and dx in storage type T, the rest f32.
template <class T>
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
      const int64_t b = j / l.inner, k = j - b * l.inner;
      const int64_t i = (b * l.channels + c) * l.inner + k;
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

// inputs: dy, x, gamma, mean, invstd (the forward's outputs); outputs: dx, dgamma, dbeta.
Launch prepare_batch_norm_grad(const StepArgs& a) {
  expect_dtypes(a, a.in[1], {0}, {2, 3, 4});
  const ChannelLayout l = channel_layout(a, a.in[1].shape());
  if (a.in[0].shape() != a.in[1].shape())
    fail("batch_norm_grad '", a.step.name, "': dy ", shape_str(a.in[0].shape()), " and x ",
         shape_str(a.in[1].shape()), " differ");
  for (size_t i = 2; i < 5; ++i) expect_channels(a, a.in[i], l.channels, "an input");
  const BnOutputs out = outputs(a, a.in[1], l.channels);
  const bool training = a.step.attrs.i("training") != 0;
  const void* dy = a.in[0].data;
  const void* x = a.in[1].data;
  const float* gamma = a.in[2].as<float>();
  const float* mean = a.in[3].as<float>();
  const float* invstd = a.in[4].as<float>();
  if (training) {
    if (l.count() < 2)
      fail("batch_norm_grad '", a.step.name, "' in training needs more than 1 value per channel, got input ",
           shape_str(a.in[1].shape()));
    auto s = bn_setup(a, l, a.in[1].dtype());
    cudnnHandle_t h = cudnn_of(a.ctx);
    // With the saved mean and inverse std given, cuDNN does not recompute the
    // statistics; eps must still be valid (>= CUDNN_BN_MIN_EPSILON).
    const double eps = a.step.attrs.has("eps") ? a.step.attrs.f("eps") : 1e-5;
    const double eps_ok = eps >= CUDNN_BN_MIN_EPSILON ? eps : 1e-5;
    return [s, h, out, dy, x, gamma, mean, invstd, eps_ok](cudaStream_t stream) {
      SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
      SEAM_CUDNN_CHECK(cudnnBatchNormalizationBackward(h, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kZero, s->x,
                                                       x, s->x, dy, s->x, out.data, s->bn, gamma,
                                                       out.c0, out.c1, eps_ok, mean, invstd));
    };
  }
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(l.channels, 65535));
  Launch launch;
  dispatch_storage(a.in[1].dtype(), "batch_norm_grad", [&]<class T>() {
    launch = [out, dy = static_cast<const T*>(dy), x = static_cast<const T*>(x), gamma, mean, invstd, l,
              blocks](cudaStream_t stream) {
      bn_eval_grad_kernel<T><<<blocks, kThreads, 0, stream>>>(dy, x, gamma, mean, invstd, static_cast<T*>(out.data),
                                                              out.c0, out.c1, l);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

}  // namespace

void register_batch_norm(PreparerTable& t) {
  set(t, Op::batch_norm, prepare_batch_norm);
  set(t, Op::batch_norm_grad, prepare_batch_norm_grad);
}

}  // namespace seam::cuda
