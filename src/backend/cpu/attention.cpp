// The CPU reference of attention and its gradient (src/ops/attention.cpp): the plain
// algorithm, each query row's scores, softmax and weighted sum in double, rows over the
// cores; the gradient one (batch, head) per task, so that dk and dv gather their sums
// over the queries without sharing.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/parallel.h"
#include "common/philox.h"

namespace seam::cpu {

namespace {

struct Dims {
  int64_t bh, tq, tk, d, dv;
  double scale;
  bool causal;
  double drop;  // 0 outside training
  uint32_t stream;
  uint64_t seed, step;
  // The factor of probability j of row r (= bh * Tq + i): 0 where dropped, else 1 / (1 - p).
  double keep(int64_t r, int64_t j) const {
    if (drop == 0) return 1.0;
    const auto index = static_cast<uint64_t>(r * tk + j);
    return dropout_uniform(seed, step, stream, index) >= static_cast<float>(drop) ? 1.0 / (1.0 - drop) : 0.0;
  }
};

Dims dims_of(const KernelArgs& a, const Shape& q, const Shape& v) {
  Dims m{q[0] * q[1], q[2], v[2], q[3], v[3], a.attrs().f("scale"), a.attrs().i("causal") != 0,
         a.attrs().i("training") != 0 ? a.attrs().f("dropout") : 0.0, static_cast<uint32_t>(a.attrs().i("stream")),
         a.state.seed, static_cast<uint64_t>(a.state.step)};
  if (m.scale == 0) m.scale = 1.0 / std::sqrt(static_cast<double>(m.d));
  return m;
}

// The keys query i sees: [0, Tk), or [0, i] when causal.
int64_t keys_of(const Dims& m, int64_t i) { return m.causal ? i + 1 : m.tk; }

// Row i's scaled scores against every key it sees.
template <class T>
void scores(const Dims& m, const T* q, const T* k, int64_t i, std::vector<double>& s) {
  const int64_t n = keys_of(m, i);
  s.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int64_t e = 0; e < m.d; ++e) dot += static_cast<double>(q[i * m.d + e]) * static_cast<double>(k[j * m.d + e]);
    s[static_cast<size_t>(j)] = m.scale * dot;
  }
}

// inputs q, k, v; outputs o, lse.
void attention(const KernelArgs& a) {
  const Dims m = dims_of(a, a.in[0].shape(), a.in[2].shape());
  dispatch_float(a.in[0].dtype(), [&]<class T>() {
    parallel_for(m.bh * m.tq, 16, [&](int64_t r0, int64_t r1) {
      std::vector<double> s, acc(static_cast<size_t>(m.dv));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t bh = r / m.tq, i = r % m.tq;
        const T* q = a.in[0].as<T>() + bh * m.tq * m.d;
        const T* k = a.in[1].as<T>() + bh * m.tk * m.d;
        const T* v = a.in[2].as<T>() + bh * m.tk * m.dv;
        scores(m, q, k, i, s);
        const double mx = *std::max_element(s.begin(), s.end());
        double l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (size_t j = 0; j < s.size(); ++j) {
          const double p = std::exp(s[j] - mx);
          l += p;
          const double pd = p * m.keep(r, static_cast<int64_t>(j));
          for (int64_t e = 0; e < m.dv; ++e) acc[static_cast<size_t>(e)] += pd * static_cast<double>(v[static_cast<int64_t>(j) * m.dv + e]);
        }
        T* o = a.out[0].as<T>() + r * m.dv;
        for (int64_t e = 0; e < m.dv; ++e) o[e] = static_cast<T>(acc[static_cast<size_t>(e)] / l);
        a.out[1].as<T>()[r] = static_cast<T>(mx + std::log(l));
      }
    });
  });
}

