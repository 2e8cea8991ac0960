// One row of cross_entropy on the GPU, for the kernels of src/backend/cuda/loss.cu (its
// only includer): the row's log-sum-exp in one pass (with its argmax where wanted), its
// loss, and its gradient, the row read from memory as they go (Streamed) or staged in
// shared memory once read (Staged); reduced over a warp or a block (WarpGroup, BlockGroup).
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/storage.cuh"

namespace seam::cuda::ce {

// 16 bytes of T (4 floats, 8 16-bit values): one load or store.
template <class T>
inline constexpr int kPer = 16 / static_cast<int>(sizeof(T));
template <class T>
struct alignas(16) Pack {
  T v[kPer<T>];
};

// Log-sum-exp in one pass: (m, s) with s = sum(exp(v - m)) over the values seen so far,
// (-inf, 0) for none. A new maximum rescales s. Sums use explicit roundings (no FMA
// contraction), so merging (a, b) and (b, a) gives the same bits and every lane of a
// butterfly ends with the same pair.
__device__ inline void lse_add(float& m, float& s, float v) {
  if (v > m) {
    s = __fadd_rn(__fmul_rn(s, expf(m - v)), 1.f);  // from m = -inf: 0 * 0 + 1
    m = v;
  } else {
    s = __fadd_rn(s, v == -INFINITY ? 0.f : expf(v - m));  // a NaN v propagates
  }
}

__device__ inline void lse_merge(float& m, float& s, float m2, float s2) {
  const float nm = fmaxf(m, m2);
  if (nm == -INFINITY) return;  // both empty
  s = __fadd_rn(__fmul_rn(s, expf(m - nm)), __fmul_rn(s2, expf(m2 - nm)));
  m = nm;
}

// The argmax carried beside (m, s): i is the first index holding m (INT64_MAX for none);
// merged before m changes.
__device__ inline void arg_merge(float m, int64_t& i, float m2, int64_t i2) {
  if (m2 > m) i = i2;
  else if (m2 == m) i = min(i, i2);
}

// Find: also the argmax i of the values merged.
template <bool Find>
__device__ inline void warp_lse(float& m, float& s, int64_t& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    if constexpr (Find) arg_merge(m, i, m2, __shfl_xor_sync(0xffffffffu, i, o));
    lse_merge(m, s, m2, s2);
  }
}

// Over a block whose size is a multiple of 32; every thread gets the result.
template <bool Find>
__device__ inline void block_lse(float& m, float& s, int64_t& i) {
  __shared__ float pm[32], ps[32];
  __shared__ int64_t pi[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_lse<Find>(m, s, i);
  __syncthreads();  // pm, ps, pi may still be read by a previous call
  if (lane == 0) {
    pm[warp] = m;
    ps[warp] = s;
    if constexpr (Find) pi[warp] = i;
  }
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  m = lane < warps ? pm[lane] : -INFINITY;
  s = lane < warps ? ps[lane] : 0.f;
  if constexpr (Find) i = lane < warps ? pi[lane] : INT64_MAX;
  warp_lse<Find>(m, s, i);
}

// A sum s, with WithSum a second sum z, with Find a minimum i, over a warp in one round of
// shuffles (a fixed order: every lane ends with the same bits).
template <bool WithSum, bool Find>
__device__ inline void warp_sums(float& s, float& z, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    if constexpr (WithSum) z += __shfl_xor_sync(0xffffffffu, z, o);
    if constexpr (Find) i = min(i, __shfl_xor_sync(0xffffffffu, i, o));
  }
}

