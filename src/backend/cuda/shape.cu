// Shape ops that move data on the GPU: transpose, concat, slice and slice_grad. Like
// the CPU reference (src/backend/cpu/shape.cpp) they only move elements, so they work
// for every dtype: raw 1, 2, 4 or 8-byte elements.
//
// Every op here is one strided copy, dst[off0(i)] = src[off1(i)] over an index space
// whose dims are collapsed (size-1 dims dropped, neighbours both sides walk
// contiguously merged). When both sides are contiguous in the innermost dim the elements
// are widened to up to 16-byte units. A transpose that moves the input's innermost dim
// (a batched 2D transpose after collapsing: [N, HW, C] from NCHW, or [N, M] from [M, N])
// goes through 32x32 tiles in shared memory so that both reads and writes coalesce,
// unless one side is too narrow to fill them.
#include <algorithm>
#include <array>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "ops/geometry.h"

namespace seam::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxDims = 8;
constexpr int64_t kMinTileSide = 16;

// An index space and the element strides of the destination (0) and source (1) in it.
// Dims are stored innermost first.
struct Strided {
  int rank = 0;
  int64_t size[kMaxDims] = {};
  int64_t st[2][kMaxDims] = {};
};

template <class I>
__device__ __forceinline__ void offsets_of(const Strided& s, I i, I& dst, I& src) {
  dst = 0;
  src = 0;
#pragma unroll
  for (int d = 0; d < kMaxDims; ++d) {
    if (d >= s.rank) break;
    const I n = static_cast<I>(s.size[d]);
    const I q = i / n;
    const I r = i - q * n;
    dst += r * static_cast<I>(s.st[0][d]);
    src += r * static_cast<I>(s.st[1][d]);
    i = q;
  }
}

template <class U, class I>
__global__ void __launch_bounds__(kThreads) copy_strided(U* dst, const U* src, Strided s, I n) {
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    I d, o;
    offsets_of<I>(s, i, d, o);
    dst[d] = src[o];
  }
}

// dst[((z * A) + a) * B + b] = src[batch(z) + a + b * sb]: element (a, b) of batch z.
// Block (32, 8); grid.x = tiles of (a, b), grid.y strides over the batch.
template <class U>
__global__ void __launch_bounds__(kThreads)
    transpose_tiled(U* dst, const U* src, int64_t A, int64_t B, int64_t sb, Strided batch, int64_t nbatch,
                    int64_t tiles_a) {
  __shared__ U tile[32][33];  // [b - b0][a - a0]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t a0 = (blockIdx.x % tiles_a) * 32;
  const int64_t b0 = (blockIdx.x / tiles_a) * 32;
  for (int64_t z = blockIdx.y; z < nbatch; z += gridDim.y) {
    int64_t unused, boff;
    offsets_of<int64_t>(batch, z, unused, boff);
    const U* s = src + boff;
    U* d = dst + z * A * B;
    for (int i = ty; i < 32; i += 8) {
      const int64_t a = a0 + tx, b = b0 + i;
      if (a < A && b < B) tile[i][tx] = s[a + b * sb];
    }
    __syncthreads();
    for (int i = ty; i < 32; i += 8) {
      const int64_t a = a0 + i, b = b0 + tx;
      if (a < A && b < B) d[a * B + b] = tile[tx][i];
    }
    __syncthreads();
  }
}

// Collapses an index space (row-major `shape`) with destination and source strides.
Strided collapse(const Shape& shape, const std::vector<int64_t>& dst_st, const std::vector<int64_t>& src_st,
                 const char* what) {
  Strided s;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) continue;
    if (s.rank > 0) {
      const int in = s.rank - 1;
      if (dst_st[d] == s.st[0][in] * s.size[in] && src_st[d] == s.st[1][in] * s.size[in]) {
        s.size[in] *= shape[d];
        continue;
      }
    }
    if (s.rank == kMaxDims) fail(what, ": more than ", kMaxDims, " dims after collapsing ", shape_str(shape));
    s.size[s.rank] = shape[d];
    s.st[0][s.rank] = dst_st[d];
    s.st[1][s.rank] = src_st[d];
    ++s.rank;
  }
  return s;
}



