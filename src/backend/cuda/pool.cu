// Pooling on the GPU (f32, bf16 or f16, one dtype for every operand of a step), NCHW or,
// with layout nhwc (src/ops/layout.h), channels-last with every 4-d shape written in
// memory order ([N, H, W, C]): max and average pooling forward on cuDNN; both gradients
// and the global average as small kernels here (cuDNN's max-pooling backward took 93 us
// on ResNet-18's [256, 64, 16, 16] for about 19 MB of traffic), templated on the storage type (and the layout) and computing in float
// (the global sums in double). cuDNN's descriptors and every geometry check take the
// logical NCHW dims. Semantics as the CPU reference (src/backend/cpu/pool.cpp): floor
// mode, so windows never pass the padding; count_include_pad chooses the divisor.
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

// The geometry of one pooling op; x [N, C, H, W] -> y [N, C, OH, OW] (logical dims).
struct PoolGeom {
  int64_t planes, channels, h, w, oh, ow;  // planes = N * C
  int64_t kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
};

// xs, ys: the shapes of x and y in the step's layout.
PoolGeom pool_geom(const StepArgs& a, const Shape& xs, const Shape& ys, bool nhwc) {
  const Shape x = logical_nchw(a, xs, nhwc, "x");
  const Shape y = logical_nchw(a, ys, nhwc, "y");
  const Attrs& at = a.step.attrs;
  const auto& k = at.ints("kernel");
  auto st = at.has("stride") ? at.ints("stride") : std::vector<int64_t>{};
  if (st.empty()) st = k;
  const std::vector<int64_t> pd = at.has("padding") ? at.ints("padding") : std::vector<int64_t>{0, 0};
  if (k.size() != 2 || st.size() != 2 || pd.size() != 2)
    fail(op_name(a.step.op), " '", a.step.name, "': needs 2 entries of kernel, stride, padding");
  if (x[0] != y[0] || x[1] != y[1])
    fail(op_name(a.step.op), " '", a.step.name, "': x ", shape_str(xs), " and y ", shape_str(ys), " differ in N or C",
         nhwc ? " (layout nhwc)" : "");
  PoolGeom g{x[0] * x[1], x[1], x[2], x[3], y[2], y[3], k[0], k[1], st[0], st[1], pd[0], pd[1], true};
  if (at.has("count_include_pad")) g.count_include_pad = at.i("count_include_pad") != 0;
  return g;
}

struct PoolSetup {
  TensorDesc x, y;
  PoolDesc pool;
};

// cuDNN descriptors for x -> y (shapes in the step's layout); checks that cuDNN's output
// shape is the graph's.
std::shared_ptr<PoolSetup> pool_setup(const StepArgs& a, const Shape& xs, const Shape& ys, const PoolGeom& g,
                                      cudnnPoolingMode_t mode, bool nhwc) {
  auto s = std::make_shared<PoolSetup>();
  const DType t = a.in[0].dtype();
  const int64_t n = xs[0], c = g.channels;
  set_4d(a, s->x, t, n, c, g.h, g.w, nhwc);
  set_4d(a, s->y, t, n, c, g.oh, g.ow, nhwc);
  // NaN propagates through max pooling, as on the CPU (and in PyTorch).
  SEAM_CUDNN_CHECK(cudnnSetPooling2dDescriptor(s->pool, mode, CUDNN_PROPAGATE_NAN, cudnn_dim(a, g.kh, "kernel h"),
                                               cudnn_dim(a, g.kw, "kernel w"), static_cast<int>(g.ph),
                                               static_cast<int>(g.pw), cudnn_dim(a, g.sh, "stride h"),
                                               cudnn_dim(a, g.sw, "stride w")));
  int on = 0, oc = 0, oh = 0, ow = 0;
  SEAM_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(s->pool, s->x, &on, &oc, &oh, &ow));
  if (on != n || oc != c || oh != g.oh || ow != g.ow)
    fail(op_name(a.step.op), " '", a.step.name, "': cuDNN computes the output as [", on, ", ", oc, ", ", oh, ", ", ow,
         "] (NCHW), the graph has ", shape_str(ys), nhwc ? " (NHWC)" : "");
  return s;
}

