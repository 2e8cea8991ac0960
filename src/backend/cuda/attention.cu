// attention and its gradient on the GPU (src/ops/attention.cpp): the plain kernels, one
// warp per row. The forward walks a query's keys once with the online softmax (running
// maximum, sum and weighted values rescaled as the maximum grows), so no [Tq, Tk] matrix
// is stored; the backward recomputes each probability from the saved log-sum-exp, one
// kernel per query row for dq (and rowsum(do * o)) and one per key row for dk and dv, so
// that no sum is shared between warps (no atomics; the same bits every run). Each lane
// keeps 1/32 of a row's D (and Dv) elements in registers: D and Dv up to kMaxHead.
// Storage f32, bf16 or f16, arithmetic in f32; lse f32. Dropout of the probabilities
// draws each (row, key) pair's Philox number as the CPU does (seed and step read from
// DeviceCounters when the kernel runs).
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_dropout.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/storage.cuh"
#include "common/philox.h"

namespace seam::cuda {

namespace {

constexpr int kThreads = 128;  // four rows a block
constexpr int kMaxHead = 256;
constexpr int kSlots = kMaxHead / 32;

struct Geom {
  int64_t bh, h, tq, tk, d, dv;
  Rows q, k, v, o;
  float scale;
  bool causal;
  float drop = 0.f;  // 0: none
  uint32_t stream = 0;
  const DeviceCounters* counters = nullptr;
};

// Lane `lane`'s share of a row of n elements at p: elements lane, lane + 32, ...
template <class T>
__device__ __forceinline__ void load_row(const T* p, int64_t n, int lane, float (&r)[kSlots]) {
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int64_t e = lane + 32 * s;
    r[s] = e < n ? to_float(p[e]) : 0.f;
  }
}

template <class T>
__device__ __forceinline__ void store_row(T* p, int64_t n, int lane, const float (&r)[kSlots]) {
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int64_t e = lane + 32 * s;
    if (e < n) p[e] = from_float<T>(r[s]);
  }
}

// f(row) for rows [0, n), one warp each (grid-stride over the warps).
template <class F>
__device__ __forceinline__ void each_warp_row(int64_t n, F&& f) {
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x >> 5);
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; r < n; r += warps) f(r);
}

template <class T>
__device__ __forceinline__ float dot_row(const float (&r)[kSlots], const T* p, int64_t n, int lane) {
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int64_t e = lane + 32 * s;
    if (e < n) acc = fmaf(r[s], to_float(p[e]), acc);
  }
  return warp_sum(acc);
}

template <class T>
__global__ void attention_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                              T* __restrict__ o, float* __restrict__ lse, Geom g) {
  const int lane = threadIdx.x & 31;
  const Keep keep(g);
  each_warp_row(g.bh * g.tq, [&](int64_t r) {
    const int64_t bh = r / g.tq, i = r % g.tq;
    const T* kb = k + g.k.at(bh, g.h);
    const T* vb = v + g.v.at(bh, g.h);
    float qr[kSlots], acc[kSlots] = {};
    load_row(q + g.q.at(bh, g.h) + i * g.q.row, g.d, lane, qr);
    float m = -INFINITY, l = 0.f;
    const int64_t keys = g.causal ? i + 1 : g.tk;
    for (int64_t j = 0; j < keys; ++j) {
      const float s = g.scale * dot_row(qr, kb + j * g.k.row, g.d, lane);
      const float mn = fmaxf(m, s);
      const float c = expf(m - mn), p = expf(s - mn), pd = p * keep(g, r, j);
      l = l * c + p;
#pragma unroll
      for (int t = 0; t < kSlots; ++t) {
        const int64_t e = lane + 32 * t;
        acc[t] = acc[t] * c + (e < g.dv ? pd * to_float(vb[j * g.v.row + e]) : 0.f);
      }
      m = mn;
    }
#pragma unroll
    for (int t = 0; t < kSlots; ++t) acc[t] /= l;
    store_row(o + g.o.at(bh, g.h) + i * g.o.row, g.dv, lane, acc);
    if (lane == 0) lse[r] = m + logf(l);
  });
}

