// CUDA kernels of the elementwise ops, generated from the expressions in seam/ops.def
// exactly as the CPU reference (src/backend/cpu/elementwise.cpp) generates its loops.
// Every operand has one storage type T (f32, bf16, f16 or f64, storage.cuh); values are
// computed in compute_t<T> (float, or double for f64) and rounded once, when stored.
//
// Same-shape operands take a contiguous path with 16-byte loads and stores (4 floats or
// 8 16-bit values) when every pointer is 16-byte aligned, plus a scalar tail;
// broadcasting operands take a strided path whose dims are first collapsed (size-1 dims
// dropped, neighbours that every operand walks contiguously merged), which often turns a
// broadcast back into the contiguous case ([1, 7] + [7]) or into a rank-2 walk
// ([M, N] + [N]).
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/storage.cuh"
#include "ops/elementwise.h"

#include "ops/ew_math_std.h"

namespace seam::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxDims = 8;

// One functor per op (name_fn, so that the expression's calls of exp, tanh, ... find the
// math functions, not the struct). The using-declarations keep lookup inside this
// namespace, away from seam's graph builders of the same names (seam::exp(Var), ...).
namespace fn {
using namespace seam_ew;
using seam_ew::gelu_erf;
using seam_ew::gelu_erf_grad;
using seam_ew::gelu_tanh;
using seam_ew::gelu_tanh_grad;
using seam_ew::sigmoid;
using seam_ew::silu_grad;
using std::erf;
using std::exp;
using std::log;
using std::pow;
using std::sqrt;
using std::tanh;

#define SEAM_UNARY(name, attr, def, value, derivative, uses)                                     \
  struct name##_fn {                                                                            \
    static constexpr const char* kAttr = attr;                                                  \
    static constexpr Uses kUses = Uses::uses;                                                   \
    template <class T>                                                                          \
    __device__ static T fwd(T x, [[maybe_unused]] T p) {                                        \
      return value;                                                                             \
    }                                                                                           \
    template <class T>                                                                          \
    __device__ static T bwd([[maybe_unused]] T x, [[maybe_unused]] T y, T dy, [[maybe_unused]] T p) { \
      return derivative;                                                                        \
    }                                                                                           \
  };
#define SEAM_BINARY(name, value, da, db)                                    \
  struct name##_fn {                                                       \
    template <class T>                                                     \
    __device__ static T fwd(T a, T b) {                                    \
      return value;                                                        \
    }                                                                      \
    template <class T>                                                     \
    __device__ static T grad_a([[maybe_unused]] T a, [[maybe_unused]] T b, T dy) { \
      return da;                                                           \
    }                                                                      \
    template <class T>                                                     \
    __device__ static T grad_b([[maybe_unused]] T a, [[maybe_unused]] T b, T dy) { \
      return db;                                                           \
    }                                                                      \
  };
#include "seam/ops.def"
}  // namespace fn

// What one output element is, given its kIn operand values v[0..kIn) in the order of the
// step's inputs, in the compute type C. The op's scalar attribute is kept in double and
// taken in C (as the CPU reference does at either precision).
template <class F>
struct UnaryFwd {  // (x)
  static constexpr int kIn = 1;
  double p;
  template <class C>
  __device__ C operator()(const C* v) const {
    return F::fwd(v[0], static_cast<C>(p));
  }
};

template <class F>
struct UnaryBwd {  // (dy) or (dy, x) or (dy, y), as the op's `uses` says
  static constexpr int kIn = F::kUses == Uses::N ? 1 : 2;
  double p;
  template <class C>
  __device__ C operator()(const C* v) const {
    if constexpr (F::kUses == Uses::X) return F::bwd(v[1], C(0), v[0], static_cast<C>(p));
    else if constexpr (F::kUses == Uses::Y) return F::bwd(C(0), v[1], v[0], static_cast<C>(p));
    else return F::bwd(C(0), C(0), v[0], static_cast<C>(p));
  }
};

template <class F>
struct BinaryFwd {  // (a, b)
  static constexpr int kIn = 2;
  template <class C>
  __device__ C operator()(const C* v) const {
    return F::fwd(v[0], v[1]);
  }
};

template <class F, int Side>
struct BinaryBwd {  // (dy, a, b)
  static constexpr int kIn = 3;
  template <class C>
  __device__ C operator()(const C* v) const {
    if constexpr (Side == 0) return F::grad_a(v[1], v[2], v[0]);
    else return F::grad_b(v[1], v[2], v[0]);
  }
};

template <int N, class T>
struct Ptrs {
  const T* p[N];
};

// 16 bytes of T: what one vector load or store moves (PyTorch's aligned_vector). An
// aligned struct of 16 bytes compiles to one 128-bit access, as float4 does.
template <class T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  T v[kN];
};

// An index space (the output's, collapsed) and each operand's element strides in it.
// Dims are stored innermost first; unused entries are never read.
template <int N>
struct Strided {
  int rank = 0;
  int64_t size[kMaxDims] = {};
  int64_t st[N][kMaxDims] = {};
};

