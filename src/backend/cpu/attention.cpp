// The CPU reference of attention and its gradient (src/ops/attention.cpp): the plain
// algorithm, each query row's scores, softmax and weighted sum in double, rows over the
// cores; the gradient one (batch, head) per task, so that dk and dv gather their sums
// over the queries without sharing.
#include <algorithm>
#include <cmath>
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

// qkv [3, B, H, T, D] as its three [B, H, T, D] slabs.
std::vector<TensorView> unpack(const TensorView& qkv) {
  const Shape& s = qkv.shape();
  const TensorType part{qkv.dtype(), {s[1], s[2], s[3], s[4]}};
  const auto bytes = static_cast<size_t>(part.numel()) * dtype_size(part.dtype);
  return {{qkv.data, part}, {qkv.data + bytes, part}, {qkv.data + 2 * bytes, part}};
}

// The packed ops: the same kernels on the slabs (one gradient tensor, written slab by slab).
void attention_qkv(const KernelArgs& a) {
  const std::vector<TensorView> in = unpack(a.in[0]);
  attention({a.step, in, a.out, a.state});
}

void attention_qkv_grad(const KernelArgs& a) {
  const std::vector<TensorView> qkv = unpack(a.in[1]), out = unpack(a.out[0]);
  const std::vector<TensorView> in{a.in[0], qkv[0], qkv[1], qkv[2], a.in[2], a.in[3]};
  attention_grad({a.step, in, out, a.state});
}

}  // namespace

void register_attention(KernelTable& t) {
  set(t, Op::attention, attention);
  set(t, Op::attention_grad, attention_grad);
  set(t, Op::attention_qkv, attention_qkv);
  set(t, Op::attention_qkv_grad, attention_qkv_grad);
}

}  // namespace seam::cpu