template <bool WithSum, bool Find>
__device__ inline void block_sums(float& s, float& z, int& i) {
  __shared__ float ps[32], pz[32];
  __shared__ int pi[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_sums<WithSum, Find>(s, z, i);
  __syncthreads();  // ps, pz, pi may still be read by a previous call
  if (lane == 0) {
    ps[warp] = s;
    if constexpr (WithSum) pz[warp] = z;
    if constexpr (Find) pi[warp] = i;
  }
  __syncthreads();
  const bool in = lane < ((blockDim.x + 31) >> 5);
  s = in ? ps[lane] : 0.f;
  if constexpr (WithSum) z = in ? pz[lane] : 0.f;
  if constexpr (Find) i = in ? pi[lane] : INT32_MAX;
  warp_sums<WithSum, Find>(s, z, i);
}

// A group of threads that handles one row at a time: a warp or a whole block. Rows are
// distributed first(), first() + stride(), ...; every branch that depends only on the row
// is uniform over the group, so the group's reductions are reached by all its threads.
struct WarpGroup {
  __device__ int rank() const { return threadIdx.x & 31; }
  __device__ int size() const { return 32; }
  __device__ int64_t first() const { return blockIdx.x * int64_t{blockDim.x >> 5} + (threadIdx.x >> 5); }
  __device__ int64_t stride() const { return int64_t{gridDim.x} * (blockDim.x >> 5); }
  __device__ float sum(float v) const { return warp_sum(v); }
  template <bool Find>
  __device__ void lse(float& m, float& s, int64_t& i) const { warp_lse<Find>(m, s, i); }
};

// Rows staged in shared memory (Staged) are a block's: only BlockGroup has max and sums.
struct BlockGroup {
  __device__ int rank() const { return threadIdx.x; }
  __device__ int size() const { return blockDim.x; }
  __device__ int64_t first() const { return blockIdx.x; }
  __device__ int64_t stride() const { return gridDim.x; }
  __device__ float sum(float v) const { return block_sum(v); }
  __device__ float max(float v) const { return block_max(v); }
  template <bool WithSum, bool Find>
  __device__ void sums(float& s, float& z, int& i) const { block_sums<WithSum, Find>(s, z, i); }
  template <bool Find>
  __device__ void lse(float& m, float& s, int64_t& i) const { block_lse<Find>(m, s, i); }
};

// Whether a row counts; reports (once, from rank 0) a label that is neither a class nor
// ignore_index.
template <class G>
__device__ bool row_counts(const G& g, int32_t label, int64_t row, int64_t classes, int64_t ignore_index,
                           DeviceError* err, int step) {
  if (static_cast<int64_t>(label) == ignore_index) return false;
  if (label < 0 || label >= classes) {
    if (g.rank() == 0) report_error(err, step, kLabelRange, row, label, classes);
    return false;
  }
  return true;
}

// One thread's part of row_stats: classes rank, rank + step, ... (in increasing order, so
// a strictly larger value is the only one that moves the first index of the maximum).
template <bool WithSum, bool Find, class T>
__device__ void stats_scalar(const T* __restrict__ z, int64_t classes, int64_t rank, int64_t step, float& m, float& s,
                             float& zsum, int64_t& first) {
  // Four loads in flight per thread before their values are used: the sum is a serial
  // chain, and one load at a time would leave the row's read latency-bound.
  int64_t c = rank;
  for (; c + 3 * step < classes; c += 4 * step) {
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = to_float(z[c + k * step]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (Find)
        if (v[k] > m) first = c + k * step;
      lse_add(m, s, v[k]);
      if constexpr (WithSum) zsum += v[k];
    }
  }
  for (; c < classes; c += step) {
    const float v = to_float(z[c]);
    if constexpr (Find)
      if (v > m) first = c;
    lse_add(m, s, v);
    if constexpr (WithSum) zsum += v;
  }
}

constexpr float kLog2e = 1.4426950408889634f;

// 2^x by the special function unit (about 2 ulp; 2^-inf = 0). The packed rows' terms
// exp(v - m) are 2^(v log2 e - m log2 e), one FMA and this: expf's accurate sequence took
// most of the loss kernel's instructions. The error of m log2 e is common to a row's
// terms, so it cancels in softmax = term / sum; in the loss it is m log2 e's rounding
// (a few ulp of m).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A pack of values into (m, s): one rescale to the pack's maximum, then its terms, which
// do not depend on each other (added pairwise). A +inf m makes the row's sum NaN
// (row_stats), whatever its terms; fmaxf passes over a NaN, whose term then makes s NaN.
// Find: a new maximum's first index (base + k) goes to first.
template <bool Find, int K>
__device__ inline void lse_add_pack(float& m, float& s, const float (&v)[K], int64_t base, int64_t& first) {
  float mx = m;
#pragma unroll
  for (int k = 0; k < K; ++k) mx = fmaxf(mx, v[k]);
  if (mx > m) {
    if constexpr (Find) {
#pragma unroll
      for (int k = K - 1; k >= 0; --k)
        if (v[k] == mx) first = base + k;
    }
    s = __fmul_rn(s, fast_exp2((m - mx) * kLog2e));  // from m = -inf: s is 0 (2^-inf = 0)
    m = mx;
  }
  float e[K];
  if (isfinite(m)) {
    const float ml = m * kLog2e;
#pragma unroll
    for (int k = 0; k < K; ++k) e[k] = fast_exp2(fmaf(v[k], kLog2e, -ml));  // -inf: 0
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k) e[k] = v[k] == -INFINITY ? 0.f : expf(v[k] - m);
  }
#pragma unroll
  for (int w = 1; w < K; w *= 2)
#pragma unroll
    for (int k = 0; k + w < K; k += 2 * w) e[k] = __fadd_rn(e[k], e[k + w]);
  s = __fadd_rn(s, e[0]);
}