// inputs do, q, k, v, o, lse; outputs dq, dk, dv. With p = exp(s - lse) recomputed, its
// dropout factors f (1 without dropout) and dp = f * (do v^T): dv = (f p)^T do,
// ds = p * (dp - rowsum(p * dp)), dq = scale ds k, dk = scale ds^T q. rowsum(p * dp)
// equals rowsum(do * o); it is taken from p and dp here, so that the reference does not
// lean on o's rounding.
void attention_grad(const KernelArgs& a) {
  const Dims m = dims_of(a, a.in[1].shape(), a.in[3].shape());
  dispatch_float(a.in[1].dtype(), [&]<class T>() {
    parallel_for(m.bh, 1, [&](int64_t b0, int64_t b1) {
      std::vector<double> s, dp, dk(static_cast<size_t>(m.tk * m.d)), dv(static_cast<size_t>(m.tk * m.dv)),
          dq(static_cast<size_t>(m.d));
      for (int64_t bh = b0; bh < b1; ++bh) {
        const T* dO = a.in[0].as<T>() + bh * m.tq * m.dv;
        const T* q = a.in[1].as<T>() + bh * m.tq * m.d;
        const T* k = a.in[2].as<T>() + bh * m.tk * m.d;
        const T* v = a.in[3].as<T>() + bh * m.tk * m.dv;
        const T* lse = a.in[5].as<T>() + bh * m.tq;
        std::fill(dk.begin(), dk.end(), 0.0);
        std::fill(dv.begin(), dv.end(), 0.0);
        for (int64_t i = 0; i < m.tq; ++i) {
          scores(m, q, k, i, s);
          const size_t n = s.size();
          dp.resize(n);
          double rowsum = 0;
          for (size_t j = 0; j < n; ++j) {
            s[j] = std::exp(s[j] - static_cast<double>(lse[i]));  // now p
            double dot = 0;
            for (int64_t e = 0; e < m.dv; ++e)
              dot += static_cast<double>(dO[i * m.dv + e]) * static_cast<double>(v[static_cast<int64_t>(j) * m.dv + e]);
            dp[j] = dot * m.keep(bh * m.tq + i, static_cast<int64_t>(j));
            rowsum += s[j] * dp[j];
          }
          std::fill(dq.begin(), dq.end(), 0.0);
          for (size_t j = 0; j < n; ++j) {
            const auto jj = static_cast<int64_t>(j);
            const double ds = m.scale * s[j] * (dp[j] - rowsum);
            const double pd = s[j] * m.keep(bh * m.tq + i, jj);
            for (int64_t e = 0; e < m.dv; ++e) dv[static_cast<size_t>(jj * m.dv + e)] += pd * static_cast<double>(dO[i * m.dv + e]);
            for (int64_t e = 0; e < m.d; ++e) {
              dq[static_cast<size_t>(e)] += ds * static_cast<double>(k[jj * m.d + e]);
              dk[static_cast<size_t>(jj * m.d + e)] += ds * static_cast<double>(q[i * m.d + e]);
            }
          }
          T* out = a.out[0].as<T>() + (bh * m.tq + i) * m.d;
          for (int64_t e = 0; e < m.d; ++e) out[e] = static_cast<T>(dq[static_cast<size_t>(e)]);
        }
        T* dk_out = a.out[1].as<T>() + bh * m.tk * m.d;
        T* dv_out = a.out[2].as<T>() + bh * m.tk * m.dv;
        for (size_t e = 0; e < dk.size(); ++e) dk_out[e] = static_cast<T>(dk[e]);
        for (size_t e = 0; e < dv.size(); ++e) dv_out[e] = static_cast<T>(dv[e]);
      }
    });
  });
}

// The packed layout's head rows and the plain one's: row (b, t, k, h) of x [B, T, S, H, D]
// against row (b, h, t) of slab k of [S, B, H, T, D]; D elements each.
void move_heads(std::byte* packed, std::byte* slabs, const Shape& s, size_t esize, bool to_slabs) {
  const int64_t B = s[0], T = s[1], S = s[2], H = s[3];
  const size_t row = static_cast<size_t>(s[4]) * esize;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < S; ++k)
        for (int64_t h = 0; h < H; ++h) {
          std::byte* p = packed + static_cast<size_t>(((b * T + t) * S + k) * H + h) * row;
          std::byte* q = slabs + static_cast<size_t>(((k * B + b) * H + h) * T + t) * row;
          if (to_slabs) std::memcpy(q, p, row);
          else std::memcpy(p, q, row);
        }
}

// The plain kernels' operands of a packed step: each [B, T, S, H, D] tensor moved to S
// slabs of [B, H, T, D] (and back for outputs). The reference's copies are O(B T C),
// its work O(B T^2 C).
struct Slabs {
  std::vector<std::byte> bytes;
  Shape shape;  // the packed one
  DType dtype;
  Slabs(const TensorView& x, bool fill) : shape(x.shape()), dtype(x.dtype()) {
    if (shape.size() == 4) shape = {shape[0], shape[1], 1, shape[2], shape[3]};  // o [B, T, H, D]
    bytes.resize(static_cast<size_t>(x.numel()) * dtype_size(dtype));
    if (fill) move_heads(x.data, bytes.data(), shape, dtype_size(dtype), true);
  }
  TensorView slab(int64_t k) {
    const TensorType part{dtype, {shape[0], shape[3], shape[1], shape[4]}};
    return {bytes.data() + static_cast<size_t>(k * part.numel()) * dtype_size(dtype), part};
  }
  void store(const TensorView& x) { move_heads(x.data, bytes.data(), shape, dtype_size(dtype), false); }
};

// The packed ops: the plain kernels on qkv's slabs, o and dqkv moved back.
void attention_qkv(const KernelArgs& a) {
  Slabs qkv(a.in[0], true), o(a.out[0], false);
  const std::vector<TensorView> in{qkv.slab(0), qkv.slab(1), qkv.slab(2)}, out{o.slab(0), a.out[1]};
  attention({a.step, in, out, a.state});
  o.store(a.out[0]);
}

void attention_qkv_grad(const KernelArgs& a) {
  Slabs dout(a.in[0], true), qkv(a.in[1], true), o(a.in[2], true), dqkv(a.out[0], false);
  const std::vector<TensorView> in{dout.slab(0), qkv.slab(0), qkv.slab(1), qkv.slab(2), o.slab(0), a.in[3]};
  const std::vector<TensorView> out{dqkv.slab(0), dqkv.slab(1), dqkv.slab(2)};
  attention_grad({a.step, in, out, a.state});
  dqkv.store(a.out[0]);
}

}  // namespace

void register_attention(KernelTable& t) {
  set(t, Op::attention, attention);
  set(t, Op::attention_grad, attention_grad);
  set(t, Op::attention_qkv, attention_qkv);
  set(t, Op::attention_qkv_grad, attention_qkv_grad);
}

}  // namespace seam::cpu