// Element offsets of output element i in each operand. Fully unrolled, so the kernel
// reads the parameter arrays at constant indices (no local-memory copy).
template <int N, class I>
__device__ __forceinline__ void offsets_of(const Strided<N>& s, I i, I (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
  for (int d = 0; d < kMaxDims; ++d) {
    if (d >= s.rank) break;
    const I n = static_cast<I>(s.size[d]);
    const I q = i / n;
    const I r = i - q * n;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += r * static_cast<I>(s.st[k][d]);
    i = q;
  }
}

// Same-shape operands: packs of Pack<T>::kN values over [0, nvec), then the scalar tail
// [kN * nvec, n). nvec is 0 when some pointer is not 16-byte aligned.
template <class G, class T>
__global__ void __launch_bounds__(kThreads)
    ew_contiguous(G g, Ptrs<G::kIn, T> in, T* out, int64_t n, int64_t nvec) {
  constexpr int N = G::kIn;
  constexpr int V = Pack<T>::kN;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = first; i < nvec; i += stride) {
    Pack<T> v[N];
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = reinterpret_cast<const Pack<T>*>(in.p[k])[i];
    Pack<T> r;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      compute_t<T> a[N];
#pragma unroll
      for (int k = 0; k < N; ++k) a[k] = to_compute(v[k].v[e]);
      r.v[e] = from_compute<T>(g(a));
    }
    reinterpret_cast<Pack<T>*>(out)[i] = r;
  }
  for (int64_t i = nvec * V + first; i < n; i += stride) {
    compute_t<T> a[N];
#pragma unroll
    for (int k = 0; k < N; ++k) a[k] = to_compute(in.p[k][i]);
    out[i] = from_compute<T>(g(a));
  }
}

// A row broadcast (a bias, positions over a batch): the output is rows of `inner` values,
// and each operand either has all of them or one row that repeats (bit k of `repeats`).
// Packs as ew_contiguous, inner a multiple of the pack: one division a pack where the
// strided kernel takes one a dim per element.
template <class G, class T>
__global__ void __launch_bounds__(kThreads)
    ew_rows(G g, Ptrs<G::kIn, T> in, T* out, int64_t nvec, int64_t inner_vec, unsigned repeats) {
  constexpr int N = G::kIn;
  constexpr int V = Pack<T>::kN;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    const int64_t col = i % inner_vec;
    Pack<T> v[N];
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = reinterpret_cast<const Pack<T>*>(in.p[k])[repeats >> k & 1u ? col : i];
    Pack<T> r;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      compute_t<T> a[N];
#pragma unroll
      for (int k = 0; k < N; ++k) a[k] = to_compute(v[k].v[e]);
      r.v[e] = from_compute<T>(g(a));
    }
    reinterpret_cast<Pack<T>*>(out)[i] = r;
  }
}

// Broadcasting operands: each output element finds its operands' offsets from its index.
template <class G, class T, class I>
__global__ void __launch_bounds__(kThreads)
    ew_strided(G g, Ptrs<G::kIn, T> in, T* out, Strided<G::kIn> s, I n) {
  constexpr int N = G::kIn;
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    I off[N];
    offsets_of<N, I>(s, i, off);
    compute_t<T> a[N];
#pragma unroll
    for (int k = 0; k < N; ++k) a[k] = to_compute(in.p[k][off[k]]);
    out[i] = from_compute<T>(g(a));
  }
}

// Strides of `in` (row-major) broadcast to `out` (numpy rules): 0 on broadcast dims.
std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  const size_t r = out.size();
  std::vector<int64_t> st(r, 0);
  SEAM_ASSERT(in.size() <= r);
  const size_t lead = r - in.size();
  int64_t s = 1;
  for (size_t d = in.size(); d-- > 0;) {
    st[lead + d] = in[d] == 1 ? 0 : s;
    s *= in[d];
  }
  return st;
}

