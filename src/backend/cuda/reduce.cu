// sum, mean and broadcast_to on the GPU. Same results as the CPU reference
// (src/backend/cpu/reduce.cpp): every reduction accumulates in double (bandwidth-bound,
// so double adds cost nothing on the GPUs we target) and is deterministic: a fixed
// partition of the work and fixed-order combines, no atomics. The input is stored as
// TI and the output as TO (f32, bf16 or f16 each: a sum of bf16 values may be written
// in f32; or both f64), and the result is rounded once, when stored.
//
// The input's dims are first collapsed into alternating kept/reduced groups (size-1
// dims dropped, neighbours of the same kind merged). Then:
//  - the innermost group kept and at least 32 wide (axes=[0] of [M, N], (0, 2) of
//    [A, B, C]): column tiles, 32 threads across the kept index (coalesced; 16-byte
//    packs a thread where the width is whole packs) by 8 down
//    the reduced rows, split into row chunks when there are few columns, whose double
//    partials the tile's last block to finish adds up in chunk order;
//  - otherwise one thread (L <= 16 reduced elements), one warp (L <= 4096) or one block
//    per output element (larger L, split into chunks plus a second pass over their partials when
//    there are few outputs), walking the reduced elements through their strides.
#include <array>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/reduce.h"
#include "backend/cuda/storage.cuh"

namespace seam::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxDims = 8;

// A set of dims (innermost first) with element strides: maps a row-major index over the
// dims to an element offset.
struct Dims {
  int n = 0;
  int64_t size[kMaxDims] = {};
  int64_t st[kMaxDims] = {};
  int64_t count() const {
    int64_t c = 1;
    for (int d = 0; d < n; ++d) c *= size[d];
    return c;
  }
  void push(int64_t sz, int64_t stride) {  // the next dim outwards
    if (n == kMaxDims) fail("reduction: more than ", kMaxDims, " dims after collapsing");
    size[n] = sz;
    st[n] = stride;
    ++n;
  }
};

__device__ __forceinline__ int64_t offset_of(const Dims& m, int64_t i) {
  if (m.n == 1) return i * m.st[0];
  int64_t off = 0;
#pragma unroll
  for (int d = 0; d < kMaxDims; ++d) {
    if (d >= m.n) break;
    const int64_t q = i / m.size[d];
    off += (i - q * m.size[d]) * m.st[d];
    i = q;
  }
  return off;
}

template <class T>
__device__ __forceinline__ double load_d(const T* p, int64_t i) {
  return static_cast<double>(to_compute(p[i]));
}
template <class T>
__device__ __forceinline__ void store_d(T* p, int64_t i, double v) {
  p[i] = from_compute<T>(static_cast<compute_t<T>>(v));
}

// One thread per output element.
template <class TI, class TO>
__global__ void __launch_bounds__(kThreads)
    reduce_thread(const TI* x, TO* y, Dims kept, Dims red, int64_t outputs, int64_t len, double scale) {
  for (int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; o < outputs;
       o += int64_t{gridDim.x} * blockDim.x) {
    const TI* p = x + offset_of(kept, o);
    double acc = 0;
    for (int64_t j = 0; j < len; ++j) acc += load_d(p, offset_of(red, j));
    store_d(y, o, acc * scale);
  }
}

// One warp per output element.
template <class TI, class TO>
__global__ void __launch_bounds__(kThreads)
    reduce_warp(const TI* x, TO* y, Dims kept, Dims red, int64_t outputs, int64_t len, double scale) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x >> 5);
  for (int64_t o = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5; o < outputs; o += warps) {
    const TI* p = x + offset_of(kept, o);
    double acc = 0;
    for (int64_t j = lane; j < len; j += 32) acc += load_d(p, offset_of(red, j));
    acc = warp_sum(acc);
    if (lane == 0) store_d(y, o, acc * scale);
  }
}