// dq of query row r, and rowsum(do * o) into rows[r] for the key kernel.
template <class T>
__global__ void attention_bwd_q(const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                                const T* __restrict__ v, const T* __restrict__ o, const float* __restrict__ lse,
                                T* __restrict__ dq, float* __restrict__ rows, Geom g) {
  const int lane = threadIdx.x & 31;
  const Keep keep(g);
  each_warp_row(g.bh * g.tq, [&](int64_t r) {
    const int64_t bh = r / g.tq, i = r % g.tq;
    const T* kb = k + g.k.at(bh, g.h);
    const T* vb = v + g.v.at(bh, g.h);
    const int64_t qi = g.q.at(bh, g.h) + i * g.q.row, oi = g.o.at(bh, g.h) + i * g.o.row;
    float qr[kSlots], dor[kSlots], acc[kSlots] = {};
    load_row(q + qi, g.d, lane, qr);
    load_row(dout + oi, g.dv, lane, dor);
    const float rowsum = dot_row(dor, o + oi, g.dv, lane);
    const float li = lse[r];
    const int64_t keys = g.causal ? i + 1 : g.tk;
    for (int64_t j = 0; j < keys; ++j) {
      const float p = expf(g.scale * dot_row(qr, kb + j * g.k.row, g.d, lane) - li);
      const float ds = g.scale * p * (dot_row(dor, vb + j * g.v.row, g.dv, lane) * keep(g, r, j) - rowsum);
#pragma unroll
      for (int t = 0; t < kSlots; ++t) {
        const int64_t e = lane + 32 * t;
        if (e < g.d) acc[t] = fmaf(ds, to_float(kb[j * g.k.row + e]), acc[t]);
      }
    }
    store_row(dq + qi, g.d, lane, acc);
    if (lane == 0) rows[r] = rowsum;
  });
}

// dk and dv of key row c.
template <class T>
__global__ void attention_bwd_kv(const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                                 const T* __restrict__ v, const float* __restrict__ lse,
                                 const float* __restrict__ rows, T* __restrict__ dk, T* __restrict__ dv, Geom g) {
  const int lane = threadIdx.x & 31;
  const Keep keep(g);
  each_warp_row(g.bh * g.tk, [&](int64_t c) {
    const int64_t bh = c / g.tk, j = c % g.tk;
    const T* qb = q + g.q.at(bh, g.h);
    const T* db = dout + g.o.at(bh, g.h);
    const int64_t kj = g.k.at(bh, g.h) + j * g.k.row, vj = g.v.at(bh, g.h) + j * g.v.row;
    float kr[kSlots], vr[kSlots], dk_acc[kSlots] = {}, dv_acc[kSlots] = {};
    load_row(k + kj, g.d, lane, kr);
    load_row(v + vj, g.dv, lane, vr);
    for (int64_t i = g.causal ? j : 0; i < g.tq; ++i) {
      const int64_t r = bh * g.tq + i;
      const float p = expf(g.scale * dot_row(kr, qb + i * g.q.row, g.d, lane) - lse[r]), f = keep(g, r, j);
      const float ds = g.scale * p * (dot_row(vr, db + i * g.o.row, g.dv, lane) * f - rows[r]);
#pragma unroll
      for (int t = 0; t < kSlots; ++t) {
        const int64_t e = lane + 32 * t;
        if (e < g.dv) dv_acc[t] = fmaf(p * f, to_float(db[i * g.o.row + e]), dv_acc[t]);
        if (e < g.d) dk_acc[t] = fmaf(ds, to_float(qb[i * g.q.row + e]), dk_acc[t]);
      }
    }
    store_row(dk + kj, g.d, lane, dk_acc);
    store_row(dv + vj, g.dv, lane, dv_acc);
  });
}

void check_heads(const StepArgs& a, int64_t d, int64_t dv) {
  if (d > kMaxHead || dv > kMaxHead)
    fail(op_name(a.step.op), " '", a.step.name, "': head sizes up to ", kMaxHead, " on the GPU, got D = ", d,
         ", Dv = ", dv);
}

// The attributes' part of the geometry, with the default scale resolved.
void set_attrs(const StepArgs& a, AttentionGeom& g) {
  g.scale = static_cast<float>(a.step.attrs.f("scale"));
  if (g.scale == 0.f) g.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.d)));
  g.causal = a.step.attrs.i("causal") != 0;
  g.dropout = a.step.attrs.i("training") != 0 ? static_cast<float>(a.step.attrs.f("dropout")) : 0.f;
  g.stream = static_cast<uint32_t>(a.step.attrs.i("stream"));
  g.counters = a.ctx.counters;
}