// Drops size-1 dims and merges neighbours that every operand walks contiguously.
template <int N>
Strided<N> collapse(const Shape& out, const std::array<std::vector<int64_t>, N>& st) {
  Strided<N> s;
  for (size_t d = out.size(); d-- > 0;) {
    if (out[d] == 1) continue;
    if (s.rank > 0) {
      const int in = s.rank - 1;
      bool merge = true;
      for (int k = 0; k < N; ++k) merge = merge && st[k][d] == s.st[k][in] * s.size[in];
      if (merge) {
        s.size[in] *= out[d];
        continue;
      }
    }
    if (s.rank == kMaxDims) fail("elementwise: more than ", kMaxDims, " dims after collapsing ", shape_str(out));
    s.size[s.rank] = out[d];
    for (int k = 0; k < N; ++k) s.st[k][s.rank] = st[k][d];
    ++s.rank;
  }
  return s;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class G, class T>
Launch prepare_ew_as(const StepArgs& a, G g) {
  constexpr int N = G::kIn;
  constexpr int V = Pack<T>::kN;
  const Shape& os = a.out[0].shape();
  const int64_t n = a.out[0].numel();
  if (n == 0) return [](cudaStream_t) {};
  Ptrs<N, T> in;
  std::array<std::vector<int64_t>, N> st;
  for (int k = 0; k < N; ++k) {
    in.p[k] = a.in[static_cast<size_t>(k)].as<const T>();
    st[static_cast<size_t>(k)] = broadcast_strides(a.in[static_cast<size_t>(k)].shape(), os);
  }
  T* out = a.out[0].as<T>();
  const Strided<N> s = collapse<N>(os, st);
  const unsigned cap = grid_cap(a.ctx);

  bool contiguous = s.rank <= 1;
  for (int k = 0; k < N && s.rank == 1; ++k) contiguous = contiguous && s.st[k][0] == 1;
  if (contiguous) {
    bool vec = aligned16(out);
    for (int k = 0; k < N; ++k) vec = vec && aligned16(in.p[k]);
    const int64_t nvec = vec ? n / V : 0;
    const unsigned blocks = blocks_for(nvec > 0 ? nvec : n, kThreads, static_cast<int>(cap));
    return [=](cudaStream_t stream) {
      ew_contiguous<G, T><<<blocks, kThreads, 0, stream>>>(g, in, out, n, nvec);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  }
  // Two dims, every operand walking the inner one: rows, each operand whole or repeated.
  if (s.rank == 2 && s.size[0] % V == 0 && aligned16(out)) {
    bool rows = true;
    unsigned repeats = 0;
    for (int k = 0; k < N; ++k) {
      rows = rows && s.st[k][0] == 1 && (s.st[k][1] == s.size[0] || s.st[k][1] == 0) && aligned16(in.p[k]);
      if (s.st[k][1] == 0) repeats |= 1u << k;
    }
    if (rows) {
      const int64_t nvec = n / V, inner_vec = s.size[0] / V;
      const unsigned blocks = blocks_for(nvec, kThreads, static_cast<int>(cap));
      return [=](cudaStream_t stream) {
        ew_rows<G, T><<<blocks, kThreads, 0, stream>>>(g, in, out, nvec, inner_vec, repeats);
        SEAM_CUDA_LAUNCH_CHECK();
      };
    }
  }
  // 32-bit index arithmetic when every offset fits (the divisions are most of the cost).
  bool small = n < (int64_t{1} << 31);
  for (int k = 0; k < N; ++k) small = small && a.in[static_cast<size_t>(k)].numel() < (int64_t{1} << 31);
  const unsigned blocks = blocks_for(n, kThreads, static_cast<int>(cap));
  if (small)
    return [=](cudaStream_t stream) {
      ew_strided<G, T, uint32_t><<<blocks, kThreads, 0, stream>>>(g, in, out, s, static_cast<uint32_t>(n));
      SEAM_CUDA_LAUNCH_CHECK();
    };
  return [=](cudaStream_t stream) {
    ew_strided<G, T, int64_t><<<blocks, kThreads, 0, stream>>>(g, in, out, s, n);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// Every operand has the output's storage type (the graph's casts make it so).
template <class G>
Launch prepare_ew(const StepArgs& a, G g) {
  constexpr int N = G::kIn;
  if (a.in.size() != static_cast<size_t>(N) || a.out.size() != 1)
    fail(op_name(a.step.op), " '", a.step.name, "': expected ", N, " inputs, got ", a.in.size());
  const DType t = expect_one_stored_dtype(a, kValues);
  Launch l;
  dispatch_value(t, op_name(a.step.op), [&]<class T>() { l = prepare_ew_as<G, T>(a, g); });
  return l;
}

// The op's scalar attribute, read once here (0 for ops without one).
double scalar_attr(const StepArgs& a, const char* attr) { return *attr ? a.step.attrs.f(attr) : 0.0; }

template <class F>
Launch unary_fwd(const StepArgs& a) {
  return prepare_ew(a, UnaryFwd<F>{scalar_attr(a, F::kAttr)});
}

template <class F>
Launch unary_bwd(const StepArgs& a) {
  return prepare_ew(a, UnaryBwd<F>{scalar_attr(a, F::kAttr)});
}

template <class F>
Launch binary_fwd(const StepArgs& a) {
  return prepare_ew(a, BinaryFwd<F>{});
}

template <class F, int Side>
Launch binary_bwd(const StepArgs& a) {
  return prepare_ew(a, BinaryBwd<F, Side>{});
}

}  // namespace

void register_elementwise(PreparerTable& t) {
#define SEAM_UNARY(name, attr, def, value, derivative, uses) \
  set(t, Op::name, unary_fwd<fn::name##_fn>);                \
  set(t, Op::name##_grad, unary_bwd<fn::name##_fn>);
#define SEAM_BINARY(name, value, da, db)                 \
  set(t, Op::name, binary_fwd<fn::name##_fn>);           \
  set(t, Op::name##_grad_a, binary_bwd<fn::name##_fn, 0>); \
  set(t, Op::name##_grad_b, binary_bwd<fn::name##_fn, 1>);
#include "seam/ops.def"
}

}  // namespace seam::cuda