// A pack's values as floats (padding columns, from `classes` on, as -inf), their sum
// added to zsum when wanted. A pack without padding (all but a row's last) converts its
// values with no test each.
template <bool WithSum, class T, class I>
__device__ inline void unpack(const Pack<T>& p, I c, I classes, float (&v)[kPer<T>], float& zsum) {
  if ((c + 1) * kPer<T> <= classes) {
#pragma unroll
    for (int k = 0; k < kPer<T>; ++k) v[k] = to_float(p.v[k]);
    if constexpr (WithSum)
#pragma unroll
      for (int k = 0; k < kPer<T>; ++k) zsum += v[k];
    return;
  }
#pragma unroll
  for (int k = 0; k < kPer<T>; ++k) {
    const bool in = c * kPer<T> + k < classes;
    v[k] = in ? to_float(p.v[k]) : -INFINITY;
    if constexpr (WithSum) zsum += in ? v[k] : 0.f;
  }
}

// The gradient's constants for a row whose stats are m, s (see row_grad). A finite m's
// terms come from fast_exp2 as in lse_add_pack.
struct GradRow {
  float m, ml, inv_s, scf, on, off, a, b;  // a = scf / s, b = scf * off
  bool fast;                               // m finite
  int32_t label;
  int64_t classes;
  __device__ float term(float v) const { return fast ? fast_exp2(fmaf(v, kLog2e, -ml)) : expf(v - m); }
};

__device__ inline GradRow grad_row(float m, float s, double sc, double smoothing, double off_target, int32_t label,
                                   int64_t classes) {
  const float inv_s = 1.f / s, scf = static_cast<float>(sc), off = static_cast<float>(off_target);
  return {m, m * kLog2e, inv_s, scf, static_cast<float>(off_target + (1.0 - smoothing)), off, scf * inv_s, scf * off,
          static_cast<bool>(isfinite(m)), label, classes};
}

// The packs of a row before the first that holds padding, and the one that holds the
// label (a class: >= 0), in the index type of the row's loop: the gradient's test per
// pack is then two comparisons of that type.
template <class T, class I>
struct PackBounds {
  I whole, label;
  __device__ explicit PackBounds(const GradRow& r)
      : whole(static_cast<I>(r.classes / kPer<T>)), label(static_cast<I>(r.label / kPer<T>)) {}
};

// Pack c of the gradient row from pack c of the logits; padding columns 0. A pack with
// neither the label nor padding takes one FMA a value past its term.
template <class T, class I>
__device__ inline Pack<T> grad_pack(const Pack<T>& in, I c, const GradRow& r, const PackBounds<T, I>& pb) {
  Pack<T> out;
  const I j0 = kPer<T> * c;
  if (r.fast && c < pb.whole && c != pb.label) {
#pragma unroll
    for (int k = 0; k < kPer<T>; ++k)
      out.v[k] = from_float<T>(fmaf(fast_exp2(fmaf(to_float(in.v[k]), kLog2e, -r.ml)), r.a, -r.b));
    return out;
  }
#pragma unroll
  for (int k = 0; k < kPer<T>; ++k) {
    const I j = j0 + k;
    const float p = r.term(to_float(in.v[k])) * r.inv_s;
    out.v[k] = from_float<T>(j < r.classes ? r.scf * (p - (j == r.label ? r.on : r.off)) : 0.f);
  }
  return out;
}