template <class U>
Launch copy_launch_as(std::byte* dst, const std::byte* src, const Strided& s, int64_t n, unsigned cap) {
  const unsigned blocks = blocks_for(n, kThreads, static_cast<int>(cap));
  U* d = reinterpret_cast<U*>(dst);
  const U* o = reinterpret_cast<const U*>(src);
  int64_t extent = 1;  // every offset of either side is below this many units
  for (int k = 0; k < 2; ++k) {
    int64_t hi = 0;
    for (int i = 0; i < s.rank; ++i) hi += (s.size[i] - 1) * s.st[k][i];
    extent = std::max(extent, hi + 1);
  }
  if (n < (int64_t{1} << 31) && extent < (int64_t{1} << 31))
    return [=](cudaStream_t stream) {
      copy_strided<U, uint32_t><<<blocks, kThreads, 0, stream>>>(d, o, s, static_cast<uint32_t>(n));
      SEAM_CUDA_LAUNCH_CHECK();
    };
  return [=](cudaStream_t stream) {
    copy_strided<U, int64_t><<<blocks, kThreads, 0, stream>>>(d, o, s, n);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// A strided copy of `es`-byte elements: dst[dst_st . idx] = src[src_st . idx] over every
// index of `shape`.
Launch strided_copy(std::byte* dst, const std::byte* src, size_t es, const Shape& shape,
                    const std::vector<int64_t>& dst_st, const std::vector<int64_t>& src_st, unsigned cap,
                    const char* what) {
  Strided s = collapse(shape, dst_st, src_st, what);
  int64_t n = numel(shape);
  if (n == 0) return [](cudaStream_t) {};
  // Widen the unit while both sides are contiguous in the innermost dim and every
  // offset and pointer stays aligned to it.
  size_t w = es;
  if (s.rank > 0 && s.st[0][0] == 1 && s.st[1][0] == 1) {
    auto fits = [&](size_t u) {
      if (reinterpret_cast<uintptr_t>(dst) % u || reinterpret_cast<uintptr_t>(src) % u) return false;
      if ((static_cast<size_t>(s.size[0]) * es) % u) return false;
      for (int k = 0; k < 2; ++k)
        for (int d = 1; d < s.rank; ++d)
          if ((static_cast<size_t>(s.st[k][d]) * es) % u) return false;
      return true;
    };
    while (w < 16 && fits(w * 2)) w *= 2;
    if (w != es) {
      const auto f = static_cast<int64_t>(w / es);
      s.size[0] /= f;
      for (int k = 0; k < 2; ++k)
        for (int d = 1; d < s.rank; ++d) s.st[k][d] /= f;
      n /= f;
    }
  }
  switch (w) {
    case 1: return copy_launch_as<uint8_t>(dst, src, s, n, cap);
    case 2: return copy_launch_as<uint16_t>(dst, src, s, n, cap);
    case 4: return copy_launch_as<uint32_t>(dst, src, s, n, cap);
    case 8: return copy_launch_as<unsigned long long>(dst, src, s, n, cap);
    case 16: return copy_launch_as<uint4>(dst, src, s, n, cap);
    default: fail(what, ": elements of ", es, " bytes");
  }
}

template <class U>
Launch transpose_tiled_launch(std::byte* dst, const std::byte* src, const Strided& s) {
  // s: dim 0 is b (the output's innermost), dim 1 is a (the input's innermost, stride 1).
  const int64_t B = s.size[0], A = s.size[1], sb = s.st[1][0];
  Strided batch;  // the remaining dims, with the source strides (dst is z * A * B)
  for (int d = 2; d < s.rank; ++d) {
    batch.size[batch.rank] = s.size[d];
    batch.st[1][batch.rank] = s.st[1][d];
    ++batch.rank;
  }
  int64_t nbatch = 1;
  for (int d = 0; d < batch.rank; ++d) nbatch *= batch.size[d];
  const int64_t tiles_a = (A + 31) / 32, tiles_b = (B + 31) / 32;
  if (tiles_a * tiles_b > 0x7fffffff) fail("transpose: too many tiles");
  const dim3 grid(static_cast<unsigned>(tiles_a * tiles_b), static_cast<unsigned>(std::min<int64_t>(nbatch, 65535)));
  U* d = reinterpret_cast<U*>(dst);
  const U* o = reinterpret_cast<const U*>(src);
  return [=](cudaStream_t stream) {
    transpose_tiled<U><<<grid, dim3(32, 8), 0, stream>>>(d, o, A, B, sb, batch, nbatch, tiles_a);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

Launch transpose(const StepArgs& a) {
  const auto& perm = a.step.attrs.ints("perm");
  const Shape& in = a.in[0].shape();
  const Shape& out = a.out[0].shape();
  const size_t r = perm.size();
  SEAM_ASSERT(r == in.size() && r == out.size());
  const auto in_st = row_major_strides(in);
  std::vector<int64_t> src_st(r);
  for (size_t d = 0; d < r; ++d) src_st[d] = in_st[static_cast<size_t>(normalize_axis(perm[d], r))];
  const size_t es = dtype_size(a.in[0].dtype());
  std::byte* dst = a.out[0].as<std::byte>();
  const std::byte* src = a.in[0].as<const std::byte>();
  const Strided s = collapse(out, row_major_strides(out), src_st, "transpose");
  // Tiles pay where both sides of the transpose are wide. An image's 3 channels ([N, C, HW]
  // -> [N, HW, C]) would leave 29 of a tile's 32 columns idle in thousands of tiny blocks
  // (34 us for W5's 3 MB input): the strided copy writes contiguously and reads the C
  // planes in a few runs a warp (a few us).
  if (s.rank >= 2 && s.st[1][0] != 1 && s.st[1][1] == 1 && std::min(s.size[0], s.size[1]) >= kMinTileSide) {
    switch (es) {
      case 1: return transpose_tiled_launch<uint8_t>(dst, src, s);
      case 2: return transpose_tiled_launch<uint16_t>(dst, src, s);
      case 4: return transpose_tiled_launch<uint32_t>(dst, src, s);
      case 8: return transpose_tiled_launch<unsigned long long>(dst, src, s);
      default: break;
    }
  }
  return strided_copy(dst, src, es, out, row_major_strides(out), src_st, grid_cap(a.ctx), "transpose");
}

Launch concat(const StepArgs& a) {
  const int axis = normalize_axis(a.step.attrs.i("axis"), a.out[0].shape().size());
  SEAM_ASSERT(axis >= 0);
  const size_t es = dtype_size(a.out[0].dtype());
  const AxisSplit out = split_at(a.out[0].shape(), axis);
  std::vector<Launch> parts;
  int64_t at = 0;  // elements along the axis already filled
  for (auto& in : a.in) {
    const AxisSplit p = split_at(in.shape(), axis);
    // Index space [outer, len * inner]: row o of this input lands at row o of the output,
    // `at * inner` elements in.
    std::byte* dst = a.out[0].as<std::byte>() + static_cast<size_t>(at * out.inner) * es;
    parts.push_back(strided_copy(dst, in.as<const std::byte>(), es, {p.outer, p.len * p.inner},
                                 {out.len * out.inner, 1}, {p.len * p.inner, 1}, grid_cap(a.ctx), "concat"));
    at += p.len;
  }
  return [parts = std::move(parts)](cudaStream_t stream) {
    for (auto& l : parts) l(stream);
  };
}

// The copy between a full tensor [outer, len, inner] and its slice [outer, count, inner],
// over the slice's index space; `to_slice` picks the direction.
Launch slice_copy(const StepArgs& a, const DeviceTensor& full, const DeviceTensor& part, bool to_slice) {
  const int axis = normalize_axis(a.step.attrs.i("axis"), full.shape().size());
  SEAM_ASSERT(axis >= 0);
  const AxisSplit f = split_at(full.shape(), axis);
  const auto r = normalize_slice(a.step.attrs.i("start"), a.step.attrs.i("end"), a.step.attrs.i("step"), f.len);
  SEAM_ASSERT(r.count == part.shape()[static_cast<size_t>(axis)]);
  const size_t es = dtype_size(full.dtype());
  std::byte* full_p = static_cast<std::byte*>(full.data) + static_cast<size_t>(r.start * f.inner) * es;
  std::byte* part_p = static_cast<std::byte*>(part.data);
  const Shape space{f.outer, r.count, f.inner};
  const std::vector<int64_t> full_st{f.len * f.inner, r.step * f.inner, 1}, part_st{r.count * f.inner, f.inner, 1};
  const char* what = to_slice ? "slice" : "slice_grad";
  if (to_slice) return strided_copy(part_p, full_p, es, space, part_st, full_st, grid_cap(a.ctx), what);
  return strided_copy(full_p, part_p, es, space, full_st, part_st, grid_cap(a.ctx), what);
}

Launch slice(const StepArgs& a) { return slice_copy(a, a.in[0], a.out[0], true); }

Launch slice_grad(const StepArgs& a) {
  void* dx = a.out[0].data;
  const size_t bytes = a.out[0].type.bytes();
  Launch scatter = slice_copy(a, a.out[0], a.in[0], false);
  return [=](cudaStream_t stream) {
    SEAM_CUDA_CHECK(cudaMemsetAsync(dx, 0, bytes, stream));
    scatter(stream);
  };
}

}  // namespace

void register_shape(PreparerTable& t) {
  set(t, Op::transpose, transpose);
  set(t, Op::concat, concat);
  set(t, Op::slice, slice);
  set(t, Op::slice_grad, slice_grad);
}

}  // namespace seam::cuda
