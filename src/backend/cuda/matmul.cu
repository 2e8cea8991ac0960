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
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/gemm.h"
#include "ops/geometry.h"

namespace seam::cuda {

namespace {

std::string what_of(const StepArgs& a) { return std::string(op_name(a.step.op)) + " '" + a.step.name + "'"; }

float* at(const DeviceTensor& t, int64_t offset = 0) { return t.as<float>() + offset; }

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
__global__ void relu_and_mask(float* y, uint8_t* mask, int64_t rows, int64_t n, int64_t row_bytes) {
  const int64_t total = rows * row_bytes;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx / row_bytes, j0 = (idx - i * row_bytes) * 8;
    float* row = y + i * n;
    unsigned bits = 0;
    for (int t = 0; t < 8 && j0 + t < n; ++t) {
      const float v = row[j0 + t];
      if (v > 0.0f) bits |= 1u << t;
      else row[j0 + t] = 0.0f;
    }
    mask[idx] = static_cast<uint8_t>(bits);
  }
}

// dx [rows, k] zeroed where the relu record's bit is clear. One thread per mask byte.
__global__ void apply_relu_mask(float* dx, const uint8_t* mask, int64_t rows, int64_t k, int64_t row_bytes) {
  const int64_t total = rows * row_bytes;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx / row_bytes, j0 = (idx - i * row_bytes) * 8;
    if (j0 >= k) continue;
    float* row = dx + i * k;
    const unsigned bits = mask[idx];
    for (int t = 0; t < 8 && j0 + t < k; ++t)
      if (!(bits >> t & 1u)) row[j0 + t] = 0.0f;
  }
}