// One block per (output element, chunk of `rows` reduced elements); grid (outputs,
// chunks). With one chunk it writes the output, else its partial [chunk][output].
template <class TI, class TO>
__global__ void __launch_bounds__(kThreads)
    reduce_block(const TI* x, TO* y, double* partial, Dims kept, Dims red, int64_t outputs, int64_t len,
                 int64_t rows, double scale) {
  const int64_t o = blockIdx.x;
  const int64_t c = blockIdx.y;
  const int64_t j0 = c * rows;
  const int64_t j1 = min(len, j0 + rows);
  const TI* p = x + offset_of(kept, o);
  double acc = 0;
  for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) acc += load_d(p, offset_of(red, j));
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    if (gridDim.y == 1) store_d(y, o, acc * scale);
    else partial[c * outputs + o] = acc;
  }
}

// The innermost kept group (k, `width` wide, stride 1) in tiles of 32 P columns, by 8
// threads down a chunk of `rows` reduced elements; each thread adds P neighbouring
// columns. P = 1 reads one value a lane; where the width is a whole number of 16-byte
// packs, P = 16 / sizeof(TI) reads one pack a lane, so a warp reads 512 bytes of a row at
// once instead of 32 to 128 (a 16-bit column sum ran at about 2 TB/s one value a lane).
// A thread loads kBatch rows before it adds them; 16-bit values are added in float a
// batch at a time and the batch into double (the conversions to double, a quarter-rate
// instruction, were one a value). Block (32, 8); grid.x = (outer kept index, tile of k),
// grid.y = chunks. The tile's 8 thread rows are added in order.
//
// With several chunks each block stores its partial sums, and the tile's last block to
// arrive (`arrived`, a counter a tile that it resets) adds them up in chunk order: the
// same fixed order every run, without a second launch (which was 3 us and a gap at
// GPT-2's bias gradients, against a column sum of 38).
constexpr int kBatch = 4;
template <class TI, class TO, int P>
__global__ void __launch_bounds__(kThreads)
    reduce_columns(const TI* x, TO* y, double* partial, unsigned* arrived, Dims outer, int64_t width, int64_t tiles,
                   Dims red, int64_t outputs, int64_t len, int64_t rows, double scale) {
  using Part = std::conditional_t<sizeof(TI) == 2, float, double>;
  __shared__ double sum[8][32 * P];
  __shared__ bool last;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t oo = blockIdx.x / tiles;
  const int64_t tile = (blockIdx.x % tiles) * 32 * P;
  const int64_t k = tile + tx * P;
  const int64_t c = blockIdx.y;
  const int64_t j0 = c * rows;
  const int64_t j1 = min(len, j0 + rows);
  double acc[P] = {};
  if (k < width) {
    const TI* p = x + offset_of(outer, oo) + k;
    struct alignas(sizeof(TI) * P) Pack {
      TI v[P];
    };
    auto load = [&](int64_t j) {
      Pack r;
      if constexpr (P == 1) r.v[0] = p[offset_of(red, j)];
      else *reinterpret_cast<uint4*>(&r) = __ldg(reinterpret_cast<const uint4*>(p + offset_of(red, j)));
      return r;
    };
    int64_t j = j0 + ty;
    for (; j + (kBatch - 1) * 8 < j1; j += kBatch * 8) {
      Pack v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) v[b] = load(j + b * 8);
      Part part[P] = {};
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
#pragma unroll
        for (int q = 0; q < P; ++q) part[q] += static_cast<Part>(to_compute(v[b].v[q]));
#pragma unroll
      for (int q = 0; q < P; ++q) acc[q] += static_cast<double>(part[q]);
    }
    for (; j < j1; j += 8) {
      const Pack v = load(j);
#pragma unroll
      for (int q = 0; q < P; ++q) acc[q] += static_cast<double>(to_compute(v.v[q]));
    }
  }
