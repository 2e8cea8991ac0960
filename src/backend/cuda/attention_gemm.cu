// attention's gemm variant (attention.h): the products on cuBLASLt, the scores between
// them stored. Forward: S = Q K^T, a softmax kernel (scale, causal mask, lse, dropout) that
// writes P, O = P V. Backward: S again, dP = dO V^T, a kernel that writes P (dropped) and
// dS = scale P (dP - rowsum(dO o)), then dV = P^T dO, dQ = dS K, dK = dS^T Q.
//
// Where the fused variants do not run (f32 storage, TF32 or exact, and head sizes their
// kernels lack), this is what runs at GEMM speed: the plain kernels do each product one
// warp-wide dot at a time. The [Tq, Tk] matrices live in the lane's workspace, past
// cuBLASLt's own part, a chunk of heads at a time so that a matrix takes at most
// kChunkBytes; S and dP are f32, P and dS the storage type (aliasing S and dP in f32).
// The softmax kernels take one warp per row and read the row from L2 two or three times.
#include <cmath>
#include <map>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_dropout.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/gemm.h"
#include "backend/cuda/storage.cuh"
#include "common/philox.h"

namespace seam::cuda {

namespace {

constexpr int kThreads = 128;
constexpr size_t kChunkBytes = size_t{64} << 20;   // one f32 [heads, Tq, Tk] matrix of a chunk
constexpr size_t kHeadLimit = size_t{256} << 20;   // one head's: beyond it, not offered

// The heads of the step as `groups` runs of `heads` with uniform strides: all B * H at
// once where each operand's batch stride is H head strides (contiguous [B, H, T, D]),
// else each batch's H (the packed [B, T, 3, H, D]).
struct Layout {
  int64_t groups, heads;
  int64_t ld;          // row pitch of the score matrices: Tk rounded up to 8 elements
  int64_t chunk;       // heads a chunk
};

bool uniform(const Rows& r, int64_t h) { return r.batch == h * r.head; }

// What the row kernels need of a step: the score matrices' sizes and row stride.
struct RowGeom {
  int64_t tq, tk, ld;
  float scale;
  bool causal;
  float drop;
  uint32_t stream;
  const DeviceCounters* counters;
};

// f(rc, i, keys) for rows rc in [0, rows) of a chunk, one warp each: i the query, keys
// the number it sees.
template <class F>
__device__ __forceinline__ void each_row(const RowGeom& g, int64_t rows, F&& f) {
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x >> 5);
  for (int64_t rc = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; rc < rows; rc += warps) {
    const int64_t i = rc % g.tq;
    f(rc, i, g.causal && i + 1 < g.tk ? i + 1 : g.tk);
  }
}

// Rows [0, rows) of a chunk whose first head is bh0: S (f32) -> P (T), lse. A row r of
// the step (r = bh0 * Tq + rc) is what lse and the masks count.
template <class T>
__global__ void softmax_rows(const float* s, T* p, float* __restrict__ lse, int64_t bh0, int64_t rows,
                             RowGeom g) {
  const int lane = threadIdx.x & 31;
  const Keep keep(g);
  each_row(g, rows, [&](int64_t rc, int64_t, int64_t keys) {
    const int64_t r = bh0 * g.tq + rc;
    const float* sr = s + rc * g.ld;
    float m = -INFINITY;
    for (int64_t j = lane; j < keys; j += 32) m = fmaxf(m, g.scale * sr[j]);
    m = warp_max(m);
    float l = 0.f;
    for (int64_t j = lane; j < keys; j += 32) l += expf(g.scale * sr[j] - m);
    l = warp_sum(l);
    const float lr = m + logf(l);
    __syncwarp();  // in f32 P is S: every lane has read its row before any writes
    T* pr = p + rc * g.ld;
    for (int64_t j = lane; j < g.tk; j += 32)
      pr[j] = from_float<T>(j < keys ? expf(g.scale * sr[j] - lr) * keep(g, r, j) : 0.f);
    if (lane == 0) lse[r] = lr;
  });
}

// The backward's rows: S, dP (f32) -> P dropped and dS (T). The row's sum of P dP is
// taken from the row itself, not as rowsum(dO o) from the stored output as flash kernels
// must: the same P then enters the sum and each dS, so dS sums to 0 over the row to f32
// rounding, and dQ, which that sum cancels, keeps f32's relative error.
template <class T>
__global__ void softmax_grad_rows(const float* s, const float* dp, T* p, T* ds, const float* __restrict__ lse,
                                  int64_t bh0, int64_t rows, RowGeom g) {
  const int lane = threadIdx.x & 31;
  const Keep keep(g);
  each_row(g, rows, [&](int64_t rc, int64_t, int64_t keys) {
    const int64_t r = bh0 * g.tq + rc;
    const float lr = lse[r];
    const float *sr = s + rc * g.ld, *dpr = dp + rc * g.ld;
    float rowsum = 0.f;
    for (int64_t j = lane; j < keys; j += 32) rowsum = fmaf(expf(g.scale * sr[j] - lr) * keep(g, r, j), dpr[j], rowsum);
    rowsum = warp_sum(rowsum);
    T *pr = p + rc * g.ld, *dsr = ds + rc * g.ld;
    for (int64_t j = lane; j < g.tk; j += 32) {
      const float pv = j < keys ? expf(g.scale * sr[j] - lr) : 0.f, f = keep(g, r, j);
      const float dsv = g.scale * pv * (dpr[j] * f - rowsum);
      pr[j] = from_float<T>(pv * f);  // in f32 p is s and ds is dp: each element read, then written, by one lane
      dsr[j] = from_float<T>(dsv);
    }
  });
}

// Where the score matrices lie in a workspace.
struct Places {
  size_t part, narrow;
  bool wide;
  int mats;
  struct At {
    float *s, *dp;
    void *p, *ds;
  };
  At operator()(void* ws) const {
    auto* base = static_cast<std::byte*>(ws) + kGemmWorkspaceBytes;
    At r{};
    r.s = reinterpret_cast<float*>(base);
    r.dp = reinterpret_cast<float*>(base + part);
    std::byte* rest = base + static_cast<size_t>(mats) * part;
    r.p = wide ? static_cast<void*>(r.s) : static_cast<void*>(rest);
    r.ds = wide ? static_cast<void*>(r.dp) : static_cast<void*>(rest + narrow);
    return r;
  }
};

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Element offset of head `hh` of group `gi` in an operand with strides r.
int64_t head_at(const Rows& r, const Layout& l, int64_t gi, int64_t hh) {
  return l.groups == 1 ? hh * r.head : gi * r.batch + hh * r.head;
}

const std::byte* at(const void* p, int64_t elems, size_t size) {
  return static_cast<const std::byte*>(p) + elems * static_cast<int64_t>(size);
}

// One batched product: m, n, k, op(A), op(B), their lds and batch strides (elements).
GemmShape product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                  int64_t batch, int64_t sa, int64_t sb, int64_t sc, DType ab, DType d) {
  GemmShape s;
  s.trans_a = ta, s.trans_b = tb, s.m = m, s.n = n, s.k = k, s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  s.batch = batch, s.stride_a = sa, s.stride_b = sb, s.stride_c = sc, s.ab_type = ab, s.d_type = d;
  return s;
}

}  // namespace