// q, k, v (operands qi, qi + 1, qi + 2) checked: 4-d, one storage dtype, D and Dv within
// kMaxHead; each contiguous [B, H, T, D].
AttentionGeom geom_of(const StepArgs& a, size_t qi) {
  const Shape &q = a.in[qi].shape(), &k = a.in[qi + 1].shape(), &v = a.in[qi + 2].shape();
  for (size_t i = qi; i < qi + 3; ++i) {
    expect_dtype(a, a.in[i], kStored);
    if (a.in[i].shape().size() != 4 || a.in[i].dtype() != a.in[qi].dtype())
      fail(op_name(a.step.op), " '", a.step.name, "': q, k and v must be [B, H, T, D] of one dtype");
  }
  check_heads(a, q[3], v[3]);
  AttentionGeom g{q[0], q[1], q[2], k[2], q[3], v[3]};
  g.q = contiguous_rows(g.h, g.tq, g.d), g.k = contiguous_rows(g.h, g.tk, g.d);
  g.v = contiguous_rows(g.h, g.tk, g.dv), g.o = contiguous_rows(g.h, g.tq, g.dv);
  set_attrs(a, g);
  return g;
}

// qkv [B, T, 3, H, D] (q, k and v D elements apart within a token's row) and o [B, T, H, D].
AttentionGeom packed_geom(const StepArgs& a, const DeviceTensor& qkv) {
  expect_dtype(a, qkv, kStored);
  const Shape& s = qkv.shape();
  if (s.size() != 5 || s[2] != 3) fail(op_name(a.step.op), " '", a.step.name, "': qkv must be [B, T, 3, H, D]");
  check_heads(a, s[4], s[4]);
  AttentionGeom g{s[0], s[3], s[1], s[1], s[4], s[4]};
  const int64_t row = 3 * g.h * g.d;
  g.q = g.k = g.v = {g.tq * row, g.d, row};
  g.o = {g.tq * g.h * g.d, g.d, g.h * g.d};
  set_attrs(a, g);
  return g;
}

// q, k and v of a packed qkv tensor: one head's D elements apart.
void set_packed(AttentionBuffers& buf, const void* qkv, const AttentionGeom& g, DType t) {
  const auto* p = static_cast<const std::byte*>(qkv);
  const auto part = static_cast<size_t>(g.h * g.d) * dtype_size(t);
  buf.q = p, buf.k = p + part, buf.v = p + 2 * part;
}

Geom plain_geom(const AttentionGeom& g) {
  return {g.bh(), g.h, g.tq, g.tk, g.d, g.dv, g.q, g.k, g.v, g.o, g.scale, g.causal, g.dropout, g.stream, g.counters};
}

unsigned row_blocks(const StepArgs& a, int64_t rows) {
  return blocks_for((rows + kThreads / 32 - 1) / (kThreads / 32), 1, std::max(a.ctx.sm_count, 1) * 32);
}

// The variant cache's key: the pass, layout, shapes, precision, mask, scale and whether
// it drops.
std::string variant_key(const char* pass, DType t, const AttentionGeom& g, bool packed) {
  char scale[32];
  std::snprintf(scale, sizeof scale, "%.9g", g.scale);
  return std::string(pass) + (packed ? ":bt3hd:" : ":") + dtype_name(t) + ":b" + std::to_string(g.b) + "h" +
         std::to_string(g.h) + "q" + std::to_string(g.tq) + "k" + std::to_string(g.tk) + "d" + std::to_string(g.d) +
         "v" + std::to_string(g.dv) + (g.causal ? ":causal" : ":full") + ":s" + scale +
         (g.dropout > 0 ? ":dropout" : "");
}

// SEAM_ATTENTION=NAME or FORWARD,BACKWARD (cudnn, flash, gemm or plain) runs that variant
// instead of the fastest, for comparing them; a forced variant that cannot run this step
// is an error naming why.
std::string forced_variant(bool backward) {
  const char* env = std::getenv("SEAM_ATTENTION");
  if (!env || !*env) return {};
  const std::string v = env;
  const size_t comma = v.find(',');
  return comma == std::string::npos ? v : backward ? v.substr(comma + 1) : v.substr(0, comma);
}