// A row read from memory as the stats and the gradient go: z 16-byte aligned with the
// row's stride a multiple of kPer<T> (vec: packs rank, rank + size, ...; four loads in
// flight), else one value at a time.
template <class T>
struct Streamed {
  const T* z;
  int64_t classes;
  bool vec;
  // One pass: each thread's (m, s) rescaled as its maximum grows, then merged over the group.
  template <class G, bool WithSum, bool Find>
  __device__ void stats(const G& g, float& m, float& s, float& zsum, int64_t& first) const {
    if (!vec) {
      stats_scalar<WithSum, Find>(z, classes, g.rank(), g.size(), m, s, zsum, first);
    } else {
      const auto* zv = reinterpret_cast<const Pack<T>*>(z);
#pragma unroll 4
      for (int64_t c = g.rank(); c < (classes + kPer<T> - 1) / kPer<T>; c += g.size()) {
        float v[kPer<T>];
        unpack<WithSum>(zv[c], c, classes, v, zsum);  // int64_t
        lse_add_pack<Find>(m, s, v, c * kPer<T>, first);
      }
    }
    g.template lse<Find>(m, s, first);
    if constexpr (WithSum) zsum = g.sum(zsum);
  }
};

// The largest value of a pack, padding columns (from `classes` on) left out; a NaN is
// passed over (fmaxf's rule: its term then makes the sum NaN). 16-bit values compared in
// pairs where the pack has no padding.
template <class T, class I>
__device__ inline float pack_max(const Pack<T>& p, I c, I classes) {
  if constexpr (sizeof(T) == 2) {
    if ((c + 1) * kPer<T> <= classes) {
      using T2 = std::conditional_t<std::is_same_v<T, bf16_t>, __nv_bfloat162, __half2>;
      const T2* v = reinterpret_cast<const T2*>(p.v);
      const T2 h = __hmax2(__hmax2(v[0], v[1]), __hmax2(v[2], v[3]));
      const T* two = reinterpret_cast<const T*>(&h);
      return fmaxf(to_float(two[0]), to_float(two[1]));
    }
  }
  float v[kPer<T>], unused = 0.f;
  unpack<false>(p, c, classes, v, unused);
  float mx = v[0];
#pragma unroll
  for (int k = 1; k < kPer<T>; ++k) mx = fmaxf(mx, v[k]);
  return mx;
}

// A row staged in shared memory (16-byte packs, `packs` of them, the whole stride) by
// the block before it is used: the stats and the gradient read it there, so the row is
// read from memory once, and the next row's copy runs while this one is computed.
template <class T>
struct Staged {
  const Pack<T>* s;
  int classes, packs;
  // Two passes over the staged row: its maximum m (and the pack where each thread first
  // met its own), then the terms exp(v - m), which need no rescaling. In one pass (as
  // Streamed) nearly every pack rescaled, since some lane of a warp meets a new maximum:
  // the rescale, the first index's search and the merges' exponentials were over half the
  // loss kernel's instructions (Nsight Compute, W6 on an H100).
  template <class G, bool WithSum, bool Find>
  __device__ void stats(const G& g, float& m, float& sum, float& zsum, int64_t& first) const {
    float mine = -INFINITY;
    int at = -1;  // the first pack holding mine
    for (int c = g.rank(); c < packs; c += g.size()) {
      const Pack<T> p = s[c];  // one 16-byte load (through a reference: a load per value)
      const float pm = pack_max(p, c, classes);
      if (pm > mine) {
        mine = pm;
        at = c;
      }
    }
    m = g.max(mine);
    int index = INT32_MAX;  // the row's first column holding m, if this thread holds it
    if (Find && at >= 0 && mine == m) {
      float v[kPer<T>], unused = 0.f;
      unpack<false>(s[at], at, classes, v, unused);
#pragma unroll
      for (int k = kPer<T> - 1; k >= 0; --k)
        if (v[k] == m) index = at * kPer<T> + k;
    }
    float part = 0.f;
    if (isfinite(m)) {
      const float ml = m * kLog2e;
      for (int c = g.rank(); c < packs; c += g.size()) {
        const Pack<T> p = s[c];
        float v[kPer<T>], e[kPer<T>];
        unpack<WithSum>(p, c, classes, v, zsum);
#pragma unroll
        for (int k = 0; k < kPer<T>; ++k) e[k] = fast_exp2(fmaf(v[k], kLog2e, -ml));  // -inf: 0
#pragma unroll
        for (int w = 1; w < kPer<T>; w *= 2)
#pragma unroll
          for (int k = 0; k + w < kPer<T>; k += 2 * w) e[k] = __fadd_rn(e[k], e[k + w]);
        part = __fadd_rn(part, e[0]);
      }
    } else {  // every value -inf or NaN (m = -inf), or m = +inf (the sum NaN: row_stats)
      for (int c = g.rank(); c < packs; c += g.size()) {
        const Pack<T> p = s[c];
        float v[kPer<T>];
        unpack<WithSum>(p, c, classes, v, zsum);
#pragma unroll
        for (int k = 0; k < kPer<T>; ++k)
          part = __fadd_rn(part, v[k] == -INFINITY ? 0.f : expf(v[k] - m));
      }
    }
    g.template sums<WithSum, Find>(part, zsum, index);
    sum = part;
    if constexpr (Find) first = index == INT32_MAX ? INT64_MAX : index;
  }
  __device__ void grad(T* d, int rank, int size, const GradRow& r) const {
    auto* dv = reinterpret_cast<Pack<T>*>(d);
    const PackBounds<T, int> pb(r);
    for (int c = rank; c < packs; c += size) {
      const Pack<T> p = s[c];
      dv[c] = grad_pack(p, c, r, pb);
    }
  }
  __device__ float at(int j) const { return to_float(reinterpret_cast<const T*>(s)[j]); }
};

