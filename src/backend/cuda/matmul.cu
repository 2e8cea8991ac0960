// CUDA kernels of the matmul family: every one is a cuBLASLt GEMM (gemm.h). The fused
// ops (linear_act, linear_act_aux, matmul_act_grad, linear_grad_weight_bias) have two
// variants: the bias, activation, activation derivative or bias gradient done by the
// GEMM's epilogue ("fused"), or a plain GEMM (BIAS at most) followed by the ops' own
// kernels ("split"); choose_variant keeps the faster per shape. Same semantics as the
// CPU reference (src/backend/cpu/matmul.cpp).
//
// All tensors are row-major; cuBLASLt is column-major. A row-major buffer X[r, c] read
// column-major is the matrix X^T [c, r] with leading dimension c. So row-major
// C[M, N] = A[M, K] B[K, N] is computed as the column-major C^T[N, M] = B^T[N, K] A^T[K, M]:
// cuBLASLt's m' = N, n' = M, k' = K, its A' is our B and its B' is our A, and each
// operand gets a transpose when the op wants the other orientation of the buffer. Each
// preparer below derives its mapping from that rule.
//
// Storage types (the mixed-precision contract): the float inputs of a step share one type
// (f32, bf16 or f16), its float outputs another, the inputs' or f32 (a 16-bit product
// written straight into an f32 buffer); the GEMM reads and writes them as they are and
// accumulates in fp32. A bias may have either type, but cuBLASLt's epilogues take only
// D's type for it (and for gelu's record): with another, the bias or activation runs as a
// kernel of its own and the fused variant is not offered.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/reduce.h"
#include "backend/cuda/storage.cuh"
#include "backend/cuda/wgmma_gemm.h"
#include "ops/geometry.h"

namespace seam::cuda {

namespace {

std::string what_of(const StepArgs& a) { return std::string(op_name(a.step.op)) + " '" + a.step.name + "'"; }

// The element `offset` elements into t, in t's storage type.
void* at(const DeviceTensor& t, int64_t offset = 0) {
  return static_cast<std::byte*>(t.data) + offset * static_cast<int64_t>(dtype_size(t.dtype()));
}

Launch nothing() {
  return [](cudaStream_t) {};
}

// Outputs of a product with an empty inner dimension are zeros.
Launch zero_fill(std::vector<std::pair<void*, size_t>> buffers) {
  return [buffers](cudaStream_t s) {
    for (auto& [p, bytes] : buffers)
      if (bytes) SEAM_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
  };
}

size_t bytes_of(const DeviceTensor& t) { return t.type.bytes(); }

bool is_relu(const StepArgs& a) {
  const std::string& act = a.step.attrs.s("act");
  if (act != "relu" && act != "gelu_tanh")
    fail(what_of(a), ": act must be relu or gelu_tanh, got '", act, "'");
  return act == "relu";
}

// The storage types of a step's GEMM: of its float inputs `ins` (one type, which A and B
// have) and of its float outputs `outs` (one type, D's). Throws naming the step and the
// operand otherwise. `bias`, if any, may have either type.
struct Types {
  DType in, out;
};
Types gemm_types(const StepArgs& a, const std::vector<const DeviceTensor*>& ins,
                 const std::vector<const DeviceTensor*>& outs, const DeviceTensor* bias = nullptr) {
  expect_dtype(a, *ins[0], kStored);
  const DType in = ins[0]->dtype();
  for (const DeviceTensor* t : ins) expect_dtype(a, *t, {in});
  expect_dtype(a, *outs[0], {in, DType::f32});
  const DType out = outs[0]->dtype();
  for (const DeviceTensor* t : outs) expect_dtype(a, *t, {out});
  if (bias) expect_dtype(a, *bias, {in, out});
  return {in, out};
}

GemmShape typed(GemmShape g, Types t) {
  g.ab_type = t.in;
  g.d_type = t.out;
  return g;
}

// --------------------------------------------------------------------------------------
// The pieces of split variants.

// The same buffer seen with another shape of as many elements.
DeviceTensor as_shape(const DeviceTensor& t, const Shape& shape) {
  DeviceTensor r{t.data, TensorType{t.dtype(), shape}};
  SEAM_ASSERT(r.numel() == t.numel());
  return r;
}

// relu in place on y [rows, n] and its record: bit j of row i set where y > 0, in the
// layout of relu_mask_row_bytes (padding bits zero). One thread per mask byte.
template <class T>
__global__ void relu_and_mask(T* y, uint8_t* mask, int64_t rows, int64_t n, int64_t row_bytes) {
  const int64_t total = rows * row_bytes;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx / row_bytes, j0 = (idx - i * row_bytes) * 8;
    T* row = y + i * n;
    unsigned bits = 0;
    for (int t = 0; t < 8 && j0 + t < n; ++t) {
      if (to_float(row[j0 + t]) > 0.0f) bits |= 1u << t;
      else row[j0 + t] = from_float<T>(0.0f);
    }
    mask[idx] = static_cast<uint8_t>(bits);
  }
}

// dx [rows, k] zeroed where the relu record's bit is clear. One thread per mask byte.
template <class T>
__global__ void apply_relu_mask(T* dx, const uint8_t* mask, int64_t rows, int64_t k, int64_t row_bytes) {
  const int64_t total = rows * row_bytes;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx / row_bytes, j0 = (idx - i * row_bytes) * 8;
    if (j0 >= k) continue;
    T* row = dx + i * k;
    const unsigned bits = mask[idx];
    for (int t = 0; t < 8 && j0 + t < k; ++t)
      if (!(bits >> t & 1u)) row[j0 + t] = from_float<T>(0.0f);
  }
}