Launch choose_attention(const StepArgs& a, bool backward, const std::string& key, std::vector<Variant> variants) {
  const std::string forced = forced_variant(backward);
  if (forced.empty()) return choose_variant(a.ctx, a.index, key, std::move(variants));
  Launch kept;
  for (Variant& v : variants) {
    if (v.name != forced) {
      if (v.unused) v.unused();
      continue;
    }
    if (!v.launch)
      fail(op_name(a.step.op), " '", a.step.name, "': SEAM_ATTENTION asks for ", forced, ", which cannot run it: ",
           v.why_not);
    kept = v.launch;
  }
  if (!kept) fail("SEAM_ATTENTION: no attention variant '", forced, "' (cudnn, flash, gemm or plain)");
  a.ctx.choices.emplace_back(a.index, forced + " (forced by SEAM_ATTENTION)");
  return kept;
}

Variant cudnn_variant(const StepArgs& a, DType t, const AttentionGeom& g, const AttentionBuffers& buf, bool backward) {
  Variant v{"cudnn", {}};
  if (auto l = cudnn_attention(a, t, g, buf, backward, &v.why_not)) v.launch = *l;
  return v;
}

// rows: the backward's scratch for rowsum(do * o); null for the forward. The backward
// sums dq in the workspace with atomics unless the plan is deterministic.
Variant flash_variant(const StepArgs& a, DType t, const AttentionGeom& g, const AttentionBuffers& buf, float* rows) {
  Variant v{"flash", {}};
  v.why_not = flash_unavailable(t, g, buf);
  if (!v.why_not.empty()) return v;
  if (!rows) {
    v.launch = flash_forward(t, g, buf);
  } else if (a.ctx.deterministic) {
    v.launch = flash_backward(t, g, buf, rows, nullptr);
  } else {
    a.ctx.need_workspace(flash_dq_sums_bytes(g));
    v.launch = flash_backward(t, g, buf, rows, &a.ctx);
  }
  return v;
}

// Where a fused variant runs it never stores the [Tq, Tk] scores, and is faster than the
// GEMMs that do (cuDNN and the tiled kernels against cuBLASLt, bf16): the gemm variant,
// whose scores take workspace memory, is offered only where neither runs (or where
// SEAM_ATTENTION asks for it).
Variant gemm_variant(const StepArgs& a, DType t, const AttentionGeom& g, const AttentionBuffers& buf, bool backward,
                     const std::vector<Variant>& fused) {
  Variant v{"gemm", {}};
  for (const Variant& f : fused)
    if (f.launch && forced_variant(backward) != "gemm") {
      v.why_not = "the " + f.name + " variant runs this step without storing its scores";
      return v;
    }
  if (auto l = gemm_attention(a, t, g, buf, backward, &v.why_not)) v.launch = *l;
  return v;
}