Launch relu_mask_kernel(const Context& ctx, bool apply, float* x, uint8_t* mask, int64_t rows, int64_t n) {
  const int64_t row_bytes = relu_mask_row_bytes(n);
  const unsigned blocks = blocks_for(rows * row_bytes, 256, static_cast<int>(grid_cap(ctx)));
  return [=](cudaStream_t s) {
    if (apply) apply_relu_mask<<<blocks, 256, 0, s>>>(x, mask, rows, n, row_bytes);
    else relu_and_mask<<<blocks, 256, 0, s>>>(x, mask, rows, n, row_bytes);
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

// The pick key of a step: its op, act, shapes and precision.
std::string variant_key(const StepArgs& a, std::initializer_list<int64_t> dims) {
  std::string k = op_name(a.step.op);
  if (a.step.attrs.has("act")) k += ":" + a.step.attrs.s("act");
  char sep = ':';
  for (int64_t d : dims) {
    k += sep + std::to_string(d);
    sep = ',';
  }
  return k + (a.ctx.tf32 ? ":tf32" : ":fp32");
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
Launch matmul(const StepArgs& a) {
  expect_f32(a);
  const Shape& as = a.in[0].shape();
  const Shape& bs = a.in[1].shape();
  const Shape& ys = a.out[0].shape();
  const bool ta = a.step.attrs.i("transpose_a") != 0, tb = a.step.attrs.i("transpose_b") != 0;
  const int64_t m = ys[ys.size() - 2], n = ys.back(), k = as[as.size() - (ta ? 2 : 1)];
  if (a.out[0].numel() == 0) return nothing();
  if (k == 0) return zero_fill({{a.out[0].data, bytes_of(a.out[0])}});

  GemmShape g;
  g.trans_a = tb;
  g.trans_b = ta;
  g.m = n;
  g.k = k;
  g.lda = tb ? k : n;
  g.ldb = ta ? m : k;
  g.ldc = n;
  if (bs.size() == 2 && !ta) {
    g.n = a.in[0].numel() / k;
    return prepare_gemm(a.ctx, g, {{at(a.in[1]), at(a.in[0]), at(a.out[0])}}, {}, what_of(a));
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
    calls.push_back({at(a.in[1], ob), at(a.in[0], oa), at(a.out[0], oy)});
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
GemmShape linear_shape(int64_t rows, int64_t in, int64_t out) {
  GemmShape g;
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

// linear: BIAS with a bias, DEFAULT without.
Launch linear(const StepArgs& a) {
  expect_f32(a);
  const int64_t out = a.in[1].shape()[0], in = a.in[1].shape()[1];
  const int64_t rows = in ? a.in[0].numel() / in : 0;
  const bool bias = a.in.size() == 3;
  if (a.out[0].numel() == 0) return nothing();
  if (in == 0) {
    if (bias) fail(what_of(a), ": the CUDA backend does not handle in_features = 0 with a bias");
    return zero_fill({{a.out[0].data, bytes_of(a.out[0])}});
  }
  if (rows == 0) return nothing();
  GemmShape g = linear_shape(rows, in, out);
  g.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  GemmEpilogueData e;
  if (bias) e.bias = a.in[2].data;
  return prepare_gemm(a.ctx, g, {{at(a.in[1]), at(a.in[0]), at(a.out[0])}}, e, what_of(a));
}

// linear_act: RELU_BIAS / GELU_BIAS (RELU / GELU without a bias). linear_act_aux: the
// same with _AUX, writing the record for matmul_act_grad (see the derivation above).
template <bool Aux>
Launch linear_act(const StepArgs& a) {
  const bool relu = is_relu(a);
  if (Aux && relu) expect_f32(a, {{&a.out[1], DType::u8}});  // the relu record is a bitmask
  else expect_f32(a);
  const int64_t out = a.in[1].shape()[0], in = a.in[1].shape()[1];
  const int64_t rows = in ? a.in[0].numel() / in : 0;
  const bool bias = a.in.size() == 3;
  if (a.out[0].numel() == 0) return nothing();
  if (in == 0) fail(what_of(a), ": the CUDA backend does not handle in_features = 0");
  GemmShape g = linear_shape(rows, in, out);
  GemmEpilogueData e;
  if (bias) e.bias = a.in[2].data;

  // Split: y (or, for gelu with a record, the record) = the GEMM with BIAS; then the
  // activation (and for relu the mask) by a separate kernel.
  GemmShape gs = g;
  gs.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  GemmEpilogueData es;
  es.bias = e.bias;
  const DeviceTensor& y = a.out[0];
  const bool pre_in_aux = Aux && !relu;
  if (pre_in_aux && out % 8 != 0) fail(what_of(a), ": gelu_tanh's record needs out % 8 == 0, got ", out);
  const DeviceTensor pre = pre_in_aux ? as_shape(a.out[1], y.shape()) : y;
  Launch gemm = prepare_gemm(a.ctx, gs, {{at(a.in[1]), at(a.in[0]), at(pre)}}, es, what_of(a));
  Launch act = Aux && relu ? relu_mask_kernel(a.ctx, false, at(y), a.out[1].as<uint8_t>(), rows, out)
                           : prepare_as_step(a, relu ? Op::relu : Op::gelu_tanh, {}, {pre}, {y});
  Launch split = in_order({gemm, act});

  if (Aux) {
    const DeviceTensor& aux = a.out[1];
    if (relu) {
      const int64_t row_bytes = relu_mask_row_bytes(out);
      SEAM_ASSERT(aux.dtype() == DType::u8 && aux.numel() == rows * row_bytes);
      g.aux_ld = row_bytes * 8;
    } else {
      if (out % 8 != 0) fail(what_of(a), ": gelu_tanh's record needs out % 8 == 0, got ", out);
      SEAM_ASSERT(aux.dtype() == DType::f32 && aux.numel() == rows * out);
      g.aux_ld = out;
    }
    e.aux = aux.data;
    g.epilogue = relu ? (bias ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX)
                      : (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX);
  } else {
    g.epilogue = relu ? (bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU)
                      : (bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
  }
  Launch fused = prepare_gemm(a.ctx, g, {{at(a.in[1]), at(a.in[0]), at(a.out[0])}}, e, what_of(a));
  return choose_variant(a.ctx, a.index, variant_key(a, {rows, in, out, bias}), {{"fused", fused}, {"split", split}});
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
  expect_f32(a);
  const int64_t m = a.in[0].shape()[0], out = a.in[0].shape()[1], in = a.in[1].shape()[1];
  if (out == 0) return nothing();
  if (m == 0) return zero_fill({{a.out[0].data, bytes_of(a.out[0])}, {a.out[1].data, bytes_of(a.out[1])}});
  if (in == 0) fail(what_of(a), ": the CUDA backend does not handle in_features = 0");
  GemmShape g;
  g.trans_a = false;
  g.trans_b = true;
  g.m = in;
  g.n = out;
  g.k = m;
  g.lda = in;
  g.ldb = out;
  g.ldc = in;
  const GemmOperands ops{at(a.in[1]), at(a.in[0]), at(a.out[0])};
  // Split: the plain GEMM, then db = the column sums of dy by the reduction kernel.
  Launch plain = prepare_gemm(a.ctx, g, {ops}, {}, what_of(a));
  Launch sum = prepare_as_step(a, Op::sum, Attrs{{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}}, {a.in[0]},
                          {a.out[1]});
  // Split with dy transposed first (split_t): both operands above are M-major (the sum
  // runs over the rows), and TF32 tensor-core GEMMs read only K-major B' operands at
  // full speed. B' = dy^T, row-major [out, M], read column-major is dy [M, out]: op N,
  // stored [k', n'], ldb = M.
  const DeviceTensor dyt{a.ctx.scratch(bytes_of(a.in[0])), TensorType{DType::f32, {out, m}}};
  Launch transpose = prepare_as_step(a, Op::transpose, Attrs{{"perm", std::vector<int64_t>{1, 0}}}, {a.in[0]}, {dyt});
  GemmShape gt = g;
  gt.trans_b = false;
  gt.ldb = m;
  Launch plain_t = prepare_gemm(a.ctx, gt, {{at(a.in[1]), at(dyt), at(a.out[0])}}, {}, what_of(a));
  g.epilogue = CUBLASLT_EPILOGUE_BGRADB;
  GemmEpilogueData e;
  e.bias = a.out[1].data;
  Launch fused = prepare_gemm(a.ctx, g, {ops}, e, what_of(a));
  Context* ctx = &a.ctx;
  void* scratch = dyt.data;
  return choose_variant(a.ctx, a.index, variant_key(a, {m, in, out}),
                        {{"fused", fused},
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
Launch matmul_act_grad(const StepArgs& a) {
  const bool relu = is_relu(a);
  if (relu) expect_f32(a, {{&a.in[2], DType::u8}});  // the relu record is a bitmask
  else expect_f32(a);
  const int64_t m = a.in[0].shape()[0], n = a.in[0].shape()[1], k = a.in[1].shape()[1];
  if (m == 0 || k == 0) return nothing();
  if (n == 0) return zero_fill({{a.out[0].data, bytes_of(a.out[0])}});
  GemmShape g;
  g.trans_a = false;
  g.trans_b = false;
  g.m = k;
  g.n = m;
  g.k = n;
  g.lda = k;
  g.ldb = n;
  g.ldc = k;
  const DeviceTensor& aux = a.in[2];
  const GemmOperands ops{at(a.in[1]), at(a.in[0]), at(a.out[0])};
  // Split: the plain GEMM into dx, then dx *= act'(pre) in place by a separate kernel.
  Launch plain = prepare_gemm(a.ctx, g, {ops}, {}, what_of(a));
  const DeviceTensor& dx = a.out[0];
  if (relu) {
    const int64_t row_bytes = relu_mask_row_bytes(k);
    SEAM_ASSERT(aux.dtype() == DType::u8 && aux.numel() == m * row_bytes);
    g.aux_ld = row_bytes * 8;
    g.epilogue = CUBLASLT_EPILOGUE_DRELU;
  } else {
    if (k % 8 != 0) fail(what_of(a), ": gelu_tanh's record needs K % 8 == 0, got ", k);
    SEAM_ASSERT(aux.dtype() == DType::f32 && aux.numel() == m * k);
    g.aux_ld = k;
    g.epilogue = CUBLASLT_EPILOGUE_DGELU;
  }
  Launch scale = relu ? relu_mask_kernel(a.ctx, true, at(dx), static_cast<uint8_t*>(aux.data), m, k)
                      : prepare_as_step(a, Op::gelu_tanh_grad, {}, {dx, as_shape(aux, dx.shape())}, {dx});
  GemmEpilogueData e;
  e.aux = aux.data;
  Launch fused = prepare_gemm(a.ctx, g, {ops}, e, what_of(a));
  return choose_variant(a.ctx, a.index, variant_key(a, {m, n, k}), {{"fused", fused}, {"split", in_order({plain, scale})}});
}

}  // namespace

void register_matmul(PreparerTable& t) {
  set(t, Op::matmul, matmul);
  set(t, Op::linear, linear);
  set(t, Op::linear_grad_weight_bias, linear_grad_weight_bias);
  set(t, Op::linear_act, linear_act<false>);
  set(t, Op::linear_act_aux, linear_act<true>);
  set(t, Op::matmul_act_grad, matmul_act_grad);
}

}  // namespace seam::cuda
