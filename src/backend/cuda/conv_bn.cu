// conv2d_bn on the GPU: a convolution and the evaluation batch norm after it (running
// statistics), plus a residual and relu (src/ops/conv.cpp). Each run first turns the
// statistics into a per-channel scale = gamma / sqrt(var + eps) and shift = beta - mean *
// scale (f32, in double; the statistics change between evaluations, so this is not done
// once), then runs the convolution with y = act(conv * scale + shift + z) in one cuDNN
// graph (conv_engine.h). Where the graph API runs none, the classic convolution writes
// y and the epilogue kernel here applies the same in place. Scale and shift fold the
// normalization's two roundings (the convolution's value, the normalized one) into one,
// so results differ from the CPU's unfused order by f32 rounding.
#include <cmath>

#include "backend/cuda/check.h"
#include "backend/cuda/conv_engine.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/cudnn_util.h"
#include "backend/cuda/storage.cuh"

namespace seam::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void scale_shift_kernel(const float* __restrict__ gamma, const float* __restrict__ beta,
                                   const float* __restrict__ mean, const float* __restrict__ var, double eps,
                                   float* __restrict__ scale, float* __restrict__ shift, int64_t channels) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    const double s = static_cast<double>(gamma[c]) / sqrt(static_cast<double>(var[c]) + eps);
    scale[c] = static_cast<float>(s);
    shift[c] = static_cast<float>(static_cast<double>(beta[c]) - static_cast<double>(mean[c]) * s);
  }
}

// y = act(y * scale[c] + shift[c] + z) in place; element i's channel is i % channels
// (channels-last) or (i / plane) % channels.
template <class T, bool Nhwc>
__global__ void epilogue_kernel(T* __restrict__ y, const T* __restrict__ z, const float* __restrict__ scale,
                                const float* __restrict__ shift, int64_t n, int64_t channels, int64_t plane,
                                bool relu) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = Nhwc ? i % channels : (i / plane) % channels;
    float v = fmaf(to_float(y[i]), scale[c], shift[c]);
    if (z) v += to_float(z[i]);
    y[i] = from_float<T>(relu && !(v > 0.0f) ? 0.0f : v);
  }
}

// inputs: x, w, gamma, beta, running_mean, running_var, z?; output y.
Launch prepare_conv2d_bn(const StepArgs& a) {
  const bool residual = a.in.size() == 7;
  for (size_t i = 2; i < 6; ++i) expect_dtype(a, a.in[i], {DType::f32});
  if (residual) expect_dtype(a, a.in[6], {a.out[0].dtype()});
  const bool nhwc = step_nhwc(a);
  const Shape& ys = a.out[0].shape();
  if (ys.size() != 4) fail("conv2d_bn '", a.step.name, "': y must be 4-d, got ", shape_str(ys));
  const int64_t channels = nhwc ? ys[3] : ys[1], plane = nhwc ? 1 : ys[2] * ys[3], n = a.out[0].numel();
  for (size_t i = 2; i < 6; ++i)
    if (a.in[i].numel() != channels)
      fail("conv2d_bn '", a.step.name, "': input ", i, " has ", a.in[i].numel(), " values for ", channels,
           " channels");
  if (residual && a.in[6].shape() != ys)
    fail("conv2d_bn '", a.step.name, "': z ", shape_str(a.in[6].shape()), " and y ", shape_str(ys), " differ");
  auto* scale = static_cast<float*>(a.ctx.scratch(2 * static_cast<size_t>(channels) * sizeof(float)));
  float* shift = scale + channels;
  const double eps = a.step.attrs.f("eps");
  const bool relu = a.step.attrs.s("activation") == "relu";
  const float *gamma = a.in[2].as<float>(), *beta = a.in[3].as<float>(), *mean = a.in[4].as<float>(),
              *var = a.in[5].as<float>();
  const unsigned small = blocks_for(channels, kThreads);
  Launch prep = [=](cudaStream_t st) {
    scale_shift_kernel<<<small, kThreads, 0, st>>>(gamma, beta, mean, var, eps, scale, shift, channels);
    SEAM_CUDA_LAUNCH_CHECK();
  };
  EngineBuffers buf{a.in[0].data, a.in[1].data, a.out[0].data};
  buf.scale = scale;
  buf.shift = shift;
  if (residual) buf.z = a.in[6].data;
  Launch epilogue;
  const unsigned blocks = blocks_for(n, kThreads, static_cast<int>(grid_cap(a.ctx)));
  dispatch_storage(a.out[0].dtype(), "conv2d_bn", [&]<class T>() {
    auto* y = a.out[0].as<T>();
    const T* z = residual ? a.in[6].as<const T>() : nullptr;
    epilogue = [=](cudaStream_t st) {
      if (nhwc) epilogue_kernel<T, true><<<blocks, kThreads, 0, st>>>(y, z, scale, shift, n, channels, plane, relu);
      else epilogue_kernel<T, false><<<blocks, kThreads, 0, st>>>(y, z, scale, shift, n, channels, plane, relu);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return in_order({std::move(prep), prepare_conv_forward(a, buf, std::move(epilogue))});
}

}  // namespace

void register_conv_bn(PreparerTable& t) { set(t, Op::conv2d_bn, prepare_conv2d_bn); }

}  // namespace seam::cuda