// The forward (q, k, v -> out_o, out_lse) by the fastest variant.
Launch forward(const StepArgs& a, DType t, const AttentionGeom& ag, const AttentionBuffers& buf, bool packed) {
  const Geom g = plain_geom(ag);
  const unsigned blocks = row_blocks(a, g.bh * g.tq);
  Launch plain;
  dispatch_storage(t, op_name(a.step.op), [&]<class T>() {
    plain = [g, blocks, q = static_cast<const T*>(buf.q), k = static_cast<const T*>(buf.k),
             v = static_cast<const T*>(buf.v), o = static_cast<T*>(buf.out_o),
             lse = static_cast<float*>(buf.out_lse)](cudaStream_t s) {
      attention_fwd<T><<<blocks, kThreads, 0, s>>>(q, k, v, o, lse, g);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  std::vector<Variant> variants;
  variants.push_back(cudnn_variant(a, t, ag, buf, false));
  variants.push_back(flash_variant(a, t, ag, buf, nullptr));
  variants.push_back(gemm_variant(a, t, ag, buf, false, variants));
  variants.push_back({"plain", plain});
  return choose_attention(a, false, variant_key("attention", t, ag, packed), std::move(variants));
}

// The backward (dout, q, k, v, o, lse -> dq, dk, dv) by the fastest variant.
Launch backward(const StepArgs& a, DType t, const AttentionGeom& ag, const AttentionBuffers& buf, bool packed) {
  const Geom g = plain_geom(ag);
  auto* rows = static_cast<float*>(a.ctx.scratch(static_cast<size_t>(g.bh * g.tq) * sizeof(float)));
  const unsigned qblocks = row_blocks(a, g.bh * g.tq), kblocks = row_blocks(a, g.bh * g.tk);
  Launch plain;
  dispatch_storage(t, op_name(a.step.op), [&]<class T>() {
    plain = [g, qblocks, kblocks, rows, dout = static_cast<const T*>(buf.dout), q = static_cast<const T*>(buf.q),
             k = static_cast<const T*>(buf.k), v = static_cast<const T*>(buf.v), o = static_cast<const T*>(buf.o),
             lse = static_cast<const float*>(buf.lse), dq = static_cast<T*>(buf.dq), dk = static_cast<T*>(buf.dk),
             dv = static_cast<T*>(buf.dv)](cudaStream_t s) {
      attention_bwd_q<T><<<qblocks, kThreads, 0, s>>>(dout, q, k, v, o, lse, dq, rows, g);
      SEAM_CUDA_LAUNCH_CHECK();
      attention_bwd_kv<T><<<kblocks, kThreads, 0, s>>>(dout, q, k, v, lse, rows, dk, dv, g);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  std::vector<Variant> variants;
  variants.push_back(cudnn_variant(a, t, ag, buf, true));
  variants.push_back(flash_variant(a, t, ag, buf, rows));  // the plain kernels' row sums' scratch
  variants.push_back(gemm_variant(a, t, ag, buf, true, variants));
  variants.push_back({"plain", plain});
  return choose_attention(a, true, variant_key("attention_grad", t, ag, packed), std::move(variants));
}

// inputs q, k, v; outputs o, lse.
Launch prepare_attention(const StepArgs& a) {
  const AttentionGeom g = geom_of(a, 0);
  expect_dtype(a, a.out[1], {DType::f32});
  AttentionBuffers buf;
  buf.q = a.in[0].data, buf.k = a.in[1].data, buf.v = a.in[2].data;
  buf.out_o = a.out[0].data, buf.out_lse = a.out[1].data;
  return forward(a, a.in[0].dtype(), g, buf, false);
}

// inputs do, q, k, v, o, lse; outputs dq, dk, dv.
Launch prepare_attention_grad(const StepArgs& a) {
  const AttentionGeom g = geom_of(a, 1);
  expect_dtype(a, a.in[5], {DType::f32});
  AttentionBuffers buf;
  buf.dout = a.in[0].data, buf.q = a.in[1].data, buf.k = a.in[2].data, buf.v = a.in[3].data;
  buf.o = a.in[4].data, buf.lse = a.in[5].data;
  buf.dq = a.out[0].data, buf.dk = a.out[1].data, buf.dv = a.out[2].data;
  return backward(a, a.in[1].dtype(), g, buf, false);
}

// The packed ops: the same variants, reading q, k and v where the fused projection wrote
// them and writing o (and dqkv) where the output projection (and its gradient) read them.
// input qkv; outputs o, lse.
Launch prepare_attention_qkv(const StepArgs& a) {
  const AttentionGeom g = packed_geom(a, a.in[0]);
  const DType t = a.in[0].dtype();
  expect_dtype(a, a.out[1], {DType::f32});
  AttentionBuffers buf;
  set_packed(buf, a.in[0].data, g, t);
  buf.out_o = a.out[0].data, buf.out_lse = a.out[1].data;
  return forward(a, t, g, buf, true);
}

// inputs do, qkv, o, lse; output dqkv.
Launch prepare_attention_qkv_grad(const StepArgs& a) {
  const AttentionGeom g = packed_geom(a, a.in[1]);
  const DType t = a.in[1].dtype();
  expect_dtype(a, a.in[3], {DType::f32});
  AttentionBuffers buf, grad;
  set_packed(buf, a.in[1].data, g, t);
  set_packed(grad, a.out[0].data, g, t);
  buf.dout = a.in[0].data, buf.o = a.in[2].data, buf.lse = a.in[3].data;
  buf.dq = const_cast<void*>(grad.q), buf.dk = const_cast<void*>(grad.k), buf.dv = const_cast<void*>(grad.v);
  return backward(a, t, g, buf, true);
}

}  // namespace

void register_attention(PreparerTable& t) {
  set(t, Op::attention, prepare_attention);
  set(t, Op::attention_grad, prepare_attention_grad);
  set(t, Op::attention_qkv, prepare_attention_qkv);
  set(t, Op::attention_qkv_grad, prepare_attention_qkv_grad);
}

}  // namespace seam::cuda
