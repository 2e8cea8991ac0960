// Pooling on the GPU (NCHW; f32, bf16 or f16, one dtype for every operand of a step): max
// and average pooling forward on cuDNN, the max gradient on cuDNN (it reads x and y), the
// average gradient and the global average as small kernels here, templated on the storage
// type and computing in float (the global sums in double). Semantics as the CPU reference
// (src/backend/cpu/pool.cpp): floor mode, so windows never pass the padding;
// count_include_pad chooses the divisor.
#include <algorithm>
#include <memory>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/cudnn_util.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/storage.cuh"

namespace seam::cuda {

namespace {

constexpr int kThreads = 256;

// The geometry of one pooling op; x [N, C, H, W] -> y [N, C, OH, OW].
struct PoolGeom {
  int64_t planes, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
};

PoolGeom pool_geom(const StepArgs& a, const Shape& x, const Shape& y) {
  const Attrs& at = a.step.attrs;
  const auto& k = at.ints("kernel");
  auto st = at.has("stride") ? at.ints("stride") : std::vector<int64_t>{};
  if (st.empty()) st = k;
  const std::vector<int64_t> pd = at.has("padding") ? at.ints("padding") : std::vector<int64_t>{0, 0};
  if (x.size() != 4 || y.size() != 4 || k.size() != 2 || st.size() != 2 || pd.size() != 2)
    fail(op_name(a.step.op), " '", a.step.name, "': needs 4-d x and y and 2 entries of kernel, stride, padding");
  if (x[0] != y[0] || x[1] != y[1])
    fail(op_name(a.step.op), " '", a.step.name, "': x ", shape_str(x), " and y ", shape_str(y), " differ in N or C");
  PoolGeom g{x[0] * x[1], x[2], x[3], y[2], y[3], k[0], k[1], st[0], st[1], pd[0], pd[1], true};
  if (at.has("count_include_pad")) g.count_include_pad = at.i("count_include_pad") != 0;
  return g;
}

struct PoolSetup {
  TensorDesc x, y;
  PoolDesc pool;
};

// cuDNN descriptors for x [N, C, H, W] -> y; checks that cuDNN's output shape is the
// graph's.
std::shared_ptr<PoolSetup> pool_setup(const StepArgs& a, const Shape& xs, const Shape& ys, const PoolGeom& g,
                                      cudnnPoolingMode_t mode) {
  auto s = std::make_shared<PoolSetup>();
  const DType t = a.in[0].dtype();
  set_nchw(a, s->x, t, xs);
  set_nchw(a, s->y, t, ys);
  // NaN propagates through max pooling, as on the CPU (and in PyTorch).
  SEAM_CUDNN_CHECK(cudnnSetPooling2dDescriptor(s->pool, mode, CUDNN_PROPAGATE_NAN, cudnn_dim(a, g.kh, "kernel h"),
                                               cudnn_dim(a, g.kw, "kernel w"), static_cast<int>(g.ph),
                                               static_cast<int>(g.pw), cudnn_dim(a, g.sh, "stride h"),
                                               cudnn_dim(a, g.sw, "stride w")));
  int n = 0, c = 0, h = 0, w = 0;
  SEAM_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(s->pool, s->x, &n, &c, &h, &w));
  if (n != ys[0] || c != ys[1] || h != ys[2] || w != ys[3])
    fail(op_name(a.step.op), " '", a.step.name, "': cuDNN computes the output as [", n, ", ", c, ", ", h, ", ", w,
         "], the graph has ", shape_str(ys));
  return s;
}

Launch prepare_pool_forward(const StepArgs& a, cudnnPoolingMode_t mode) {
  expect_one_stored_dtype(a);
  const PoolGeom g = pool_geom(a, a.in[0].shape(), a.out[0].shape());
  auto s = pool_setup(a, a.in[0].shape(), a.out[0].shape(), g, mode);
  cudnnHandle_t h = cudnn_of(a.ctx);
  const void* x = a.in[0].data;
  void* y = a.out[0].data;
  return [s, h, x, y](cudaStream_t stream) {
    SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
    SEAM_CUDNN_CHECK(cudnnPoolingForward(h, s->pool, &kOne, s->x, x, &kZero, s->y, y));
  };
}

Launch prepare_max_pool2d(const StepArgs& a) { return prepare_pool_forward(a, CUDNN_POOLING_MAX_DETERMINISTIC); }

Launch prepare_avg_pool2d(const StepArgs& a) {
  const bool include = !a.step.attrs.has("count_include_pad") || a.step.attrs.i("count_include_pad") != 0;
  return prepare_pool_forward(a, include ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                         : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING);
}

// inputs: dy, x, y (the forward output, which cuDNN reads to find each window's maximum).
Launch prepare_max_pool2d_grad(const StepArgs& a) {
  expect_one_stored_dtype(a);
  const Shape& xs = a.in[1].shape();
  const Shape& ys = a.in[0].shape();
  if (a.in[2].shape() != ys || a.out[0].shape() != xs)
    fail("max_pool2d_grad '", a.step.name, "': dy ", shape_str(ys), ", x ", shape_str(xs), ", y ",
         shape_str(a.in[2].shape()), " and dx ", shape_str(a.out[0].shape()), " do not fit together");
  const PoolGeom g = pool_geom(a, xs, ys);
  auto s = pool_setup(a, xs, ys, g, CUDNN_POOLING_MAX_DETERMINISTIC);
  cudnnHandle_t h = cudnn_of(a.ctx);
  const void* dy = a.in[0].data;
  const void* x = a.in[1].data;
  const void* y = a.in[2].data;
  void* dx = a.out[0].data;
  return [s, h, dy, x, y, dx](cudaStream_t stream) {
    SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
    SEAM_CUDNN_CHECK(cudnnPoolingBackward(h, s->pool, &kOne, s->y, y, s->y, dy, s->x, x, &kZero, s->x, dx));
  };
}

// dx of average pooling, one thread per x element: the sum, over the windows that cover
// it, of dy divided by that window's divisor (as the CPU, which scatters the same shares).
template <class T>
__global__ void avg_pool_grad_kernel(const T* __restrict__ dy, T* __restrict__ dx, PoolGeom g) {
  const int64_t total = g.planes * g.h * g.w;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ix = i % g.w;
    const int64_t iy = (i / g.w) % g.h;
    const int64_t pl = i / (g.w * g.h);
    // Window oy covers rows [oy * sh - ph, oy * sh - ph + kh): iy is inside for
    // (iy + ph - kh) / sh < oy <= (iy + ph) / sh.
    const int64_t ry = iy + g.ph, rx = ix + g.pw;  // >= 0
    const int64_t oy0 = ry >= g.kh ? (ry - g.kh) / g.sh + 1 : 0;
    const int64_t ox0 = rx >= g.kw ? (rx - g.kw) / g.sw + 1 : 0;
    const int64_t oy1 = min(ry / g.sh, g.oh - 1);
    const int64_t ox1 = min(rx / g.sw, g.ow - 1);
    const T* d = dy + pl * g.oh * g.ow;
    float s = 0.f;
    for (int64_t oy = oy0; oy <= oy1; ++oy) {
      const int64_t ys = oy * g.sh - g.ph;
      const int64_t rows = min(ys + g.kh, g.h) - max(ys, int64_t{0});
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        int64_t div = g.kh * g.kw;
        if (!g.count_include_pad) {
          const int64_t xs = ox * g.sw - g.pw;
          div = rows * (min(xs + g.kw, g.w) - max(xs, int64_t{0}));
        }
        s += to_float(d[oy * g.ow + ox]) / static_cast<float>(div);
      }
    }
    dx[i] = from_float<T>(s);
  }
}

