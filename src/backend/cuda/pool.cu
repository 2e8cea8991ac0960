// Pooling on the GPU (f32, bf16, f16 or f64, one dtype for every operand of a step), NCHW or,
// with layout nhwc (src/ops/layout.h), channels-last with every 4-d shape written in
// memory order ([N, H, W, C]): max and average pooling forward on cuDNN; both gradients
// and the global average as small kernels here (cuDNN's max-pooling backward took 93 us
// on ResNet-18's f32 [256, 64, 16, 16] for 40 MB of traffic), templated on the storage
// type (and the layout) and computing in compute_t (float, double for f64; the global
// sums in double). cuDNN's descriptors and every geometry check take the
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
  expect_one_stored_dtype(a, kValues);
  const bool nhwc = step_nhwc(a);
  const PoolGeom g = pool_geom(a, a.in[0].shape(), a.out[0].shape(), nhwc);
  auto s = pool_setup(a, a.in[0].shape(), a.out[0].shape(), g, mode, nhwc);
  cudnnHandle_t h = cudnn_of(a.ctx);
  const void* x = a.in[0].data;
  void* y = a.out[0].data;
  const bool f64 = a.in[0].dtype() == DType::f64;
  const void* one = f64 ? static_cast<const void*>(&kOneF64) : &kOne;
  const void* zero = f64 ? static_cast<const void*>(&kZeroF64) : &kZero;
  return [s, h, x, y, one, zero](cudaStream_t stream) {
    SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
    SEAM_CUDNN_CHECK(cudnnPoolingForward(h, s->pool, one, s->x, x, zero, s->y, y));
  };
}

Launch prepare_max_pool2d(const StepArgs& a) { return prepare_pool_forward(a, CUDNN_POOLING_MAX_DETERMINISTIC); }

Launch prepare_avg_pool2d(const StepArgs& a) {
  const bool include = !a.step.attrs.has("count_include_pad") || a.step.attrs.i("count_include_pad") != 0;
  return prepare_pool_forward(a, include ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                         : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING);
}

// Division in the kernels' index type: by a FastDivisor at int32, plainly at int64.
template <class I>
struct Div;
template <>
struct Div<int32_t> {
  FastDivisor f;
  Div() = default;
  explicit Div(int64_t d) : f(static_cast<uint32_t>(std::max<int64_t>(d, 1))) {}  // an empty axis divides nothing
  __device__ __forceinline__ int32_t operator()(int32_t n) const { return f.div(n); }
};
template <>
struct Div<int64_t> {
  int64_t d = 1;
  Div() = default;
  explicit Div(int64_t v) : d(std::max<int64_t>(v, 1)) {}
  __device__ __forceinline__ int64_t operator()(int64_t n) const { return n / d; }
};

// The geometry in the kernels' index type I, with its divisors: int32 wherever every
// index fits. The gradients below divide about ten times per element, and a 64-bit
// division costs several times a 32-bit one.
// In NHWC a thread takes V neighbouring channels (a 16-byte load where they fit): the
// index arithmetic, most of these kernels' instructions, is then done once for V
// elements. `groups` = channels / V; NCHW runs V = 1.
template <class I>
struct IndexGeom {
  I planes, channels, groups, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
  Div<I> by_groups, by_w, by_h, by_ow, by_oh, by_sh, by_sw;
};

template <class I>
IndexGeom<I> index_geom(const PoolGeom& g, int64_t vec) {
  auto n = [](int64_t v) { return static_cast<I>(v); };
  return {n(g.planes), n(g.channels), n(g.channels / vec), n(g.h), n(g.w), n(g.oh), n(g.ow), n(g.kh),
          n(g.kw), n(g.sh), n(g.sw), n(g.ph), n(g.pw), g.count_include_pad,
          Div<I>(g.channels / vec), Div<I>(g.w), Div<I>(g.h), Div<I>(g.ow), Div<I>(g.oh), Div<I>(g.sh), Div<I>(g.sw)};
}