Launch prepare_pool_forward(const StepArgs& a, cudnnPoolingMode_t mode) {
  expect_one_stored_dtype(a);
  const bool nhwc = step_nhwc(a);
  const PoolGeom g = pool_geom(a, a.in[0].shape(), a.out[0].shape(), nhwc);
  auto s = pool_setup(a, a.in[0].shape(), a.out[0].shape(), g, mode, nhwc);
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

// Where element i of x sits, and the bases of its (n, c) plane in x, dy and y: NCHW
// planes are contiguous, NHWC ones interleave their channels `channels` apart.
struct PlaneAt {
  int64_t ix, iy, step, x_base, y_base;
};

template <bool Nhwc>
__device__ __forceinline__ PlaneAt plane_at(int64_t i, const PoolGeom& g) {
  if constexpr (Nhwc) {
    const int64_t c = i % g.channels, p = i / g.channels, n = p / (g.w * g.h);
    return {p % g.w, (p / g.w) % g.h, g.channels, n * g.h * g.w * g.channels + c, n * g.oh * g.ow * g.channels + c};
  } else {
    const int64_t plane = i / (g.w * g.h);
    return {i % g.w, (i / g.w) % g.h, 1, plane * g.h * g.w, plane * g.oh * g.ow};
  }
}

// The windows o0..o1 that cover index i along one axis: window o covers
// [o * s - pad, o * s - pad + k), so i is inside for (i + pad - k) / s < o <= (i + pad) / s.
__device__ __forceinline__ void covering(int64_t i, int64_t pad, int64_t k, int64_t s, int64_t out, int64_t& o0,
                                         int64_t& o1) {
  const int64_t r = i + pad;  // >= 0
  o0 = r >= k ? (r - k) / s + 1 : 0;
  o1 = min(r / s, out - 1);
}

// v is the window maximum m as the CPU's keep_max picks it: equal, or NaN where m is.
__device__ __forceinline__ bool is_max(float v, float m) { return v == m || (v != v && m != m); }

// dx of max pooling, one thread per x element: the sum of dy over the windows whose first
// maximum (row-major, a NaN winning, as the CPU's keep_max) it is, added in window order
// as the CPU adds them. y, the forward's output, holds each window's maximum, so an
// element that is not it is passed over after one load; one that is scans the window's
// earlier elements for an earlier maximum. Deterministic: no atomics, no zeroing pass.
template <class T, bool Nhwc>
__global__ void max_pool_grad_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                                     T* __restrict__ dx, PoolGeom g) {
  const int64_t total = g.planes * g.h * g.w;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const PlaneAt at = plane_at<Nhwc>(i, g);
    const T* xp = x + at.x_base;
    const float v = to_float(xp[(at.iy * g.w + at.ix) * at.step]);
    int64_t oy0, oy1, ox0, ox1;
    covering(at.iy, g.ph, g.kh, g.sh, g.oh, oy0, oy1);
    covering(at.ix, g.pw, g.kw, g.sw, g.ow, ox0, ox1);
    float s = 0.f;
    for (int64_t oy = oy0; oy <= oy1; ++oy)
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        const int64_t o = (oy * g.ow + ox) * at.step;
        const float m = to_float(y[at.y_base + o]);
        if (!is_max(v, m)) continue;
        // The window's part of the plane (padding never wins), in row-major order up to i.
        const int64_t y0 = max(oy * g.sh - g.ph, int64_t{0});
        const int64_t x0 = max(ox * g.sw - g.pw, int64_t{0});
        const int64_t x1 = min(ox * g.sw - g.pw + g.kw, g.w);
        bool first = true;
        for (int64_t jy = y0; jy <= at.iy && first; ++jy)
          for (int64_t jx = x0; jx < (jy == at.iy ? at.ix : x1); ++jx)
            if (is_max(to_float(xp[(jy * g.w + jx) * at.step]), m)) {
              first = false;
              break;
            }
        if (first) s += to_float(dy[at.y_base + o]);
      }
    dx[i] = from_float<T>(s);
  }
}