#pragma unroll
  for (int q = 0; q < P; ++q) sum[ty][tx * P + q] = acc[q];
  __syncthreads();
  for (int t = ty * 32 + tx; t < 32 * P; t += 256) {
    if (tile + t >= width) break;
    double s = 0;
#pragma unroll
    for (int r = 0; r < 8; ++r) s += sum[r][t];
    const int64_t o = oo * width + tile + t;
    if (gridDim.y == 1) store_d(y, o, s * scale);
    else partial[c * outputs + o] = s;
  }
  if (gridDim.y == 1) return;
  __threadfence();  // this block's partials, before its arrival is counted
  __syncthreads();
  if (tx == 0 && ty == 0) last = atomicAdd(&arrived[blockIdx.x], 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The tile's 32 P columns by G = 256 / (32 P) threads each: thread group g adds chunks
  // g, g + G, ...; then group 0 adds the G sums in order.
  constexpr int G = 256 / (32 * P);
  const int t = ty * 32 + tx, col = t % (32 * P), g = t / (32 * P);
  const bool inside = tile + col < width;
  double s = 0;
  if (inside)
#pragma unroll 8
    for (int64_t ch = g; ch < gridDim.y; ch += G) s += __ldcg(&partial[ch * outputs + oo * width + tile + col]);
  __syncthreads();  // every thread has read sum[][] above
  sum[g][col] = s;
  __syncthreads();
  if (g == 0 && inside) {
    double total = 0;
#pragma unroll
    for (int r = 0; r < G; ++r) total += sum[r][col];
    store_d(y, oo * width + tile + col, total * scale);
  }
  if (t == 0) arrived[blockIdx.x] = 0;  // for the next run
}