std::optional<Launch> gemm_attention(const StepArgs& a, DType t, const AttentionGeom& g, const AttentionBuffers& buf,
                                     bool backward, std::string* why) {
  const bool flat = uniform(g.q, g.h) && uniform(g.k, g.h) && uniform(g.v, g.h) && uniform(g.o, g.h);
  Layout l{flat ? 1 : g.b, flat ? g.bh() : g.h, round_up(g.tk, 8), 0};
  const size_t head_bytes = static_cast<size_t>(g.tq * l.ld) * sizeof(float);
  if (head_bytes > kHeadLimit) {
    *why = "one head's scores take " + std::to_string(head_bytes >> 20) + " MiB, over the " +
           std::to_string(kHeadLimit >> 20) + " MiB the gemm variant allows";
    return std::nullopt;
  }
  l.chunk = std::min<int64_t>(l.heads, std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / head_bytes)));
  const size_t es = dtype_size(t);
  const bool wide = t == DType::f32;  // P and dS alias S and dP
  const size_t part = (static_cast<size_t>(l.chunk) * head_bytes + 255) / 256 * 256;  // an f32 matrix
  const size_t narrow = (static_cast<size_t>(l.chunk * g.tq * l.ld) * es + 255) / 256 * 256;
  // Workspace: cuBLASLt's part, S (and dP), then P (and dS) where they do not alias.
  const int mats = backward ? 2 : 1;
  const size_t need = kGemmWorkspaceBytes + mats * part + (wide ? 0 : mats * narrow);
  a.ctx.need_workspace(need);
  const Places places{part, narrow, wide, mats};
  const int64_t sl = g.tq * l.ld;  // batch stride of the score matrices
  const DType f32 = DType::f32;
  // Each chunk size's products, prepared on the workspace as it is now (tuning's samples).
  // The operands of each product for the chunk of heads [h0, h0 + n) of group gi, with the
  // score matrices at w.
  struct Operands {
    GemmOperands s, o, dp, dv, dq, dk;
  };
  auto operands = [buf, l, g, es](int64_t gi, int64_t h0, const Places::At& w) {
    auto in = [&](const void* p, const Rows& r) { return at(p, head_at(r, l, gi, h0), es); };
    auto out = [&](void* p, const Rows& r) { return const_cast<std::byte*>(at(p, head_at(r, l, gi, h0), es)); };
    const auto *q = in(buf.q, g.q), *k = in(buf.k, g.k), *v = in(buf.v, g.v);
    Operands o;
    o.s = {k, q, w.s};
    if (buf.out_o) o.o = {v, w.p, out(buf.out_o, g.o)};
    if (buf.dout) {
      const auto* dout = in(buf.dout, g.o);
      o.dp = {v, dout, w.dp};
      o.dv = {dout, w.p, out(buf.dv, g.v)};
      o.dq = {k, w.ds, out(buf.dq, g.q)};
      o.dk = {q, w.ds, out(buf.dk, g.k)};
    }
    return o;
  };
  struct Products {
    GemmRun s, o, dp, dv, dq, dk;
  };
  std::map<int64_t, Products> runs;
  const Places::At w0 = places(a.ctx.workspace());
  const std::string what = op_name(a.step.op) + std::string(" '") + a.step.name + "'";
  // Each chunk size's products, tuned on every chunk of that size (their alignments).
  auto products_for = [&](int64_t n) {
    std::vector<GemmOperands> cs, co, cdp, cdv, cdq, cdk;
    for (int64_t gi = 0; gi < l.groups; ++gi)
      for (int64_t h0 = 0; h0 < l.heads; h0 += l.chunk)
        if (std::min(l.chunk, l.heads - h0) == n) {
          const Operands o = operands(gi, h0, w0);
          cs.push_back(o.s), co.push_back(o.o), cdp.push_back(o.dp);
          cdv.push_back(o.dv), cdq.push_back(o.dq), cdk.push_back(o.dk);
        }
    Products pr;
    // S^T [Tk, Tq] (column-major) = K (as [D, Tk], transposed) times Q ([D, Tq]).
    pr.s = prepare_gemm_run(a.ctx, product(true, false, g.tk, g.tq, g.d, g.k.row, g.q.row, l.ld, n, g.k.head,
                                           g.q.head, sl, t, f32),
                            cs, what + " S = Q K^T");
    if (!backward) {
      pr.o = prepare_gemm_run(a.ctx, product(false, false, g.dv, g.tq, g.tk, g.v.row, l.ld, g.o.row, n, g.v.head, sl,
                                             g.o.head, t, t),
                              co, what + " O = P V");
    } else {
      pr.dp = prepare_gemm_run(a.ctx, product(true, false, g.tk, g.tq, g.dv, g.v.row, g.o.row, l.ld, n, g.v.head,
                                              g.o.head, sl, t, f32),
                               cdp, what + " dP = dO V^T");
      pr.dv = prepare_gemm_run(a.ctx, product(false, true, g.dv, g.tk, g.tq, g.o.row, l.ld, g.v.row, n, g.o.head, sl,
                                              g.v.head, t, t),
                               cdv, what + " dV = P^T dO");
      pr.dq = prepare_gemm_run(a.ctx, product(false, false, g.d, g.tq, g.tk, g.k.row, l.ld, g.q.row, n, g.k.head, sl,
                                              g.q.head, t, t),
                               cdq, what + " dQ = dS K");
      pr.dk = prepare_gemm_run(a.ctx, product(false, true, g.d, g.tk, g.tq, g.q.row, l.ld, g.k.row, n, g.q.head, sl,
                                              g.k.head, t, t),
                               cdk, what + " dK = dS^T Q");
    }
    runs.emplace(n, std::move(pr));
  };
  products_for(l.chunk);
  if (l.heads % l.chunk) products_for(l.heads % l.chunk);

  const RowGeom rg{g.tq, g.tk, l.ld, g.scale, g.causal, g.dropout, g.stream, g.counters};
  const int sms = std::max(a.ctx.sm_count, 1);
  Context* ctx = &a.ctx;
  Launch launch;
  dispatch_storage(t, op_name(a.step.op), [&]<class T>() {
    launch = [=, runs = std::move(runs)](cudaStream_t st) {
      SEAM_ASSERT(ctx->workspace_size() >= need);  // the lane's, sized for this step when it was prepared
      const auto w = places(ctx->workspace());
      for (int64_t gi = 0; gi < l.groups; ++gi)
        for (int64_t h0 = 0; h0 < l.heads; h0 += l.chunk) {
          const int64_t n = std::min(l.chunk, l.heads - h0), bh0 = gi * l.heads + h0, rows = n * g.tq;
          const Products& pr = runs.at(n);
          const Operands o = operands(gi, h0, w);
          const unsigned blocks = blocks_for((rows + kThreads / 32 - 1) / (kThreads / 32), 1, sms * 16);
          pr.s(o.s, st);
          if (!backward) {
            softmax_rows<T><<<blocks, kThreads, 0, st>>>(w.s, static_cast<T*>(w.p), static_cast<float*>(buf.out_lse),
                                                         bh0, rows, rg);
            SEAM_CUDA_LAUNCH_CHECK();
            pr.o(o.o, st);
            continue;
          }
          pr.dp(o.dp, st);
          softmax_grad_rows<T><<<blocks, kThreads, 0, st>>>(
              w.s, w.dp, static_cast<T*>(w.p), static_cast<T*>(w.ds), static_cast<const float*>(buf.lse), bh0, rows,
              rg);
          SEAM_CUDA_LAUNCH_CHECK();
          pr.dv(o.dv, st);
          pr.dq(o.dq, st);
          pr.dk(o.dk, st);
        }
    };
  });
  return launch;
}

}  // namespace seam::cuda