// inputs: dy, x, y (the forward output: each window's maximum).
Launch prepare_max_pool2d_grad(const StepArgs& a) {
  expect_one_stored_dtype(a);
  const Shape& xs = a.in[1].shape();
  const Shape& ys = a.in[0].shape();
  if (a.in[2].shape() != ys || a.out[0].shape() != xs)
    fail("max_pool2d_grad '", a.step.name, "': dy ", shape_str(ys), ", x ", shape_str(xs), ", y ",
         shape_str(a.in[2].shape()), " and dx ", shape_str(a.out[0].shape()), " do not fit together");
  const bool nhwc = step_nhwc(a);
  const PoolGeom g = pool_geom(a, xs, ys, nhwc);
  const int64_t total = g.planes * g.h * g.w;
  const unsigned blocks = blocks_for(total, kThreads, std::max(a.ctx.sm_count, 1) * 16);
  Launch launch;
  dispatch_storage(a.in[0].dtype(), "max_pool2d_grad", [&]<class T>() {
    launch = [g, blocks, nhwc, dy = a.in[0].as<const T>(), x = a.in[1].as<const T>(), y = a.in[2].as<const T>(),
              dx = a.out[0].as<T>()](cudaStream_t stream) {
      if (nhwc)
        max_pool_grad_kernel<T, true><<<blocks, kThreads, 0, stream>>>(dy, x, y, dx, g);
      else
        max_pool_grad_kernel<T, false><<<blocks, kThreads, 0, stream>>>(dy, x, y, dx, g);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

// dx of average pooling, one thread per x element: the sum, over the windows that cover
// it, of dy divided by that window's divisor (as the CPU, which scatters the same shares).
// Element i is (plane, iy, ix) in NCHW; with Nhwc it is (n, iy, ix, c), and the windows of
// its channel sit `channels` apart in dy.
template <class T, bool Nhwc>
__global__ void avg_pool_grad_kernel(const T* __restrict__ dy, T* __restrict__ dx, PoolGeom g) {
  const int64_t total = g.planes * g.h * g.w;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const PlaneAt at = plane_at<Nhwc>(i, g);
    const T* d = dy + at.y_base;  // dy at the plane's window (0, 0)
    int64_t oy0, oy1, ox0, ox1;
    covering(at.iy, g.ph, g.kh, g.sh, g.oh, oy0, oy1);
    covering(at.ix, g.pw, g.kw, g.sw, g.ow, ox0, ox1);
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
        s += to_float(d[(oy * g.ow + ox) * at.step]) / static_cast<float>(div);
      }
    }
    dx[i] = from_float<T>(s);
  }
}

// inputs: dy; attribute shape = x's shape (in the step's layout).
Launch prepare_avg_pool2d_grad(const StepArgs& a) {
  expect_one_stored_dtype(a);
  const bool nhwc = step_nhwc(a);
  const PoolGeom g = pool_geom(a, a.out[0].shape(), a.in[0].shape(), nhwc);
  const int64_t total = g.planes * g.h * g.w;
  const unsigned blocks = blocks_for(total, kThreads, std::max(a.ctx.sm_count, 1) * 16);
  Launch launch;
  dispatch_storage(a.in[0].dtype(), "avg_pool2d_grad", [&]<class T>() {
    launch = [g, blocks, nhwc, dy = a.in[0].as<const T>(), dx = a.out[0].as<T>()](cudaStream_t stream) {
      if (nhwc)
        avg_pool_grad_kernel<T, true><<<blocks, kThreads, 0, stream>>>(dy, dx, g);
      else
        avg_pool_grad_kernel<T, false><<<blocks, kThreads, 0, stream>>>(dy, dx, g);
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

// NHWC: x [N, HW, C] -> y [N, C]. A block of 32 x kRows threads takes 32 neighbouring
// channels of one image: threadIdx.x picks the channel, so that a warp's loads are 32
// consecutive values, and the kRows rows of threads stride over the positions. Each
// thread sums in double; the rows' sums meet in shared memory and are added in a fixed
// order, so every run gives the same result.
constexpr int kRows = kThreads / 32;

template <class T>
__global__ void global_avg_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t batch, int64_t hw,
                                       int64_t channels) {
  __shared__ double part[kRows][32];
  const int64_t chunks = (channels + 31) / 32;
  for (int64_t job = blockIdx.x; job < batch * chunks; job += gridDim.x) {  // the same trip count in every thread
    const int64_t n = job / chunks, c = (job - n * chunks) * 32 + threadIdx.x;
    double s = 0;
    if (c < channels)
      for (int64_t i = threadIdx.y; i < hw; i += kRows) s += to_float(x[(n * hw + i) * channels + c]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
      double t = 0;
      for (int r = 0; r < kRows; ++r) t += part[r][threadIdx.x];
      y[n * channels + c] = from_float<T>(static_cast<float>(t / static_cast<double>(hw)));
    }
    __syncthreads();  // part is written again by the next job
  }
}

template <class T>
Launch global_avg_pool_as(const StepArgs& a, bool nhwc) {
  const Shape& s = a.in[0].shape();
  const T* x = a.in[0].as<const T>();
  T* y = a.out[0].as<T>();
  const int cap = std::max(a.ctx.sm_count, 1) * 16;
  if (nhwc) {
    const int64_t batch = s[0], hw = s[1] * s[2], channels = s[3];
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(batch * ((channels + 31) / 32), cap));
    return [x, y, batch, hw, channels, blocks](cudaStream_t stream) {
      global_avg_nhwc_kernel<T><<<blocks, dim3(32, kRows), 0, stream>>>(x, y, batch, hw, channels);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  }
  const int64_t planes = s[0] * s[1], hw = s[2] * s[3];
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
  const bool nhwc = step_nhwc(a);
  const Shape& s = a.in[0].shape();
  if (s.size() != 4)
    fail("global_avg_pool '", a.step.name, "': x must be ", nhwc ? "[N, H, W, C] (layout nhwc)" : "[N, C, H, W]",
         ", got ", shape_str(s));
  const Shape want{s[0], nhwc ? s[3] : s[1]};
  if (a.out[0].shape() != want)
    fail("global_avg_pool '", a.step.name, "': y ", shape_str(a.out[0].shape()), " does not fit x ", shape_str(s),
         " (want ", shape_str(want), ")");
  Launch launch;
  dispatch_storage(a.in[0].dtype(), "global_avg_pool", [&]<class T>() { launch = global_avg_pool_as<T>(a, nhwc); });
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