// apply: x *= the record's bits; else x = relu(x) and the record written.
Launch relu_mask_kernel(const StepArgs& a, bool apply, const DeviceTensor& x, uint8_t* mask, int64_t rows,
                        int64_t n) {
  const int64_t row_bytes = relu_mask_row_bytes(n);
  const unsigned blocks = blocks_for(rows * row_bytes, 256, static_cast<int>(grid_cap(a.ctx)));
  Launch l;
  dispatch_storage(x.dtype(), what_of(a).c_str(), [&]<class T>() {
    T* p = x.as<T>();
    l = [=](cudaStream_t s) {
      if (apply) apply_relu_mask<T><<<blocks, 256, 0, s>>>(p, mask, rows, n, row_bytes);
      else relu_and_mask<T><<<blocks, 256, 0, s>>>(p, mask, rows, n, row_bytes);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return l;
}

// y [rows, n] += b [n] in float: for a bias cuBLASLt's BIAS epilogue does not take (its
// type is not y's), or a GEMM shape it has no BIAS algorithm for.
template <class Y, class B>
__global__ void add_bias(Y* y, const B* b, int64_t rows, int64_t n) {
  const int64_t total = rows * n;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x)
    y[idx] = from_float<Y>(to_float(y[idx]) + to_float(b[idx % n]));
}

Launch bias_kernel(const StepArgs& a, const DeviceTensor& y, const DeviceTensor& b) {
  const int64_t n = b.numel(), rows = n ? y.numel() / n : 0;
  SEAM_ASSERT(rows * n == y.numel());
  const unsigned blocks = blocks_for(y.numel(), 256, static_cast<int>(grid_cap(a.ctx)));
  const std::string what = what_of(a);
  Launch l;
  dispatch_storage(y.dtype(), what.c_str(), [&]<class Y>() {
    dispatch_storage(b.dtype(), what.c_str(), [&]<class B>() {
      Y* py = y.as<Y>();
      const B* pb = b.as<const B>();
      l = [=](cudaStream_t s) {
        add_bias<Y, B><<<blocks, 256, 0, s>>>(py, pb, rows, n);
        SEAM_CUDA_LAUNCH_CHECK();
      };
    });
  });
  return l;
}

// The pick key of a step: its op, act, shapes and precision (storage types, or TF32 for
// f32): the fastest variant of a bf16 step says nothing about the f32 one.
std::string variant_key(const StepArgs& a, std::initializer_list<int64_t> dims, Types t) {
  std::string k = op_name(a.step.op);
  if (a.step.attrs.has("act")) k += ":" + a.step.attrs.s("act");
  char sep = ':';
  for (int64_t d : dims) {
    k += sep + std::to_string(d);
    sep = ',';
  }
  if (t.in == DType::f32) return k + (a.ctx.tf32 ? ":tf32" : ":fp32");
  return k + ":" + dtype_name(t.in) + (t.out != t.in ? std::string("-") + dtype_name(t.out) : "");
}

// The GEMM of our own for a data gradient dx [m, n] = dy [m, k] w [k, n] (inputs 0 and 1,
// output 0), all bf16 on an sm_90; with `sums` (db, out[1]) also dy's column sums, which
// its producer warps add from the tiles as they land (partials in the stream's workspace,
// then the reduction kernel over them). Empty with the reason otherwise; `offered` as in
// own_linear.
Launch own_data_grad(const StepArgs& a, int64_t m, int64_t k, int64_t n, const DeviceTensor* sums, std::string* why,
                     bool* offered) {
  *offered = false;
  const DeviceTensor &dy = a.in[0], &w = a.in[1], &dx = a.out[0];
  for (const DeviceTensor* t : {&dy, &w, &dx})
    if (t->dtype() != DType::bf16) return {};
  if (!wgmma_gemm_runs_here()) return {};
  *offered = true;
  if (!wgmma_gemm_fits(m, n, k, dy.data, w.data, dx.data, nullptr, why)) return {};
  if (!sums) return wgmma_gemm(a.ctx.sm_count, m, n, k, dy.data, w.data, dx.data, WgmmaEpilogue::none, {.b_kn = true});
  const int64_t rows = wgmma_gemm_a_sum_rows(m);
  a.ctx.need_workspace(static_cast<size_t>(rows * k) * sizeof(float));
  const Context* c = &a.ctx;
  const WgmmaOptions o{.b_kn = true, .col_sums = [c] { return static_cast<float*>(c->workspace()); }};
  return in_order({wgmma_gemm(a.ctx.sm_count, m, n, k, dy.data, w.data, dx.data, WgmmaEpilogue::sums_a, o),
                   column_sums_at(a, o.col_sums, TensorType{DType::f32, {rows, k}}, *sums)});
}

// --------------------------------------------------------------------------------------
// matmul: y[..., M, N] = op(a)[..., M, K] op(b)[..., K, N], batch dims broadcast.
//
// Derivation. Column-major, y^T [N, M] = op(b)^T [N, K] . op(a)^T [K, M]: m' = N, n' = M,
// k' = K; A' = the b buffer, B' = the a buffer, D = y read column-major ([N, M], ld N).
//   A' = b: !tb: b is row-major [K, N], read column-major it is b^T [N, K] = op(b)^T:
//              op N, stored [N, K] = [m', k'], lda = N.
//           tb: b is row-major [N, K], read column-major it is b^T [K, N]; op(b)^T =
//              (b^T)^T needs op T, stored [K, N] = [k', m'], lda = K.
//   B' = a: !ta: a is row-major [M, K], read column-major a^T [K, M] = op(a)^T: op N,
//              stored [K, M] = [k', n'], ldb = K.
//           ta: a is row-major [K, M], read column-major a^T [M, K]; op(a)^T = a needs
//              op T, stored [M, K] = [n', k'], ldb = M.
// Folding: when b is 2-D and !ta, a's rows of all batches are one row-major [B*M, K]
// matrix and y one [B*M, N]: a single GEMM with n' = B*M.
// Otherwise a strided batch over the broadcast batch dims: batch i of y is at i*M*N;
// a's and b's batches advance by M*K and K*N, or by 0 where that operand is broadcast.
// That is one strided batch when, over the batch dims of size > 1, each operand is
// either everywhere present or everywhere broadcast; else the longest suffix of batch
// dims with that property is the strided batch and the dims before it are separate runs.
// An addend c (y's type and layout) makes it beta = 1 with C = c, in place or not.
Launch matmul(const StepArgs& a) {
  const DeviceTensor* c = a.in.size() == 3 ? &a.in[2] : nullptr;
  std::vector<const DeviceTensor*> outs{&a.out[0]};
  if (c) outs.push_back(c);  // of y's type
  const Types t = gemm_types(a, {&a.in[0], &a.in[1]}, outs);
  const Shape& as = a.in[0].shape();
  const Shape& bs = a.in[1].shape();
  const Shape& ys = a.out[0].shape();
  const bool ta = a.step.attrs.i("transpose_a") != 0, tb = a.step.attrs.i("transpose_b") != 0;
  const int64_t m = ys[ys.size() - 2], n = ys.back(), k = as[as.size() - (ta ? 2 : 1)];
  if (a.out[0].numel() == 0) return nothing();
  if (k == 0) {
    if (c) fail(what_of(a), ": the CUDA backend does not handle K = 0 with an addend");
    return zero_fill({{a.out[0].data, bytes_of(a.out[0])}});
  }

  GemmShape g = typed({}, t);
  g.accumulate = c != nullptr;
  g.trans_a = tb;
  g.trans_b = ta;
  g.m = n;
  g.k = k;
  g.lda = tb ? k : n;
  g.ldb = ta ? m : k;
  g.ldc = n;
  if (bs.size() == 2 && !ta) {
    g.n = a.in[0].numel() / k;
    Launch lt =
        prepare_gemm(a.ctx, g, {{at(a.in[1]), at(a.in[0]), at(a.out[0]), c ? c->data : nullptr}}, {}, what_of(a));
    // A data gradient dx = dy w (w stored [k, n]): the GEMM of our own may take it too.
    std::string why;
    bool offered = false;
    Launch own = c || tb ? Launch{} : own_data_grad(a, g.n, k, n, nullptr, &why, &offered);
    if (!offered) return lt;
    return choose_variant(a.ctx, a.index, variant_key(a, {g.n, k, n}, t), {{"cublaslt", lt}, {"wgmma", own, {}, why}});
  }
  g.n = m;

  // Batch dims of y, and of a and b aligned to them from the right (missing dims are 1).
  const Shape batch(ys.begin(), ys.end() - 2);
  const size_t rank = batch.size();
  auto aligned = [&](const Shape& s) {
    Shape r(rank, 1);
    const size_t own = s.size() - 2;
    for (size_t i = 0; i < own; ++i) r[rank - own + i] = s[i];
    return r;
  };
  const Shape ab = aligned(as), bb = aligned(bs);
  // Element strides of each batch dim in each buffer; 0 where the operand is broadcast.
  std::vector<int64_t> sa(rank), sb(rank), sy(rank);
  int64_t acc_a = m * k, acc_b = k * n, acc_y = m * n;
  for (size_t d = rank; d-- > 0;) {
    sa[d] = ab[d] == 1 ? 0 : acc_a;
    sb[d] = bb[d] == 1 ? 0 : acc_b;
    sy[d] = acc_y;
    acc_a *= ab[d];
    acc_b *= bb[d];
    acc_y *= batch[d];
  }
  std::vector<size_t> dims;  // batch dims of size > 1
  for (size_t d = 0; d < rank; ++d)
    if (batch[d] > 1) dims.push_back(d);
  size_t split = dims.size();  // dims[split..] form the strided batch
  int64_t inner = 1;
  if (!dims.empty()) {
    auto pattern = [&](size_t d) { return std::make_pair(sa[d] != 0, sb[d] != 0); };
    split = dims.size() - 1;
    while (split > 0 && pattern(dims[split - 1]) == pattern(dims.back())) --split;
    for (size_t i = split; i < dims.size(); ++i) inner *= batch[dims[i]];
    g.batch = inner;
    g.stride_a = sb[dims.back()] != 0 ? k * n : 0;  // A' is b
    g.stride_b = sa[dims.back()] != 0 ? m * k : 0;  // B' is a
    g.stride_c = m * n;
  }
  // One run per index of the dims before the split.
  int64_t outer = 1;
  for (size_t i = 0; i < split; ++i) outer *= batch[dims[i]];
  std::vector<GemmOperands> calls;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rest = o, oa = 0, ob = 0, oy = 0;
    for (size_t i = split; i-- > 0;) {
      const size_t d = dims[i];
      const int64_t id = rest % batch[d];
      rest /= batch[d];
      oa += id * sa[d];
      ob += id * sb[d];
      oy += id * sy[d];
    }
    calls.push_back({at(a.in[1], ob), at(a.in[0], oa), at(a.out[0], oy), c ? at(*c, oy) : nullptr});
  }
  return prepare_gemm(a.ctx, g, std::move(calls), {}, what_of(a));
}

// --------------------------------------------------------------------------------------
// The forward linear family: y[R, out] = x[R, in] w[out, in]^T (+ b[out]), R = rows of x
// (all leading dims folded).
//
// Derivation. Column-major, y^T [out, R] = w [out, in] . x^T [in, R]: m' = out, n' = R,
// k' = in.
//   A' = w: row-major [out, in], read column-major w^T [in, out]; we need w: op T,
//           stored [in, out] = [k', m'], lda = in.
//   B' = x: row-major [R, in], read column-major x^T [in, R]: op N, stored [k', n'],
//           ldb = in.
//   D = y:  row-major [R, out], read column-major y^T [out, R] = [m', n'], ldc = out.
// BIAS adds a vector of length m' = out to every column (= every row of y) ✓.
// The epilogue's aux is laid out like D: element (feature j, row i) of D sits at j + i*ld.
//   relu: a bitmask, bit j + i*ld with ld = round_up(out, 128) bits: byte i*ld/8 + j/8,
//         bit j%8 — the layout of relu_mask_row_bytes (geometry.h); AUX_LD is in bits.
//   gelu: the pre-activation (after bias) as [R, out] row-major = [out, R] column-major,
//         AUX_LD = out (cuBLASLt wants a multiple of 8; the schema guarantees it).
GemmShape linear_shape(int64_t rows, int64_t in, int64_t out, Types t) {
  GemmShape g = typed({}, t);
  g.trans_a = true;
  g.trans_b = false;
  g.m = out;
  g.n = rows;
  g.k = in;
  g.lda = in;
  g.ldb = in;
  g.ldc = out;
  return g;
}

// pre = x w^T (+ b) for the linear shape g: the GEMM with BIAS where cuBLASLt takes the
// bias (it has pre's type, and there is an algorithm), else the plain GEMM and add_bias.
Launch linear_gemm(const StepArgs& a, GemmShape g, const DeviceTensor* bias, const DeviceTensor& pre) {
  const GemmOperands ops{at(a.in[1]), at(a.in[0]), at(pre)};
  if (bias && bias->dtype() == pre.dtype()) {
    GemmShape gb = g;
    gb.epilogue = CUBLASLT_EPILOGUE_BIAS;
    GemmEpilogueData e;
    e.bias = bias->data;
    std::string why;
    if (Launch l = try_prepare_gemm(a.ctx, gb, {ops}, e, what_of(a), &why)) return l;
  }
  g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  Launch plain = prepare_gemm(a.ctx, g, {ops}, {}, what_of(a));
  return bias ? in_order({plain, bias_kernel(a, pre, *bias)}) : plain;
}

// The GEMM of our own for sm_90 (wgmma_gemm.h) where it takes a linear layer's forward:
// bf16 throughout (x, w, the outputs, the bias), on a GPU it was built for. Empty with
// the reason otherwise; `offered` says whether the step should list it at all (only
// where the GPU is an sm_90 and the types are bf16, so other plans read as before).
Launch own_linear(const StepArgs& a, int64_t rows, int64_t in, int64_t out, const DeviceTensor* b,
                  const DeviceTensor& y, const DeviceTensor* aux, WgmmaEpilogue e, std::string* why, bool* offered) {
  *offered = false;
  const DeviceTensor& x = a.in[0];
  const DeviceTensor& w = a.in[1];
  for (const DeviceTensor* t : {&x, &w, &y, b, aux})
    if (t && t->dtype() != DType::bf16) return {};
  if (!wgmma_gemm_runs_here()) return {};
  *offered = true;
  if (!wgmma_gemm_fits(rows, out, in, x.data, w.data, y.data, aux ? aux->data : nullptr, why)) return {};
  if (b && reinterpret_cast<uintptr_t>(b->data) % 4 != 0) {
    *why = "the bias is not 4-byte aligned";
    return {};
  }
  return wgmma_gemm(a.ctx.sm_count, rows, out, in, x.data, w.data, y.data, e,
                    {.bias = b ? b->data : nullptr, .aux = aux ? aux->data : nullptr});
}

// linear: BIAS with a bias, DEFAULT without; or the GEMM of our own, if faster.
Launch linear(const StepArgs& a) {
  const bool bias = a.in.size() == 3;
  const Types t = gemm_types(a, {&a.in[0], &a.in[1]}, {&a.out[0]}, bias ? &a.in[2] : nullptr);
  const int64_t out = a.in[1].shape()[0], in = a.in[1].shape()[1];
  const int64_t rows = in ? a.in[0].numel() / in : 0;
  if (a.out[0].numel() == 0) return nothing();
  if (in == 0) {
    if (bias) fail(what_of(a), ": the CUDA backend does not handle in_features = 0 with a bias");
    return zero_fill({{a.out[0].data, bytes_of(a.out[0])}});
  }
  if (rows == 0) return nothing();
  const DeviceTensor* b = bias ? &a.in[2] : nullptr;
  Launch lt = linear_gemm(a, linear_shape(rows, in, out, t), b, a.out[0]);
  std::string why;
  bool offered = false;
  Launch own = own_linear(a, rows, in, out, b, a.out[0], nullptr, bias ? WgmmaEpilogue::bias : WgmmaEpilogue::none,
                          &why, &offered);
  if (!offered) return lt;
  return choose_variant(a.ctx, a.index, variant_key(a, {rows, in, out, bias}, t),
                        {{"cublaslt", lt}, {"wgmma", own, {}, why}});
}

// linear_add: y = x w^T + b + r. Fused: the GEMM reads r as its C with beta = 1 (with
// BIAS where cuBLASLt takes the bias), so r is added as y is stored; split: linear's
// GEMM, then y += r by the add kernel (a third pass over y); wgmma (with a bias, bf16 on
// sm_90): the GEMM of our own with its bias_add epilogue.
Launch linear_add(const StepArgs& a) {
  const DeviceTensor &y = a.out[0], &r = a.in[2];
  const DeviceTensor* b = a.in.size() == 4 ? &a.in[3] : nullptr;
  const Types t = gemm_types(a, {&a.in[0], &a.in[1], &r}, {&y}, b);
  const int64_t out = a.in[1].shape()[0], in = a.in[1].shape()[1];
  const int64_t rows = in ? a.in[0].numel() / in : 0;
  if (y.numel() == 0) return nothing();
  if (in == 0) fail(what_of(a), ": the CUDA backend does not handle in_features = 0");
  const GemmShape g = linear_shape(rows, in, out, t);
  Launch split = in_order({linear_gemm(a, g, b, y), prepare_as_step(a, Op::add, {}, {y, r}, {y})});
  GemmShape ga = g;
  ga.accumulate = true;
  GemmEpilogueData e;
  Launch fused;
  std::string why;
  if (b && b->dtype() != y.dtype()) {
    why = std::string("the epilogue takes no ") + dtype_name(b->dtype()) + " bias with " + dtype_name(y.dtype()) +
          " output";
  } else {
    if (b) {
      ga.epilogue = CUBLASLT_EPILOGUE_BIAS;
      e.bias = b->data;
    }
    fused = try_prepare_gemm(a.ctx, ga, {{at(a.in[1]), at(a.in[0]), at(y), r.data}}, e, what_of(a), &why);
  }
  std::vector<Variant> variants{{"fused", fused, {}, why}, {"split", split}};
  if (b) {  // the GEMM of our own reads r through its store buffers and adds it with the bias
    std::string own_why;
    bool offered = false;
    Launch own = own_linear(a, rows, in, out, b, y, &r, WgmmaEpilogue::bias_add, &own_why, &offered);
    if (offered) variants.push_back({"wgmma", own, {}, own_why});
  }
  return choose_variant(a.ctx, a.index, variant_key(a, {rows, in, out, b != nullptr}, t), std::move(variants));
}

// linear_act: RELU_BIAS / GELU_BIAS (RELU / GELU without a bias). linear_act_aux: the
// same with _AUX, writing the record for matmul_act_grad (see the derivation above).
// Fused only where the epilogue takes the bias (it has y's type); split always.
template <bool Aux>
Launch linear_act(const StepArgs& a) {
  const bool relu = is_relu(a);
  const bool bias = a.in.size() == 3;
  const DeviceTensor* b = bias ? &a.in[2] : nullptr;
  std::vector<const DeviceTensor*> outs{&a.out[0]};
  if (Aux && relu) expect_dtype(a, a.out[1], {DType::u8});  // the relu record is a bitmask
  else if (Aux) outs.push_back(&a.out[1]);                  // gelu's record is pre, typed as y
  const Types t = gemm_types(a, {&a.in[0], &a.in[1]}, outs, b);
  const int64_t out = a.in[1].shape()[0], in = a.in[1].shape()[1];
  const int64_t rows = in ? a.in[0].numel() / in : 0;
  if (a.out[0].numel() == 0) return nothing();
  if (in == 0) fail(what_of(a), ": the CUDA backend does not handle in_features = 0");
  GemmShape g = linear_shape(rows, in, out, t);
  const DeviceTensor& y = a.out[0];
  const bool pre_in_aux = Aux && !relu;
  if (pre_in_aux && out % 8 != 0) fail(what_of(a), ": gelu_tanh's record needs out % 8 == 0, got ", out);

  // Split: y (or, for gelu with a record, the record) = the GEMM with its bias; then the
  // activation (and for relu the mask) by a separate kernel.
  const DeviceTensor pre = pre_in_aux ? as_shape(a.out[1], y.shape()) : y;
  Launch act = Aux && relu ? relu_mask_kernel(a, false, y, a.out[1].as<uint8_t>(), rows, out)
                           : prepare_as_step(a, relu ? Op::relu : Op::gelu_tanh, {}, {pre}, {y});
  Launch split = in_order({linear_gemm(a, g, b, pre), act});

  GemmEpilogueData e;
  if (bias) e.bias = b->data;
  if (Aux) {
    const DeviceTensor& aux = a.out[1];
    if (relu) {
      const int64_t row_bytes = relu_mask_row_bytes(out);
      SEAM_ASSERT(aux.numel() == rows * row_bytes);
      g.aux_ld = row_bytes * 8;
    } else {
      SEAM_ASSERT(aux.numel() == rows * out);
      g.aux_ld = out;
    }
    e.aux = aux.data;
    g.epilogue = relu ? (bias ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX)
                      : (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX);
  } else {
    g.epilogue = relu ? (bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU)
                      : (bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
  }
  Launch fused;
  std::string why;
  if (bias && b->dtype() != y.dtype())
    why = std::string("the epilogue takes no ") + dtype_name(b->dtype()) + " bias with " + dtype_name(y.dtype()) +
          " output";
  else
    fused = try_prepare_gemm(a.ctx, g, {{at(a.in[1]), at(a.in[0]), at(y)}}, e, what_of(a), &why);
  std::vector<Variant> variants{{"fused", fused, {}, why}, {"split", split}};
  if (Aux && !relu && bias) {  // the GEMM of our own writes the record and the value together
    std::string own_why;
    bool offered = false;
    Launch own = own_linear(a, rows, in, out, b, y, &a.out[1], WgmmaEpilogue::bias_gelu_aux, &own_why, &offered);
    if (offered) variants.push_back({"wgmma", own, {}, own_why});
  }
  return choose_variant(a.ctx, a.index, variant_key(a, {rows, in, out, bias}, t), std::move(variants));
}

// out = the column sums of x [M, N], by the reduction kernel (a sum step over the rows):
// the bias gradients the GEMMs' epilogues do not write.
Launch column_sums(const StepArgs& a, const DeviceTensor& x, const DeviceTensor& out) {
  return column_sums_at(a, [p = static_cast<const void*>(x.data)] { return p; }, x.type, out);
}

// --------------------------------------------------------------------------------------
// linear_grad_weight_bias: dw[out, in] = dy[M, out]^T x[M, in], db[out] = column sums
// of dy.
//
// Derivation. Column-major, dw^T [in, out] = x^T [in, M] . dy [M, out]: m' = in,
// n' = out, k' = M.
//   A' = x:  row-major [M, in], read column-major x^T [in, M] = what we need: op N,
//            stored [m', k'], lda = in.
//   B' = dy: row-major [M, out], read column-major dy^T [out, M]; we need dy [M, out]:
//            op T, stored [out, M] = [n', k'], ldb = out.
//   D = dw:  row-major [out, in], read column-major dw^T [in, out] = [m', n'], ldc = in.
// B' is transposed, so BGRADB is allowed (gpu-facts.md): it writes a vector of length
// n' = out, entry j = sum over k' of op(B')[k', j] = sum_i dy[i, j] = db[j] ✓.
Launch linear_grad_weight_bias(const StepArgs& a) {
  const Types t = gemm_types(a, {&a.in[0], &a.in[1]}, {&a.out[0], &a.out[1]});
  const int64_t m = a.in[0].shape()[0], out = a.in[0].shape()[1], in = a.in[1].shape()[1];
  if (out == 0) return nothing();
  if (m == 0) return zero_fill({{a.out[0].data, bytes_of(a.out[0])}, {a.out[1].data, bytes_of(a.out[1])}});
  if (in == 0) fail(what_of(a), ": the CUDA backend does not handle in_features = 0");
  GemmShape g = typed({}, t);
  g.trans_a = false;
  g.trans_b = true;
  g.m = in;
  g.n = out;
  g.k = m;
  g.lda = in;
  g.ldb = out;
  g.ldc = in;
  const GemmOperands ops{at(a.in[1]), at(a.in[0]), at(a.out[0])};
  // Split: the plain GEMM, then db = the column sums of dy by the reduction kernel (which
  // reads dy's type and writes db's).
  Launch plain = prepare_gemm(a.ctx, g, {ops}, {}, what_of(a));
  Launch sum = column_sums(a, a.in[0], a.out[1]);
  // Split with dy transposed first (split_t): both operands above are M-major (the sum
  // runs over the rows), and TF32 tensor-core GEMMs read only K-major B' operands at
  // full speed. B' = dy^T, row-major [out, M], read column-major is dy [M, out]: op N,
  // stored [k', n'], ldb = M.
  const DeviceTensor dyt{a.ctx.scratch(bytes_of(a.in[0])), TensorType{a.in[0].dtype(), {out, m}}};
  Launch transpose = prepare_as_step(a, Op::transpose, Attrs{{"perm", std::vector<int64_t>{1, 0}}}, {a.in[0]}, {dyt});
  GemmShape gt = g;
  gt.trans_b = false;
  gt.ldb = m;
  Launch plain_t = prepare_gemm(a.ctx, gt, {{at(a.in[1]), at(dyt), at(a.out[0])}}, {}, what_of(a));
  // BGRADB writes db in D's type, which db has.
  g.epilogue = CUBLASLT_EPILOGUE_BGRADB;
  GemmEpilogueData e;
  e.bias = a.out[1].data;
  std::string why;
  Launch fused = try_prepare_gemm(a.ctx, g, {ops}, e, what_of(a), &why);
  Context* ctx = &a.ctx;
  void* scratch = dyt.data;
  return choose_variant(a.ctx, a.index, variant_key(a, {m, in, out}, t),
                        {{"fused", fused, {}, why},
                         {"split", in_order({plain, sum})},
                         {"split_t", in_order({transpose, plain_t, sum}), [ctx, scratch] { ctx->release(scratch); }}});
}

// --------------------------------------------------------------------------------------
// matmul_act_grad: dx[M, K] = (dy[M, N] w[N, K]) * act'(pre[M, K]), pre recorded in aux
// by linear_act_aux (whose out = K here).
//
// Derivation. Column-major, dx^T [K, M] = w^T [K, N] . dy^T [N, M]: m' = K, n' = M, k' = N.
//   A' = w:  row-major [N, K], read column-major w^T [K, N] = what we need: op N,
//            stored [m', k'], lda = K.
//   B' = dy: row-major [M, N], read column-major dy^T [N, M] = what we need: op N,
//            stored [k', n'], ldb = N.
//   D = dx:  row-major [M, K], read column-major dx^T [K, M] = [m', n'], ldc = K.
// The aux is indexed like D, element (j, i) = pre[i, j]: DRELU reads the bitmask with
// AUX_LD = relu_mask_row_bytes(K) * 8 bits (bit j + i*ld, as linear_act_aux wrote it for
// out = K); DGELU reads pre [M, K] row-major = [K, M] column-major, AUX_LD = K.
// The GEMM dx = dy w as derived (linear_grad_input_bias's too), epilogue left to the caller.
GemmShape data_grad_shape(int64_t m, int64_t n, int64_t k, Types t) {
  GemmShape g = typed({}, t);
  g.trans_a = false;
  g.trans_b = false;
  g.m = k;
  g.n = m;
  g.k = n;
  g.lda = k;
  g.ldb = n;
  g.ldc = k;
  return g;
}

Launch matmul_act_grad(const StepArgs& a) {
  const bool relu = is_relu(a);
  const DeviceTensor& aux = a.in[2];
  if (relu) expect_dtype(a, aux, {DType::u8});  // the relu record is a bitmask
  const Types t = relu ? gemm_types(a, {&a.in[0], &a.in[1]}, {&a.out[0]})
                       : gemm_types(a, {&a.in[0], &a.in[1], &aux}, {&a.out[0]});
  const int64_t m = a.in[0].shape()[0], n = a.in[0].shape()[1], k = a.in[1].shape()[1];
  const bool sums_out = a.out.size() == 2;  // dx_sums: zeros where dx has no rows
  if (k == 0) return nothing();
  if (m == 0) return sums_out ? zero_fill({{a.out[1].data, bytes_of(a.out[1])}}) : nothing();
  if (n == 0) {
    std::vector<std::pair<void*, size_t>> zeros{{a.out[0].data, bytes_of(a.out[0])}};
    if (sums_out) zeros.emplace_back(a.out[1].data, bytes_of(a.out[1]));
    return zero_fill(zeros);
  }
  GemmShape g = data_grad_shape(m, n, k, t);
  const GemmOperands ops{at(a.in[1]), at(a.in[0]), at(a.out[0])};
  // Split: the plain GEMM into dx, then dx *= act'(pre) in place by a separate kernel.
  Launch plain = prepare_gemm(a.ctx, g, {ops}, {}, what_of(a));
  const DeviceTensor& dx = a.out[0];
  if (relu) {
    const int64_t row_bytes = relu_mask_row_bytes(k);
    SEAM_ASSERT(aux.numel() == m * row_bytes);
    g.aux_ld = row_bytes * 8;
    g.epilogue = CUBLASLT_EPILOGUE_DRELU;
  } else {
    if (k % 8 != 0) fail(what_of(a), ": gelu_tanh's record needs K % 8 == 0, got ", k);
    SEAM_ASSERT(aux.numel() == m * k);
    g.aux_ld = k;
    g.epilogue = CUBLASLT_EPILOGUE_DGELU;
  }
  // gelu_tanh_grad takes one type: a 16-bit record with an f32 dx is widened first (into
  // scratch of dx's type), and DGELU, which reads the record in D's type, is not offered.
  const bool widen = !relu && aux.dtype() != dx.dtype();
  void* scratch = widen ? a.ctx.scratch(static_cast<size_t>(m * k) * dtype_size(dx.dtype())) : nullptr;
  Launch scale;
  if (relu) {
    scale = relu_mask_kernel(a, true, dx, static_cast<uint8_t*>(aux.data), m, k);
  } else {
    const DeviceTensor pre = widen ? DeviceTensor{scratch, dx.type} : as_shape(aux, dx.shape());
    Launch grad = prepare_as_step(a, Op::gelu_tanh_grad, {}, {dx, pre}, {dx});
    scale = widen ? in_order({prepare_as_step(a, Op::cast, Attrs{{"dtype", std::string(dtype_name(dx.dtype()))}},
                                              {as_shape(aux, dx.shape())}, {pre}),
                              grad})
                  : grad;
  }
  GemmEpilogueData e;
  e.aux = aux.data;
  Launch fused;
  std::string why;
  if (widen)
    why = std::string("DGELU reads no ") + dtype_name(aux.dtype()) + " record with " + dtype_name(dx.dtype()) +
          " output";
  else
    fused = try_prepare_gemm(a.ctx, g, {ops}, e, what_of(a), &why);
  Context* ctx = &a.ctx;
  auto release = [ctx, scratch] {
    if (scratch) ctx->release(scratch);
  };
  // dx_sums (bias_grads_into_act_grads): dx's column sums, read back by the reduction
  // kernel after either variant (the read BGRADB made beside the weight gradient of the
  // layer before the activation).
  if (sums_out) {
    const Launch sums = column_sums(a, dx, a.out[1]);
    if (fused) fused = in_order({fused, sums});
    plain = in_order({plain, scale, sums});
  } else {
    plain = in_order({plain, scale});
  }
  std::vector<Variant> variants{{"fused", fused, {}, why}, {"split", plain, release}};
  // The GEMM of our own (bf16, sm_90): DGELU with the record read through its store
  // buffers, and with dx_sums the column sums of what it stores over each 16 rows, which
  // the reduction kernel then adds (m / 16 rows of partials, not dx's m rows again). The
  // partials live in the workspace (the stream's, shared by its steps: cuBLASLt's 32 MB
  // already hold them at W6's shapes), whose address each launch reads as it runs.
  const bool bf16 = dx.dtype() == DType::bf16 && a.in[0].dtype() == DType::bf16 && a.in[1].dtype() == DType::bf16 &&
                    aux.dtype() == DType::bf16;
  if (!relu && bf16 && wgmma_gemm_runs_here()) {
    // Its m, n, k: dx [m, k] = dy [m, n] w [n, k], w stored [its k, its n] (b_kn).
    std::string own_why;
    Launch own;
    if (wgmma_gemm_fits(m, k, n, a.in[0].data, a.in[1].data, dx.data, aux.data, &own_why)) {
      WgmmaOptions o{.aux = aux.data, .b_kn = true};
      if (sums_out) {
        const int64_t rows = wgmma_gemm_col_sum_rows(m);
        a.ctx.need_workspace(static_cast<size_t>(rows * k) * sizeof(float));
        const Context* c = ctx;
        o.col_sums = [c] { return static_cast<float*>(c->workspace()); };
        own = in_order({wgmma_gemm(a.ctx.sm_count, m, k, n, a.in[0].data, a.in[1].data, dx.data,
                                   WgmmaEpilogue::dgelu, o),
                        column_sums_at(a, o.col_sums, TensorType{DType::f32, {rows, k}}, a.out[1])});
      } else {
        own = wgmma_gemm(a.ctx.sm_count, m, k, n, a.in[0].data, a.in[1].data, dx.data, WgmmaEpilogue::dgelu, o);
      }
    }
    variants.push_back({"wgmma", own, {}, own_why});
  }
  return choose_variant(a.ctx, a.index, variant_key(a, {m, n, k, static_cast<int64_t>(a.out.size())}, t),
                        std::move(variants));
}

// --------------------------------------------------------------------------------------
// linear_grad_input_bias: dx[M, K] = dy[M, N] w[N, K], db[N] = the column sums of dy
// (bias_grads_into_data_grads). The GEMM is matmul_act_grad's without the epilogue
// (data_grad_shape, derived above). cuBLASLt has no epilogue for these sums (BGRADB on this layout sums
// dy's rows), so its variant reads dy again after the GEMM; ours sums dy's tiles as they
// land (own_data_grad).
Launch linear_grad_input_bias(const StepArgs& a) {
  const Types t = gemm_types(a, {&a.in[0], &a.in[1]}, {&a.out[0]});
  const int64_t m = a.in[0].shape()[0], n = a.in[0].shape()[1], k = a.in[1].shape()[1];
  if (n == 0) return zero_fill({{a.out[0].data, bytes_of(a.out[0])}});
  if (m == 0) return zero_fill({{a.out[1].data, bytes_of(a.out[1])}});
  const GemmShape g = data_grad_shape(m, n, k, t);
  Launch split = k == 0 ? column_sums(a, a.in[0], a.out[1])
                        : in_order({prepare_gemm(a.ctx, g, {{at(a.in[1]), at(a.in[0]), at(a.out[0])}}, {}, what_of(a)),
                                    column_sums(a, a.in[0], a.out[1])});
  std::string why;
  bool offered = false;
  Launch own = k == 0 ? Launch{} : own_data_grad(a, m, n, k, &a.out[1], &why, &offered);
  if (!offered) return split;
  return choose_variant(a.ctx, a.index, variant_key(a, {m, n, k}, t), {{"split", split}, {"wgmma", own, {}, why}});
}

}  // namespace

void register_matmul(PreparerTable& t) {
  set(t, Op::matmul, matmul);
  set(t, Op::linear, linear);
  set(t, Op::linear_add, linear_add);
  set(t, Op::linear_grad_weight_bias, linear_grad_weight_bias);
  set(t, Op::linear_act, linear_act<false>);
  set(t, Op::linear_act_aux, linear_act<true>);
  set(t, Op::matmul_act_grad, matmul_act_grad);
  set(t, Op::linear_grad_input_bias, linear_grad_input_bias);
}

}  // namespace seam::cuda