// The row's max m and sum(exp(z - m)) (and sum(z) when wanted; the first index of m, its
// argmax, with Find), known to every thread of the group; one read of the row (src:
// Streamed or Staged).
template <class G, bool WithSum, bool Find, class Src>
__device__ void row_stats(const G& g, const Src& src, float& m, float& s, float& zsum, int64_t& first) {
  m = -INFINITY;
  s = 0.f;
  zsum = 0.f;
  first = INT64_MAX;
  src.template stats<G, WithSum, Find>(g, m, s, zsum, first);
  // A +inf logit: the CPU's (and PyTorch's) log-sum-exp shifted by the maximum is then
  // inf - inf, so the row's loss and every value of its gradient are NaN here too.
  if (m == INFINITY) s = NAN;
}

// A counting row's stats (known to every thread of the group) and its loss:
// (1 - eps) * -log p[label] + eps * mean_c(-log p[c]), with -log p[c] = m + log(s) - z[c].
// zl: the label's logit, read by the caller before the group's first barrier (the fused
// loss may write the gradient over the row right after it).
template <class G, bool Find, class Src>
__device__ double row_loss_of(const G& g, const Src& src, float zl, double smoothing, float& m, float& s,
                              int64_t& first) {
  float zsum;
  if (smoothing != 0.0) row_stats<G, true, Find>(g, src, m, s, zsum, first);
  else row_stats<G, false, Find>(g, src, m, s, zsum, first);
  const double ls = log(static_cast<double>(s));
  const double nll = static_cast<double>(m - zl) + ls;
  const double smooth = static_cast<double>(m) - static_cast<double>(zsum) / static_cast<double>(src.classes) + ls;
  return (1.0 - smoothing) * nll + smoothing * smooth;
}

// dlogits of a counting row whose stats are m, s, read from memory again: sc *
// (softmax(z) - target), target = (1 - eps) * onehot(label) + eps / C, in float as
// PyTorch computes it (p - target is exact where p is near the target); 0 in the padding
// columns [classes, stride). A thread writes only elements it reads (in place is safe).
template <class G, class T>
__device__ void row_grad(const G& g, const T* z, T* d, int64_t stride, bool vec, const GradRow& r) {
  if (vec) {
    const auto* zv = reinterpret_cast<const Pack<T>*>(z);
    auto* dv = reinterpret_cast<Pack<T>*>(d);
    const PackBounds<T, int64_t> pb(r);
    for (int64_t c = g.rank(); c < stride / kPer<T>; c += g.size()) dv[c] = grad_pack(zv[c], c, r, pb);
    return;
  }
#pragma unroll 4
  for (int64_t c = g.rank(); c < r.classes; c += g.size()) {
    const float p = r.term(to_float(z[c])) * r.inv_s;
    d[c] = from_float<T>(r.scf * (p - (c == r.label ? r.on : r.off)));
  }
  for (int64_t c = r.classes + g.rank(); c < stride; c += g.size()) d[c] = from_float<T>(0.f);
}

// The gradient row of a row that does not count.
template <class G, class T>
__device__ void zero_row(const G& g, T* __restrict__ d, int64_t classes) {
  for (int64_t c = g.rank(); c < classes; c += g.size()) d[c] = from_float<T>(0.f);
}

}  // namespace seam::cuda::ce