// inputs: dy; attribute shape = x's shape.
Launch prepare_avg_pool2d_grad(const StepArgs& a) {
  expect_one_stored_dtype(a);
  const PoolGeom g = pool_geom(a, a.out[0].shape(), a.in[0].shape());
  const int64_t total = g.planes * g.h * g.w;
  const unsigned blocks = blocks_for(total, kThreads, std::max(a.ctx.sm_count, 1) * 16);
  Launch launch;
  dispatch_storage(a.in[0].dtype(), "avg_pool2d_grad", [&]<class T>() {
    launch = [g, blocks, dy = a.in[0].as<const T>(), dx = a.out[0].as<T>()](cudaStream_t stream) {
      avg_pool_grad_kernel<T><<<blocks, kThreads, 0, stream>>>(dy, dx, g);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

// The mean of each (n, c) plane: one warp per plane for small planes ...
template <class T>
__global__ void global_avg_warp_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t planes, int64_t hw) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x >> 5);
  for (int64_t p = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; p < planes; p += warps) {
    const T* xp = x + p * hw;
    double s = 0;
    for (int64_t i = lane; i < hw; i += 32) s += to_float(xp[i]);
    s = warp_sum(s);
    if (lane == 0) y[p] = from_float<T>(static_cast<float>(s / static_cast<double>(hw)));
  }
}

// ... one block per plane for large ones.
template <class T>
__global__ void global_avg_block_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t planes, int64_t hw) {
  for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
    const T* xp = x + p * hw;
    double s = 0;
    for (int64_t i = threadIdx.x; i < hw; i += blockDim.x) s += to_float(xp[i]);
    s = block_sum(s);
    if (threadIdx.x == 0) y[p] = from_float<T>(static_cast<float>(s / static_cast<double>(hw)));
  }
}

template <class T>
Launch global_avg_pool_as(const StepArgs& a) {
  const Shape& s = a.in[0].shape();
  const int64_t planes = s[0] * s[1], hw = s[2] * s[3];
  const T* x = a.in[0].as<const T>();
  T* y = a.out[0].as<T>();
  const int cap = std::max(a.ctx.sm_count, 1) * 16;
  if (hw >= 1024) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(planes, cap));
    return [x, y, planes, hw, blocks](cudaStream_t stream) {
      global_avg_block_kernel<T><<<blocks, kThreads, 0, stream>>>(x, y, planes, hw);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  }
  const unsigned blocks = blocks_for(planes * 32, kThreads, cap);
  return [x, y, planes, hw, blocks](cudaStream_t stream) {
    global_avg_warp_kernel<T><<<blocks, kThreads, 0, stream>>>(x, y, planes, hw);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

Launch prepare_global_avg_pool(const StepArgs& a) {
  expect_one_stored_dtype(a);
  const Shape& s = a.in[0].shape();
  if (s.size() != 4) fail("global_avg_pool '", a.step.name, "': x must be [N, C, H, W], got ", shape_str(s));
  Launch launch;
  dispatch_storage(a.in[0].dtype(), "global_avg_pool", [&]<class T>() { launch = global_avg_pool_as<T>(a); });
  return launch;
}

}  // namespace

void register_pool(PreparerTable& t) {
  set(t, Op::max_pool2d, prepare_max_pool2d);
  set(t, Op::max_pool2d_grad, prepare_max_pool2d_grad);
  set(t, Op::avg_pool2d, prepare_avg_pool2d);
  set(t, Op::avg_pool2d_grad, prepare_avg_pool2d_grad);
  set(t, Op::global_avg_pool, prepare_global_avg_pool);
}

}  // namespace seam::cuda