// V elements of T loaded or stored as one access.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, class T>
__device__ __forceinline__ Pack<T, V> load(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

// Whether every index of x and y (and the largest window offsets) fits in int32.
bool fits_int32(const PoolGeom& g) {
  const int64_t most = std::max(g.planes * g.h * g.w, g.planes * g.oh * g.ow) + g.kh * g.w * g.channels + g.kw * g.channels;
  return most < int64_t{1} << 31;
}

// Where work item i of x's elements sits (its first element is x[i * V]), and the bases of
// its (n, c) plane in dy and y: NCHW planes are contiguous, NHWC ones interleave their
// channels `channels` apart.
template <class I>
struct PlaneAt {
  I ix, iy, step, y_base;
};

template <bool Nhwc, int V, class I>
__device__ __forceinline__ PlaneAt<I> plane_at(I i, const IndexGeom<I>& g) {
  if constexpr (Nhwc) {
    const I p = g.by_groups(i), c = (i - p * g.groups) * V, q = g.by_w(p), n = g.by_h(q);
    return {p - q * g.w, q - n * g.h, g.channels, n * g.oh * g.ow * g.channels + c};
  } else {
    static_assert(V == 1);
    const I q = g.by_w(i), plane = g.by_h(q);
    return {i - q * g.w, q - plane * g.h, 1, plane * g.oh * g.ow};
  }
}

// The windows o0..o1 that cover index i along one axis: window o covers
// [o * s - pad, o * s - pad + k), so i is inside for (i + pad - k) / s < o <= (i + pad) / s.
template <class I>
__device__ __forceinline__ void covering(I i, I pad, I k, const Div<I>& by_s, I out, I& o0, I& o1) {
  const I r = i + pad;  // >= 0
  o0 = r >= k ? by_s(r - k) + 1 : 0;
  o1 = min(by_s(r), out - 1);
}

// Element i of `total`, grid-stride.
template <class I, class F>
__device__ __forceinline__ void each_element(I total, F&& f) {
  const I stride = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += stride)
    f(i);
}

// Where output work item i sits (its first element is y[i * V]): its plane's base in x,
// and its window's corner.
template <bool Nhwc, int V, class I>
__device__ __forceinline__ void window_at(I i, const IndexGeom<I>& g, I& x_base, I& step, I& y0, I& x0) {
  I n_or_plane, ox, oy, c = 0;
  if constexpr (Nhwc) {
    const I p = g.by_groups(i);
    c = (i - p * g.groups) * V;
    const I q = g.by_ow(p);
    ox = p - q * g.ow;
    n_or_plane = g.by_oh(q);
    oy = q - n_or_plane * g.oh;
    step = g.channels;
    x_base = n_or_plane * g.h * g.w * g.channels + c;
  } else {
    const I q = g.by_ow(i);
    ox = i - q * g.ow;
    n_or_plane = g.by_oh(q);
    oy = q - n_or_plane * g.oh;
    step = 1;
    x_base = n_or_plane * g.h * g.w;
  }
  y0 = oy * g.sh - g.ph;
  x0 = ox * g.sw - g.pw;
}

// The first maximum of each max-pooling window (row-major; a NaN wins, as the CPU's
// keep_max), as its offset in the unclipped kh x kw window, one thread per V outputs. The
// gradient then gathers without reading x again. On ResNet-18's f32 [256, 16, 16, 64]
// (W5) the two passes took about 64 us with a thread an element: the gather issued about
// 150 instructions an element, most of them index arithmetic (ncu: 53% of the issue rate);
// with V = 4 channels a thread, 28 us alone, launch included, against cuDNN's backward 93
// us. Their 45 MB take about 10 us at full bandwidth.
template <class T, bool Nhwc, class I, int V>
__global__ void max_pool_argmax_kernel(const T* __restrict__ x, int32_t* __restrict__ arg, IndexGeom<I> g) {
  each_element(g.planes / V * g.oh * g.ow, [&](I i) {
    I x_base, step, y0, x0;
    window_at<Nhwc, V>(i, g, x_base, step, y0, x0);
    const I ya = max(y0, I{0}), yb = min(y0 + g.kh, g.h), xa = max(x0, I{0}), xb = min(x0 + g.kw, g.w);
    Pack<int32_t, V> best;
    compute_t<T> b[V];
#pragma unroll
    for (int k = 0; k < V; ++k) best.v[k] = -1, b[k] = 0;
    for (I jy = ya; jy < yb; ++jy)
#pragma unroll 3
      for (I jx = xa; jx < xb; ++jx) {
        const Pack<T, V> p = load<V>(x + x_base + (jy * g.w + jx) * step);
        const auto at = static_cast<int32_t>((jy - y0) * g.kw + (jx - x0));
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const compute_t<T> v = to_compute(p.v[k]);
          if (best.v[k] < 0 || (!(v <= b[k]) && b[k] == b[k])) best.v[k] = at, b[k] = v;
        }
      }
    *reinterpret_cast<Pack<int32_t, V>*>(arg + i * V) = best;
  });
}