// Block (32, kPartRows) over 32 outputs of partial set blockIdx.y: thread row ty adds
// chunks ty, ty + kPartRows, ..., then thread row 0 adds the kPartRows sums in order.
// Several threads a column keep enough loads in flight when there are few outputs and
// many chunks (a column sum's kernel): at layer norm's 3 x 768 sums of 264 slices, 8
// rows (33 loads a thread) took 5.5 us, waiting on memory load after load; 32 rows, 3.2.
constexpr int kPartRows = 32;
__global__ void __launch_bounds__(32 * kPartRows) add_partials_kernel(const PartialSums p) {
  __shared__ double sums[kPartRows][32];
  const int tx = threadIdx.x, ty = threadIdx.y, r = blockIdx.y;
  for (int64_t base = int64_t{blockIdx.x} * 32; base < p.kept; base += int64_t{gridDim.x} * 32) {  // block-uniform
    const int64_t o = base + tx;
    double s = 0;
    if (o < p.kept)
#pragma unroll 8
      for (int c = ty; c < p.chunks; c += kPartRows) s += p.partial[(int64_t{c} * p.outputs + r) * p.kept + o];
    sums[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && o < p.kept) {
      double t = 0;
      for (int k = 0; k < kPartRows; ++k) t += sums[k][tx];
      const double v = t * p.scale[r];
      switch (p.dtype[r]) {  // block-uniform
        case DType::bf16: store_d(static_cast<bf16_t*>(p.out[r]), o, v); break;
        case DType::f16: store_d(static_cast<f16_t*>(p.out[r]), o, v); break;
        case DType::f64: store_d(static_cast<double*>(p.out[r]), o, v); break;
        default: store_d(static_cast<float*>(p.out[r]), o, v); break;
      }
    }
    __syncthreads();
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One output's chunk partials.
template <class TO>
PartialSums partial_sums(const double* partial, TO* y, double scale, int64_t chunks, int64_t outputs) {
  PartialSums p;
  p.partial = partial;
  p.out[0] = y;
  p.dtype[0] = dtype_of<TO>();
  p.scale[0] = scale;
  p.outputs = 1;
  p.chunks = static_cast<int>(chunks);
  p.kept = outputs;
  return p;
}

// x_at: where the input is when the launch runs, if not at a.in[0] (column_sums_at).
template <class TI, class TO>
Launch prepare_reduce_as(const StepArgs& a, bool mean, const std::function<const void*()>& x_at) {
  const Shape& s = a.in[0].shape();
  const size_t r = s.size();
  const auto& axes = a.step.attrs.ints("axes");
  std::vector<bool> red(r, axes.empty());
  for (int64_t ax : axes) {
    const int d = normalize_axis(ax, r);
    if (d < 0) fail(op_name(a.step.op), " '", a.step.name, "': axis ", ax, " is out of range for rank ", r);
    red[static_cast<size_t>(d)] = true;
  }
  const double scale =
      mean ? static_cast<double>(a.out[0].numel()) / static_cast<double>(a.in[0].numel()) : 1.0;
  const TI* x = x_at ? static_cast<const TI*>(x_at()) : a.in[0].as<const TI>();  // for its alignment
  auto in = [x, x_at] { return x_at ? static_cast<const TI*>(x_at()) : x; };
  TO* y = a.out[0].as<TO>();

  // Groups of neighbouring dims of one kind, outermost first: {size, stride, reduced}.
  struct Group {
    int64_t size, stride;
    bool red;
  };
  std::vector<Group> groups;
  int64_t stride = 1;
  std::vector<int64_t> st(r);
  for (size_t d = r; d-- > 0;) {
    st[d] = stride;
    stride *= s[d];
  }
  for (size_t d = 0; d < r; ++d) {
    if (s[d] == 1) continue;
    if (!groups.empty() && groups.back().red == red[d]) {
      groups.back().size *= s[d];
      groups.back().stride = st[d];
    } else {
      groups.push_back({s[d], st[d], red[d]});
    }
  }
  Dims kept, reduced;
  for (size_t g = groups.size(); g-- > 0;) (groups[g].red ? reduced : kept).push(groups[g].size, groups[g].stride);
  const int64_t outputs = kept.count(), len = reduced.count();
  SEAM_ASSERT(outputs == a.out[0].numel());

  const size_t bytes = a.out[0].type.bytes();
  if (len == 1 && std::is_same_v<TI, TO>)  // nothing to add up (and scale == 1)
    return [=](cudaStream_t stream) {
      SEAM_CUDA_CHECK(cudaMemcpyAsync(y, in(), bytes, cudaMemcpyDeviceToDevice, stream));
    };

  const int64_t sms = std::max(a.ctx.sm_count, 1);
  const int64_t target = sms * 8;  // blocks that keep every SM busy
  const unsigned cap = static_cast<unsigned>(target);

  if (!groups.empty() && !groups.back().red && groups.back().size >= 32) {
    // Column tiles over the innermost kept group.
    const int64_t width = groups.back().size;
    Dims outer;
    for (int d = 1; d < kept.n; ++d) outer.push(kept.size[d], kept.st[d]);
    // Whole packs: every stride is a multiple of the width (the kept group is innermost).
    constexpr int pack = 16 / static_cast<int>(sizeof(TI));
    const bool packed = width % pack == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const int64_t tiles = ceil_div(width, packed ? 32 * pack : 32);
    const int64_t blocks_x = tiles * outer.count();
    if (blocks_x > 0x7fffffff) fail(op_name(a.step.op), " '", a.step.name, "': too many columns");
    int64_t chunks = std::clamp<int64_t>(ceil_div(target, blocks_x), 1, std::min<int64_t>(ceil_div(len, 64), 65535));
    const int64_t rows = ceil_div(len, chunks);
    chunks = ceil_div(len, rows);
    double* partial =
        chunks > 1 ? static_cast<double*>(a.ctx.scratch(static_cast<size_t>(chunks * outputs) * sizeof(double)))
                   : nullptr;
    auto* arrived =
        chunks > 1 ? static_cast<unsigned*>(a.ctx.scratch(static_cast<size_t>(blocks_x) * sizeof(unsigned))) : nullptr;
    const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(chunks));
    return [=](cudaStream_t stream) {
      if (packed)
        reduce_columns<TI, TO, pack><<<grid, dim3(32, 8), 0, stream>>>(in(), y, partial, arrived, outer, width, tiles,
                                                                      reduced, outputs, len, rows, scale);
      else
        reduce_columns<TI, TO, 1><<<grid, dim3(32, 8), 0, stream>>>(in(), y, partial, arrived, outer, width, tiles,
                                                                   reduced, outputs, len, rows, scale);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  }
  if (len <= 16) {
    const unsigned blocks = blocks_for(outputs, kThreads, static_cast<int>(cap));
    return [=](cudaStream_t stream) {
      reduce_thread<TI, TO><<<blocks, kThreads, 0, stream>>>(in(), y, kept, reduced, outputs, len, scale);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  }
  if (len <= 4096) {
    const unsigned blocks = blocks_for(outputs * 32, kThreads, static_cast<int>(cap));
    return [=](cudaStream_t stream) {
      reduce_warp<TI, TO><<<blocks, kThreads, 0, stream>>>(in(), y, kept, reduced, outputs, len, scale);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  }
  if (outputs > 0x7fffffff) fail(op_name(a.step.op), " '", a.step.name, "': too many outputs");
  int64_t chunks = std::clamp<int64_t>(ceil_div(target, outputs), 1, std::min<int64_t>(ceil_div(len, 4096), 65535));
  const int64_t rows = ceil_div(len, chunks);
  chunks = ceil_div(len, rows);
  double* partial =
      chunks > 1 ? static_cast<double*>(a.ctx.scratch(static_cast<size_t>(chunks * outputs) * sizeof(double)))
                 : nullptr;
  const dim3 grid(static_cast<unsigned>(outputs), static_cast<unsigned>(chunks));
  const PartialSums fin = partial_sums(partial, y, scale, chunks, outputs);
  return [=](cudaStream_t stream) {
    reduce_block<TI, TO><<<grid, kThreads, 0, stream>>>(in(), y, partial, kept, reduced, outputs, len, rows, scale);
    SEAM_CUDA_LAUNCH_CHECK();
    if (chunks > 1) add_partials(fin, stream);
  };
}

// The input and the output may each be stored as f32, bf16 or f16, or both as f64.
Launch prepare_reduce(const StepArgs& a, bool mean, const std::function<const void*()>& x_at = {}) {
  const char* what = op_name(a.step.op);
  Launch l;
  if (a.in[0].dtype() == DType::f64 || a.out[0].dtype() == DType::f64) {
    expect_one_stored_dtype(a, {DType::f64});
    return prepare_reduce_as<double, double>(a, mean, x_at);
  }
  expect_dtype(a, a.in[0], kStored);
  expect_dtype(a, a.out[0], kStored);
  dispatch_storage(a.in[0].dtype(), what, [&]<class TI>() {
    dispatch_storage(a.out[0].dtype(), what, [&]<class TO>() { l = prepare_reduce_as<TI, TO>(a, mean, x_at); });
  });
  return l;
}

Launch sum(const StepArgs& a) { return prepare_reduce(a, false); }
Launch mean(const StepArgs& a) { return prepare_reduce(a, true); }

// broadcast_to: output element i reads the input at its broadcast offset. It moves
// elements, so it takes U, an unsigned type of the element's size, for every dtype.
template <class U, class I>
__global__ void __launch_bounds__(kThreads) broadcast_kernel(const U* x, U* y, Dims m, I n) {
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    I off = 0, rest = i;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d >= m.n) break;
      const I sz = static_cast<I>(m.size[d]);
      const I q = rest / sz;
      off += (rest - q * sz) * static_cast<I>(m.st[d]);
      rest = q;
    }
    y[i] = x[off];
  }
}

template <class U>
Launch broadcast_as(const StepArgs& a) {
  const Shape& in = a.in[0].shape();
  const Shape& out = a.out[0].shape();
  const size_t r = out.size();
  SEAM_ASSERT(in.size() <= r);
  // The input's strides in the output's index space (0 on broadcast dims), then the dims
  // collapsed: size-1 dims dropped, neighbours the input walks contiguously merged.
  std::vector<int64_t> st(r, 0);
  const size_t lead = r - in.size();
  int64_t s = 1;
  for (size_t d = in.size(); d-- > 0;) {
    st[lead + d] = in[d] == 1 ? 0 : s;
    s *= in[d];
  }
  Dims m;
  for (size_t d = r; d-- > 0;) {
    if (out[d] == 1) continue;
    if (m.n > 0 && st[d] == m.st[m.n - 1] * m.size[m.n - 1]) {
      m.size[m.n - 1] *= out[d];
      continue;
    }
    m.push(out[d], st[d]);
  }
  const U* x = a.in[0].as<const U>();
  U* y = a.out[0].as<U>();
  const int64_t n = a.out[0].numel();
  if (m.n == 0 || (m.n == 1 && m.st[0] == 1)) {  // the same elements: a copy
    const size_t bytes = a.out[0].type.bytes();
    return [=](cudaStream_t stream) {
      SEAM_CUDA_CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, stream));
    };
  }
  const unsigned blocks = blocks_for(n, kThreads, std::max(a.ctx.sm_count, 1) * 8);
  if (n < (int64_t{1} << 31))
    return [=](cudaStream_t stream) {
      broadcast_kernel<U, uint32_t><<<blocks, kThreads, 0, stream>>>(x, y, m, static_cast<uint32_t>(n));
      SEAM_CUDA_LAUNCH_CHECK();
    };
  return [=](cudaStream_t stream) {
    broadcast_kernel<U, int64_t><<<blocks, kThreads, 0, stream>>>(x, y, m, n);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

Launch broadcast_to(const StepArgs& a) {
  if (a.in[0].dtype() != a.out[0].dtype())
    fail("broadcast_to '", a.step.name, "': input ", a.in[0].type.str(), " and output ", a.out[0].type.str(),
         " differ in dtype");
  switch (dtype_size(a.in[0].dtype())) {
    case 1: return broadcast_as<uint8_t>(a);
    case 2: return broadcast_as<uint16_t>(a);
    case 4: return broadcast_as<uint32_t>(a);
    default: return broadcast_as<unsigned long long>(a);
  }
}

}  // namespace