// dx of max pooling, one thread per V elements of x: the sum of dy over the windows whose
// first maximum it is, added in window order as the CPU adds them. Deterministic: no
// atomics.
template <class T, bool Nhwc, class I, int V>
__global__ void max_pool_grad_kernel(const T* __restrict__ dy, const int32_t* __restrict__ arg, T* __restrict__ dx,
                                     IndexGeom<I> g) {
  each_element(g.planes / V * g.h * g.w, [&](I i) {
    const PlaneAt<I> at = plane_at<Nhwc, V>(i, g);
    I oy0, oy1, ox0, ox1;
    covering(at.iy, g.ph, g.kh, g.by_sh, g.oh, oy0, oy1);
    covering(at.ix, g.pw, g.kw, g.by_sw, g.ow, ox0, ox1);
    compute_t<T> s[V] = {};
    for (I oy = oy0; oy <= oy1; ++oy)
      for (I ox = ox0; ox <= ox1; ++ox) {
        const I o = at.y_base + (oy * g.ow + ox) * at.step;
        const auto here = static_cast<int32_t>((at.iy - (oy * g.sh - g.ph)) * g.kw + (at.ix - (ox * g.sw - g.pw)));
        const Pack<int32_t, V> w = load<V>(arg + o);
        const Pack<T, V> d = load<V>(dy + o);
#pragma unroll
        for (int k = 0; k < V; ++k)
          if (w.v[k] == here) s[k] += to_compute(d.v[k]);
      }
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = from_compute<T>(s[k]);
    *reinterpret_cast<Pack<T, V>*>(dx + i * V) = out;
  });
}

template <class T, template <class, bool, class, int> class K, bool Nhwc, int V, class... Args>
void launch_as(const PoolGeom& g, unsigned blocks, cudaStream_t stream, Args... args) {
  if (fits_int32(g)) K<T, Nhwc, int32_t, V>::run(blocks, stream, index_geom<int32_t>(g, V), args...);
  else K<T, Nhwc, int64_t, V>::run(blocks, stream, index_geom<int64_t>(g, V), args...);
}

// The channels a thread takes: 16 bytes of them in NHWC where the channel count and every
// pointer allow, else 1.
template <class T>
int vec_of(const PoolGeom& g, bool nhwc, std::initializer_list<const void*> ptrs) {
  constexpr int kWide = 16 / sizeof(T);
  if (!nhwc || g.channels % kWide) return 1;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16) return 1;
  return kWide;
}

// Launches kernel<T, Nhwc, I, V> for the step's layout, V from vec_of and the narrowest
// index type.
template <class T, template <class, bool, class, int> class K, class... Args>
void launch_pool_grad(const PoolGeom& g, bool nhwc, int vec, unsigned blocks, cudaStream_t stream, Args... args) {
  constexpr int kWide = 16 / sizeof(T);
  if (!nhwc) launch_as<T, K, false, 1>(g, blocks, stream, args...);
  else if (vec == kWide) launch_as<T, K, true, kWide>(g, blocks, stream, args...);
  else launch_as<T, K, true, 1>(g, blocks, stream, args...);
  SEAM_CUDA_LAUNCH_CHECK();
}

template <class T, bool Nhwc, class I, int V>
struct MaxPoolGrad {
  static void run(unsigned blocks, cudaStream_t stream, IndexGeom<I> g, const T* dy, const T* x, int32_t* arg,
                  T* dx) {
    max_pool_argmax_kernel<T, Nhwc, I, V><<<blocks, kThreads, 0, stream>>>(x, arg, g);
    SEAM_CUDA_LAUNCH_CHECK();
    max_pool_grad_kernel<T, Nhwc, I, V><<<blocks, kThreads, 0, stream>>>(dy, arg, dx, g);
  }
};

// inputs: dy, x, y (the forward output; the gradient finds each window's maximum in x
// itself, so y is not read).
Launch prepare_max_pool2d_grad(const StepArgs& a) {
  expect_one_stored_dtype(a, kValues);
  const Shape& xs = a.in[1].shape();
  const Shape& ys = a.in[0].shape();
  if (a.in[2].shape() != ys || a.out[0].shape() != xs)
    fail("max_pool2d_grad '", a.step.name, "': dy ", shape_str(ys), ", x ", shape_str(xs), ", y ",
         shape_str(a.in[2].shape()), " and dx ", shape_str(a.out[0].shape()), " do not fit together");
  const bool nhwc = step_nhwc(a);
  const PoolGeom g = pool_geom(a, xs, ys, nhwc);
  auto* arg = static_cast<int32_t*>(a.ctx.scratch(static_cast<size_t>(g.planes * g.oh * g.ow) * sizeof(int32_t)));
  Launch launch;
  dispatch_value(a.in[0].dtype(), "max_pool2d_grad", [&]<class T>() {
    const T *dy = a.in[0].as<const T>(), *x = a.in[1].as<const T>();
    T* dx = a.out[0].as<T>();
    const int vec = vec_of<T>(g, nhwc, {dy, x, dx, arg});
    const unsigned blocks = blocks_for(g.planes / vec * g.h * g.w, kThreads, std::max(a.ctx.sm_count, 1) * 16);
    launch = [g, blocks, nhwc, vec, arg, dy, x, dx](cudaStream_t stream) {
      launch_pool_grad<T, MaxPoolGrad>(g, nhwc, vec, blocks, stream, dy, x, arg, dx);
    };
  });
  return launch;
}

// dx of average pooling, one thread per V elements of x: the sum, over the windows that
// cover them, of dy divided by that window's divisor (as the CPU, which scatters the same
// shares). Element i * V is (plane, iy, ix) in NCHW; with Nhwc it is (n, iy, ix, c), and
// the windows of its channel sit `channels` apart in dy.
template <class T, bool Nhwc, class I, int V>
__global__ void avg_pool_grad_kernel(const T* __restrict__ dy, T* __restrict__ dx, IndexGeom<I> g) {
  each_element(g.planes / V * g.h * g.w, [&](I i) {
    const PlaneAt<I> at = plane_at<Nhwc, V>(i, g);
    const T* d = dy + at.y_base;  // dy at the plane's window (0, 0)
    I oy0, oy1, ox0, ox1;
    covering(at.iy, g.ph, g.kh, g.by_sh, g.oh, oy0, oy1);
    covering(at.ix, g.pw, g.kw, g.by_sw, g.ow, ox0, ox1);
    compute_t<T> s[V] = {};
    for (I oy = oy0; oy <= oy1; ++oy) {
      const I ys = oy * g.sh - g.ph;
      const I rows = min(ys + g.kh, g.h) - max(ys, I{0});
      for (I ox = ox0; ox <= ox1; ++ox) {
        I div = g.kh * g.kw;
        if (!g.count_include_pad) {
          const I xs = ox * g.sw - g.pw;
          div = rows * (min(xs + g.kw, g.w) - max(xs, I{0}));
        }
        const Pack<T, V> p = load<V>(d + (oy * g.ow + ox) * at.step);
#pragma unroll
        for (int k = 0; k < V; ++k) s[k] += to_compute(p.v[k]) / static_cast<compute_t<T>>(div);
      }
    }
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = from_compute<T>(s[k]);
    *reinterpret_cast<Pack<T, V>*>(dx + i * V) = out;
  });
}

template <class T, bool Nhwc, class I, int V>
struct AvgPoolGrad {
  static void run(unsigned blocks, cudaStream_t stream, IndexGeom<I> g, const T* dy, T* dx) {
    avg_pool_grad_kernel<T, Nhwc, I, V><<<blocks, kThreads, 0, stream>>>(dy, dx, g);
  }
};

// inputs: dy; attribute shape = x's shape (in the step's layout).
Launch prepare_avg_pool2d_grad(const StepArgs& a) {
  expect_one_stored_dtype(a, kValues);
  const bool nhwc = step_nhwc(a);
  const PoolGeom g = pool_geom(a, a.out[0].shape(), a.in[0].shape(), nhwc);
  Launch launch;
  dispatch_value(a.in[0].dtype(), "avg_pool2d_grad", [&]<class T>() {
    const T* dy = a.in[0].as<const T>();
    T* dx = a.out[0].as<T>();
    const int vec = vec_of<T>(g, nhwc, {dy, dx});
    const unsigned blocks = blocks_for(g.planes / vec * g.h * g.w, kThreads, std::max(a.ctx.sm_count, 1) * 16);
    launch = [g, blocks, nhwc, vec, dy, dx](cudaStream_t stream) {
      launch_pool_grad<T, AvgPoolGrad>(g, nhwc, vec, blocks, stream, dy, dx);
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
    for (int64_t i = lane; i < hw; i += 32) s += to_compute(xp[i]);
    s = warp_sum(s);
    if (lane == 0) y[p] = from_compute<T>(static_cast<compute_t<T>>(s / static_cast<double>(hw)));
  }
}

// ... one block per plane for large ones.
template <class T>
__global__ void global_avg_block_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t planes, int64_t hw) {
  for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
    const T* xp = x + p * hw;
    double s = 0;
    for (int64_t i = threadIdx.x; i < hw; i += blockDim.x) s += to_compute(xp[i]);
    s = block_sum(s);
    if (threadIdx.x == 0) y[p] = from_compute<T>(static_cast<compute_t<T>>(s / static_cast<double>(hw)));
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
      for (int64_t i = threadIdx.y; i < hw; i += kRows) s += to_compute(x[(n * hw + i) * channels + c]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
      double t = 0;
      for (int r = 0; r < kRows; ++r) t += part[r][threadIdx.x];
      y[n * channels + c] = from_compute<T>(static_cast<compute_t<T>>(t / static_cast<double>(hw)));
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
  expect_one_stored_dtype(a, kValues);
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
  dispatch_value(a.in[0].dtype(), "global_avg_pool", [&]<class T>() { launch = global_avg_pool_as<T>(a, nhwc); });
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