void add_partials(const PartialSums& p, cudaStream_t st) {
  SEAM_ASSERT(p.outputs >= 1 && p.outputs <= PartialSums::kMaxOutputs && p.chunks >= 1);
  for (int r = 0; r < p.outputs; ++r)
    SEAM_ASSERT(p.dtype[r] == DType::f32 || p.dtype[r] == DType::bf16 || p.dtype[r] == DType::f16 ||
                p.dtype[r] == DType::f64);
  const dim3 grid(blocks_for(p.kept, 32, 1 << 20), static_cast<unsigned>(p.outputs));
  add_partials_kernel<<<grid, dim3(32, kPartRows), 0, st>>>(p);
  SEAM_CUDA_LAUNCH_CHECK();
}

Launch column_sums_at(const StepArgs& a, std::function<const void*()> x, const TensorType& x_type,
                      const DeviceTensor& out) {
  SEAM_ASSERT(x && x_type.shape.size() == 2 && out.numel() == x_type.shape[1]);
  PlanStep s{Op::sum, Attrs{{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}}, {}, {}, a.step.name, 0};
  StepArgs sub{s, a.index, {DeviceTensor{nullptr, x_type}}, {out}, a.ctx};
  return prepare_reduce(sub, false, x);
}

void register_reduce(PreparerTable& t) {
  set(t, Op::sum, sum);
  set(t, Op::mean, mean);
  set(t, Op::broadcast_to, broadcast_to);
}

}  // namespace seam::cuda
