// conv2d and its two gradients on cuDNN's classic convolution API (x, w, b, y all f32,
// bf16 or f16). Layout nchw, or nhwc (src/ops/layout.h): x, y channels-last and the
// filter in cuDNN's NHWC filter format [C_out, kh, kw, C_in/groups] ("KRSC"), each shape
// written in memory order; the descriptors take the logical NCHW dims with the format,
// and every check compares logical dims. 16-bit data computes in f32 (CUDNN_DATA_FLOAT,
// cuDNN's "pseudo" bf16/half configurations) on tensor cores; f32 data on TF32 tensor
// cores when the context allows it, else with FMA math.
//
// Each step builds its descriptors once, then picks an algorithm for its shape: the
// fastest one cudnnFind*AlgorithmEx measures on the step's own buffers, among the
// deterministic ones when there is any, kept in the process-wide cache of conv_cache.h.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/conv_cache.h"
#include "backend/cuda/conv_engine.h"
#include "backend/cuda/conv_wgrad.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/cudnn_util.h"
#include "backend/cuda/storage.cuh"
#include "ops/geometry.h"

namespace seam::cuda {

namespace {

// ---------------------------------------------------------------------------------------
// Descriptors, measuring and choosing

struct ConvSetup {
  Pass pass = Pass::fwd;
  TensorDesc x, y;  // x-shaped, y-shaped
  FilterDesc w;
  ConvDesc conv;
};

// The workspace cuDNN says `algo` needs with the descriptor's current math type.
cudnnStatus_t workspace_size(cudnnHandle_t h, const ConvSetup& s, int algo, size_t* bytes) {
  *bytes = 0;
  switch (s.pass) {
    case Pass::fwd:
      return cudnnGetConvolutionForwardWorkspaceSize(h, s.x, s.w, s.conv, s.y,
                                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
    case Pass::bwd_data:
      return cudnnGetConvolutionBackwardDataWorkspaceSize(h, s.w, s.y, s.conv, s.x,
                                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
    case Pass::bwd_filter:
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, s.x, s.y, s.conv, s.w,
                                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

struct Perf {
  int algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t math;
};

template <class P>
Perf to_perf(const P& p) {
  return {static_cast<int>(p.algo), p.status, p.time, p.memory, p.determinism, p.mathType};
}

// Device memory for Find's trials, freed (after the stream is idle) when done.
struct TrialWorkspace {
  void* p = nullptr;
  size_t bytes = 0;
  cudaStream_t stream = nullptr;
  ~TrialWorkspace() {
    if (p) {
      cudaStreamSynchronize(stream);
      cudaFree(p);
    }
  }
};

constexpr size_t kMaxTrialWorkspace = size_t{1} << 30;  // 1 GiB

// Measures every algorithm on the step's buffers (x, w, y by role) and returns cuDNN's
// results, fastest first.
std::vector<Perf> measure(cudnnHandle_t h, cudaStream_t stream, const ConvSetup& s, void* x, void* w, void* y) {
  // As much workspace as the hungriest algorithm asks for, within limits: an algorithm
  // that needs more is simply not among the results.
  size_t want = 0;
  for (int algo = 0; algo < algo_count(s.pass); ++algo) {
    size_t b = 0;
    if (workspace_size(h, s, algo, &b) == CUDNN_STATUS_SUCCESS) want = std::max(want, b);
  }
  size_t free_bytes = 0, total_bytes = 0;
  SEAM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  want = std::min({want, kMaxTrialWorkspace, free_bytes / 2});
  TrialWorkspace ws;
  ws.stream = stream;
  while (want > 0) {
    cudaError_t e = cudaMalloc(&ws.p, want);
    if (e == cudaSuccess) {
      ws.bytes = want;
      break;
    }
    if (e != cudaErrorMemoryAllocation) SEAM_CUDA_CHECK(e);
    cudaGetLastError();  // clear the allocation failure
    ws.p = nullptr;
    want /= 2;
  }
  // The step's inputs were uploaded or zeroed on this stream; let that finish first.
  SEAM_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int n = algo_count(s.pass);
  int returned = 0;
  std::vector<Perf> out;
  switch (s.pass) {
    case Pass::fwd: {
      std::vector<cudnnConvolutionFwdAlgoPerf_t> r(static_cast<size_t>(n));
      SEAM_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, s.x, x, s.w, w, s.conv, s.y, y, n, &returned,
                                                              r.data(), ws.p, ws.bytes));
      for (int i = 0; i < returned; ++i) out.push_back(to_perf(r[static_cast<size_t>(i)]));
      break;
    }
    case Pass::bwd_data: {
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> r(static_cast<size_t>(n));
      SEAM_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, s.w, w, s.y, y, s.conv, s.x, x, n, &returned,
                                                                   r.data(), ws.p, ws.bytes));
      for (int i = 0; i < returned; ++i) out.push_back(to_perf(r[static_cast<size_t>(i)]));
      break;
    }
    case Pass::bwd_filter: {
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> r(static_cast<size_t>(n));
      SEAM_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, s.x, x, s.y, y, s.conv, s.w, w, n, &returned,
                                                                     r.data(), ws.p, ws.bytes));
      for (int i = 0; i < returned; ++i) out.push_back(to_perf(r[static_cast<size_t>(i)]));
      break;
    }
  }
  SEAM_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (auto& p : out)
    if (p.status == CUDNN_STATUS_SUCCESS && p.memory > ws.bytes) p.status = CUDNN_STATUS_ALLOC_FAILED;
  std::stable_sort(out.begin(), out.end(), [](const Perf& a, const Perf& b) {
    const bool ok_a = a.status == CUDNN_STATUS_SUCCESS, ok_b = b.status == CUDNN_STATUS_SUCCESS;
    if (ok_a != ok_b) return ok_a;
    return ok_a && a.time < b.time;
  });
  return out;
}

// The fastest successful deterministic result; the fastest successful one if no
// deterministic algorithm works for this shape.
std::optional<Perf> pick(const std::vector<Perf>& results) {
  for (auto& p : results)
    if (p.status == CUDNN_STATUS_SUCCESS && p.determinism == CUDNN_DETERMINISTIC) return p;
  for (auto& p : results)
    if (p.status == CUDNN_STATUS_SUCCESS) return p;
  return std::nullopt;
}

struct Chosen {
  int algo;
  size_t workspace;
};

// The math type the descriptor carries while Find measures.
cudnnMathType_t requested_math(Math m) {
  switch (m) {
    case Math::tf32: return CUDNN_DEFAULT_MATH;
    case Math::fma: return CUDNN_FMA_MATH;
    case Math::tensor: return CUDNN_TENSOR_OP_MATH;
  }
  return CUDNN_FMA_MATH;
}

// Sets the descriptor's math type for `c` and returns the algorithm with its workspace,
// or nothing if cuDNN no longer accepts it.
std::optional<Chosen> apply(cudnnHandle_t h, const ConvSetup& s, Math m, const ConvChoice& c) {
  const cudnnMathType_t math = m == Math::fma ? CUDNN_FMA_MATH : c.math;
  if (cudnnSetConvolutionMathType(s.conv, math) != CUDNN_STATUS_SUCCESS) return std::nullopt;
  size_t bytes = 0;
  if (workspace_size(h, s, c.algo, &bytes) != CUDNN_STATUS_SUCCESS) return std::nullopt;
  return Chosen{c.algo, bytes};
}

// The algorithm for this step: from the cache, else measured now (and remembered).
// x, w, y: the buffers by role; the step's output is one of them, which Find overwrites.
Chosen choose(const StepArgs& a, const ConvSetup& s, const ConvKey& key, void* x, void* w, void* y) {
  cudnnHandle_t h = cudnn_of(a.ctx);
  const Math m = key.math;
  const std::string text = key.str();
  const bool fixed = a.ctx.deterministic;  // a pick by algorithm number, not by time
  if (!fixed)
    if (auto c = cached_conv_choice(text))
      if (auto chosen = apply(h, s, m, *c)) return *chosen;
  SEAM_CUDNN_CHECK(cudnnSetConvolutionMathType(s.conv, requested_math(m)));
  std::vector<Perf> results = measure(h, a.ctx.stream, s, x, w, y);
  if (fixed)
    std::stable_sort(results.begin(), results.end(), [](const Perf& p, const Perf& q) {
      return p.algo != q.algo ? p.algo < q.algo : p.math < q.math;
    });
  std::optional<Perf> best = pick(results);
  if (!best) {
    std::string why;
    for (auto& p : results) why += " algo " + std::to_string(p.algo) + ": " + cudnnGetErrorString(p.status) + ";";
    fail(op_name(a.step.op), " '", a.step.name, "': cuDNN has no working algorithm for ", text, " (", why, ")");
  }
  ConvChoice c{best->algo, m == Math::fma ? CUDNN_FMA_MATH : best->math, best->memory};
  auto chosen = apply(h, s, m, c);
  if (!chosen)
    fail(op_name(a.step.op), " '", a.step.name, "': cuDNN measured algorithm ", best->algo, " for ", text,
         " but rejects its workspace query");
  c.workspace = chosen->workspace;
  if (!fixed) remember_conv_choice(text, c);
  return *chosen;
}

// The graph API's launch for this pass (conv_engine.h), or nothing: switched off, grouped
// (the classic API's group count has no counterpart there), or no engine runs it. Why not
// goes into the step's choices, beside the classic algorithm taken instead. TF32 takes it
// too: its engines round every operand to TF32 where the classic API's choices for small
// layers often compute in FMA, so their results are further from the CPU's (within TF32's
// rounding, scaled by the length of each sum: tests/gpu/conv_case.h), and ResNet-18's
// first-step gradients are as close to float64 as PyTorch's TF32 ones (docs/perf.md).
// A step with an epilogue (bias excepted: every engine takes it) whose fused graph no
// precompiled engine runs takes the plain graph and the caller's kernels after it:
// *fused says which (null: the step has no epilogue to split).
std::optional<Launch> try_engine(const StepArgs& a, const ConvKey& key, const EngineBuffers& buf,
                                 float* ms = nullptr, bool* fused = nullptr) {
  if (!engine_conv_enabled()) return std::nullopt;
  if (key.groups != 1) {
    a.ctx.choices.emplace_back(a.index, std::string(op_name(a.step.op)) + ": classic API (groups > 1)");
    return std::nullopt;
  }
  EngineConv c;
  c.pass = static_cast<int>(key.pass);
  for (int i = 0; i < 4; ++i) {
    c.x[i] = key.x[i];
    c.w[i] = key.w[i];
    c.y[i] = key.y[i];
  }
  for (int i = 0; i < 2; ++i) {
    c.stride[i] = key.stride[i];
    c.pad[i] = key.pad[i];
    c.dil[i] = key.dil[i];
  }
  c.dtype = a.in[0].dtype();
  c.out_dtype = a.out[0].dtype();
  c.tensor_math = key.math != Math::fma;
  c.nhwc = key.nhwc;
  c.bias = buf.b != nullptr;
  c.affine = buf.scale != nullptr;
  c.residual = buf.z != nullptr;
  c.relu = key.pass != Pass::bwd_filter && a.step.attrs.has("activation") && a.step.attrs.s("activation") == "relu";
  auto key_of = [&](const EngineConv& e) {
    return key.str() + (e.bias ? " bias=1" : "") + (e.affine ? " affine=1" : "") + (e.residual ? " residual=1" : "") +
           (e.relu ? " relu=1" : "") + (e.out_dtype != e.dtype ? std::string(" out=") + dtype_name(e.out_dtype) : "");
  };
  c.key = key_of(c);
  std::string why;
  std::optional<Launch> l = prepare_engine_conv(a, c, buf, &why, ms);
  if (fused) *fused = true;
  if (!l && fused && (c.affine || c.residual || c.relu)) {
    EngineConv plain = c;
    plain.affine = plain.residual = plain.relu = false;
    plain.key = key_of(plain);
    std::string plain_why;
    l = prepare_engine_conv(a, plain, buf, &plain_why, ms);
    if (l) {
      *fused = false;
      a.ctx.choices.emplace_back(a.index, std::string(op_name(a.step.op)) + ": the fused graph has no engine (" + why +
                                              "): the plain graph, then the epilogue's kernels");
      return l;
    }
  }
  if (!l)
    a.ctx.choices.emplace_back(a.index, std::string(op_name(a.step.op)) + ": classic API (the graph API: " + why + ")");
  return l;
}

// ---------------------------------------------------------------------------------------
// Preparers

// Descriptors and key of one step. xs / ws / ys: the x-shaped, filter and y-shaped
// operands, whichever buffers play those roles in this pass, with their shapes in the
// step's layout. Every operand has one dtype: cuDNN's convolutions take no output (not
// even the weight gradient) in another.
std::shared_ptr<ConvSetup> setup(const StepArgs& a, Pass pass, const Shape& xs, const Shape& ws, const Shape& ys,
                                 ConvKey& key) {
  expect_one_stored_dtype(a);
  const DType dt = a.in[0].dtype();
  const bool nhwc = step_nhwc(a);
  const Shape x = logical_nchw(a, xs, nhwc, "x");
  const Shape w = logical_nchw(a, ws, nhwc, "w");
  const Shape y = logical_nchw(a, ys, nhwc, "y");
  const Attrs& at = a.step.attrs;
  const auto& st = at.ints("stride");
  const auto& pd = at.ints("padding");
  const auto& dl = at.ints("dilation");
  const int64_t groups = at.i("groups");
  if (st.size() != 2 || pd.size() != 2 || dl.size() != 2)
    fail(op_name(a.step.op), " '", a.step.name, "': stride, padding and dilation need 2 entries each");

  key.pass = pass;
  for (int i = 0; i < 4; ++i) {
    key.x[i] = x[static_cast<size_t>(i)];
    key.w[i] = w[static_cast<size_t>(i)];
    key.y[i] = y[static_cast<size_t>(i)];
  }
  for (int i = 0; i < 2; ++i) {
    key.stride[i] = st[static_cast<size_t>(i)];
    key.pad[i] = pd[static_cast<size_t>(i)];
    key.dil[i] = dl[static_cast<size_t>(i)];
  }
  key.groups = groups;
  key.dtype = dtype_name(dt);
  key.math = dt != DType::f32 ? Math::tensor : a.ctx.tf32 ? Math::tf32 : Math::fma;
  key.nhwc = nhwc;
  if (!key.valid())
    fail(op_name(a.step.op), " '", a.step.name, "': not a convolution cuDNN can run: ", key.str(), " (x ",
         shape_str(xs), ", w ", shape_str(ws), ", y ", shape_str(ys), ")");

  auto s = std::make_shared<ConvSetup>();
  s->pass = pass;
  set_4d(a, s->x, dt, x, nhwc);
  set_4d(a, s->y, dt, y, nhwc);
  check_cudnn_count(a, {w[0], w[1], w[2], w[3]});
  // cuDNN's filter dims are (k, c, h, w) whatever the format; NHWC stores them KRSC.
  SEAM_CUDNN_CHECK(cudnnSetFilter4dDescriptor(s->w, cudnn_type(a, dt), cudnn_format(nhwc),
                                              cudnn_dim(a, w[0], "C_out"), cudnn_dim(a, w[1], "C_in/groups"),
                                              cudnn_dim(a, w[2], "kh"), cudnn_dim(a, w[3], "kw")));
  SEAM_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      s->conv, static_cast<int>(pd[0]), static_cast<int>(pd[1]), static_cast<int>(st[0]), static_cast<int>(st[1]),
      static_cast<int>(dl[0]), static_cast<int>(dl[1]), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  SEAM_CUDNN_CHECK(cudnnSetConvolutionGroupCount(s->conv, static_cast<int>(groups)));
  SEAM_CUDNN_CHECK(cudnnSetConvolutionMathType(s->conv, requested_math(key.math)));
  // cuDNN's own idea of the output must be the one the schema promised (logical dims).
  int n = 0, c = 0, h = 0, wd = 0;
  SEAM_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(s->conv, s->x, s->w, &n, &c, &h, &wd));
  if (n != y[0] || c != y[1] || h != y[2] || wd != y[3])
    fail(op_name(a.step.op), " '", a.step.name, "': cuDNN computes the output as [", n, ", ", c, ", ", h, ", ", wd,
         "] (NCHW), the graph has ", shape_str(ys), nhwc ? " (NHWC)" : "");
  return s;
}

// y[n, o, :, :] = b[o], for the convolution to add its result to (beta = 1): cuDNN blends
// in f32 and rounds y once, as the CPU rounds conv + bias. Adding the bias after the
// convolution would round a 16-bit y twice, and a sum near zero could change sign.
// Element i's channel is (i / plane) % channels: plane = OH * OW for NCHW, 1 for NHWC,
// where the channel is the fastest-moving index.
template <class T>
__global__ void fill_bias_kernel(const T* __restrict__ b, T* __restrict__ y, int64_t n, int64_t channels,
                                 int64_t plane) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = b[(i / plane) % channels];
}

bool relu_of(const StepArgs& a) { return a.step.attrs.s("activation") == "relu"; }

// inputs: x, w, b?; activation relu: relu of the result.
Launch prepare_conv2d(const StepArgs& a) {
  EngineBuffers buf{a.in[0].data, a.in[1].data, a.out[0].data};
  if (a.in.size() == 3) {
    const Shape& ys = a.out[0].shape();
    const int64_t channels = step_nhwc(a) ? ys.back() : ys.at(1);
    if (a.in[2].numel() != channels)
      fail("conv2d '", a.step.name, "': b has ", a.in[2].numel(), " values for ", channels, " output channels (y ",
           shape_str(ys), ")");
    buf.b = a.in[2].data;
  }
  Launch act;  // the classic API's: relu in place
  if (relu_of(a)) act = prepare_as_step(a, Op::relu, Attrs{}, {a.out[0]}, {a.out[0]});
  return prepare_conv_forward(a, buf, std::move(act));
}

}  // namespace

Launch prepare_conv_forward(const StepArgs& a, const EngineBuffers& buf, Launch epilogue) {
  StepArgs conv = a;  // the convolution's own operands
  conv.in = {a.in[0], a.in[1]};
  ConvKey key;
  auto s = setup(conv, Pass::fwd, a.in[0].shape(), a.in[1].shape(), a.out[0].shape(), key);
  bool fused = true;
  if (auto l = try_engine(a, key, buf, nullptr, &fused))
    return fused || !epilogue ? *l : in_order({std::move(*l), std::move(epilogue)});
  Launch fill;  // the bias, which the classic convolution adds its result to
  if (buf.b) {
    const int64_t n = a.out[0].numel(), channels = key.y[1], plane = key.nhwc ? 1 : key.y[2] * key.y[3];
    const unsigned blocks = blocks_for(n, 256, static_cast<int>(grid_cap(a.ctx)));
    dispatch_storage(a.out[0].dtype(), "conv2d", [&]<class T>() {
      fill = [b = static_cast<const T*>(buf.b), y = static_cast<T*>(buf.y), n, channels, plane,
              blocks](cudaStream_t st) {
        fill_bias_kernel<T><<<blocks, 256, 0, st>>>(b, y, n, channels, plane);
        SEAM_CUDA_LAUNCH_CHECK();
      };
    });
  }
  const Chosen ch = choose(conv, *s, key, buf.x, buf.w, buf.y);
  a.ctx.need_workspace(ch.workspace);
  Context* ctx = &a.ctx;
  cudnnHandle_t h = cudnn_of(a.ctx);
  const auto algo = static_cast<cudnnConvolutionFwdAlgo_t>(ch.algo);
  const size_t ws = ch.workspace;
  Launch run = [s, ctx, h, algo, ws, x = buf.x, w = buf.w, y = buf.y, fill](cudaStream_t stream) {
    if (fill) fill(stream);
    SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
    SEAM_CUDNN_CHECK(cudnnConvolutionForward(h, &kOne, s->x, x, s->w, w, s->conv, algo, ws ? ctx->workspace() : nullptr,
                                             ws, fill ? &kOne : &kZero, s->y, y));
  };
  return epilogue ? in_order({std::move(run), std::move(epilogue)}) : run;
}

namespace {

// inputs: dy, w, and with activation relu r (dx masked by r > 0) or with residual 1 z
// (added to dx); attribute shape = x's shape (in the step's layout, as every operand).
Launch prepare_conv2d_grad_input(const StepArgs& a) {
  const bool residual = a.step.attrs.has("residual") && a.step.attrs.i("residual") == 1;
  if (relu_of(a) && residual)
    fail("conv2d_grad_input '", a.step.name, "': relu's mask and a residual z are not taken together");
  if ((relu_of(a) || residual) != (a.in.size() == 3))
    fail("conv2d_grad_input '", a.step.name, "': r is given with activation relu, z with residual 1, and only then");
  ConvKey key;
  StepArgs conv = a;  // the convolution's operands: dy, w
  conv.in.resize(2);
  auto s = setup(conv, Pass::bwd_data, a.out[0].shape(), a.in[1].shape(), a.in[0].shape(), key);
  if (a.in.size() == 3) {
    expect_dtype(a, a.in[2], {a.out[0].dtype()});
    if (a.in[2].shape() != a.out[0].shape())
      fail("conv2d_grad_input '", a.step.name, "': ", residual ? "z " : "r ", shape_str(a.in[2].shape()), " and dx ",
           shape_str(a.out[0].shape()), " differ");
  }
  void* dy = a.in[0].data;
  void* w = a.in[1].data;
  void* dx = a.out[0].data;
  EngineBuffers buf{dx, w, dy};
  if (relu_of(a)) buf.r = a.in[2].data;
  if (residual) buf.z = a.in[2].data;
  // Where no fused graph runs: the plain gradient, then relu's mask or z's add in place,
  // with the elementwise kernels.
  Launch epilogue;
  if (relu_of(a)) epilogue = prepare_as_step(a, Op::relu_grad, Attrs{}, {a.out[0], a.in[2]}, {a.out[0]});
  if (residual) epilogue = prepare_as_step(a, Op::add, Attrs{}, {a.out[0], a.in[2]}, {a.out[0]});
  auto then_epilogue = [&](Launch l) { return epilogue ? in_order({std::move(l), epilogue}) : l; };
  bool fused = true;
  if (auto l = try_engine(a, key, buf, nullptr, &fused)) return fused ? *l : then_epilogue(*l);
  const Chosen ch = choose(a, *s, key, dx, w, dy);
  a.ctx.need_workspace(ch.workspace);
  Context* ctx = &a.ctx;
  cudnnHandle_t h = cudnn_of(a.ctx);
  const auto algo = static_cast<cudnnConvolutionBwdDataAlgo_t>(ch.algo);
  const size_t ws = ch.workspace;
  return then_epilogue([s, ctx, h, algo, ws, dy, w, dx](cudaStream_t stream) {
    SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
    void* work = ws ? ctx->workspace() : nullptr;
    SEAM_CUDNN_CHECK(
        cudnnConvolutionBackwardData(h, &kOne, s->w, w, s->y, dy, s->conv, algo, work, ws, &kZero, s->x, dx));
  });
}

// seam's own weight gradient (conv_wgrad.h) for a channels-last, ungrouped convolution on
// tensor cores, timed; not in deterministic mode, whose picks are fixed rules (cuDNN's).
struct OwnWgrad {
  Launch launch;
  float ms = 0;
  size_t workspace = 0;
  std::string chose;
};

std::optional<OwnWgrad> own_wgrad(const StepArgs& a, const ConvKey& key, void* x, void* dy) {
  if (!key.nhwc || key.groups != 1 || key.math == Math::fma) return std::nullopt;
  if (a.ctx.deterministic && !wgrad_forced()) return std::nullopt;
  WgradGeometry g;
  g.n = key.x[0], g.c = key.x[1], g.h = key.x[2], g.w = key.x[3];
  g.k = key.w[0], g.r = key.w[2], g.s = key.w[3];
  g.oh = key.y[2], g.ow = key.y[3];
  for (int i = 0; i < 2; ++i) g.stride[i] = key.stride[i], g.pad[i] = key.pad[i], g.dil[i] = key.dil[i];
  OwnWgrad o;
  std::string why;
  const size_t before = a.ctx.workspace_need();
  std::optional<Launch> l = prepare_own_wgrad(a, g, a.in[0].dtype(), a.out[0].dtype(), x, dy, a.out[0].data, &o.ms,
                                              &o.workspace, &o.chose, &why);
  a.ctx.set_workspace_need(before);  // the candidates' partials; own_wins asks for the pick's
  if (!l) {
    a.ctx.choices.emplace_back(a.index, "conv2d_grad_weight: not seam's kernel (" + why + ")");
    return std::nullopt;
  }
  o.launch = std::move(*l);
  return o;
}

// Whether `own` runs rather than cuDNN's pick, timed at cudnn_ms (negative: none timed);
// says which in the step's choices.
bool own_wins(const StepArgs& a, const std::optional<OwnWgrad>& own, float cudnn_ms) {
  if (!own) return false;
  const bool forced = wgrad_forced();
  const bool wins = forced || cudnn_ms < 0 || own->ms < cudnn_ms;
  char line[96] = "";
  if (!forced && cudnn_ms >= 0) std::snprintf(line, sizeof line, " against cuDNN's %.1f us", cudnn_ms * 1e3);
  std::string pick = wins ? ": seam's" : ": cuDNN's";
  if (forced) pick = std::string(" (SEAM_CONV_WGRAD=") + (wgrad_policy() == WgradPolicy::band ? "band" : "own") + ")";
  a.ctx.choices.emplace_back(a.index, "conv2d_grad_weight: " + own->chose + line + pick);
  if (wins) a.ctx.set_workspace_need(own->workspace);
  return wins;
}

// inputs: dy, x; attribute shape = w's shape (in the step's layout: KRSC for nhwc). dw
// may be f32 from 16-bit operands (attribute dtype, folded from its cast): the graph API
// writing it so directly, or dw in the operands' dtype into a scratch buffer that a cast
// then widens, whichever is faster (cuDNN offers few, and sometimes slow, engines for the
// first: measured 4x slower on 28x28 layers); the classic API takes the second way.
// seam's own kernel competes with all of them where it applies.
Launch prepare_conv2d_grad_weight(const StepArgs& a) {
  const DType dt = a.in[0].dtype();
  const bool wide = a.out[0].dtype() != dt;
  if (wide && !(a.out[0].dtype() == DType::f32 && is_half(dt)))
    fail("conv2d_grad_weight '", a.step.name, "': dw in ", dtype_name(a.out[0].dtype()), " from ", dtype_name(dt),
         " operands (only f32 from 16-bit ones)");
  StepArgs narrow = a;  // dw in the operands' dtype
  narrow.out[0].type.dtype = dt;
  ConvKey key;
  auto s = setup(narrow, Pass::bwd_filter, a.in[1].shape(), a.out[0].shape(), a.in[0].shape(), key);
  void* dy = a.in[0].data;
  void* x = a.in[1].data;
  const std::optional<OwnWgrad> own = own_wgrad(a, key, x, dy);
  if (own && wgrad_forced() && own_wins(a, own, -1)) return own->launch;
  Launch widen;
  if (!wide) {
    float ms = -1;
    if (auto l = try_engine(a, key, {x, a.out[0].data, dy}, &ms)) return own_wins(a, own, ms) ? own->launch : *l;
  } else {
    float direct_ms = -1, narrow_ms = -1;
    std::optional<Launch> direct = try_engine(a, key, {x, a.out[0].data, dy}, &direct_ms);
    void* scratch = a.ctx.scratch(narrow.out[0].type.bytes());
    narrow.out[0].data = scratch;
    widen = prepare_as_step(a, Op::cast, {{"dtype", std::string("f32")}}, {narrow.out[0]}, {a.out[0]});
    std::optional<Launch> in16 = try_engine(narrow, key, {x, scratch, dy}, &narrow_ms);
    if (in16) {
      const float cast_ms = time_in_graph(
          [&](cudaStream_t st) {
            widen(st);
            return true;
          },
          a.ctx.stream);
      char line[200];
      std::snprintf(line, sizeof line, "conv2d_grad_weight: f32 dw directly %.1f us, in %s and a cast %.1f + %.1f us",
                    direct_ms * 1e3, dtype_name(dt), narrow_ms * 1e3, cast_ms * 1e3);
      const bool narrow_wins = !direct || direct_ms < 0 ||
                               (!a.ctx.deterministic && narrow_ms >= 0 && narrow_ms + cast_ms < direct_ms);
      a.ctx.choices.emplace_back(a.index, std::string(line) + (narrow_wins ? ": the cast" : ": directly"));
      const float cudnn_ms = narrow_wins ? (narrow_ms < 0 ? -1 : narrow_ms + cast_ms) : direct_ms;
      const bool ours = own_wins(a, own, cudnn_ms);
      if (!narrow_wins || ours) a.ctx.release(scratch);
      if (ours) return own->launch;
      if (!narrow_wins) return *direct;
      return in_order({*in16, widen});
    }
    if (direct) {
      a.ctx.release(scratch);
      return own_wins(a, own, direct_ms) ? own->launch : *direct;
    }
    if (own_wins(a, own, -1)) {
      a.ctx.release(scratch);
      return own->launch;
    }
  }
  if (own_wins(a, own, -1)) return own->launch;
  void* dw = narrow.out[0].data;
  const Chosen ch = choose(narrow, *s, key, x, dw, dy);
  a.ctx.need_workspace(ch.workspace);
  Context* ctx = &a.ctx;
  cudnnHandle_t h = cudnn_of(a.ctx);
  const auto algo = static_cast<cudnnConvolutionBwdFilterAlgo_t>(ch.algo);
  const size_t ws = ch.workspace;
  return [s, ctx, h, algo, ws, dy, x, dw, widen](cudaStream_t stream) {
    SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
    void* work = ws ? ctx->workspace() : nullptr;
    SEAM_CUDNN_CHECK(
        cudnnConvolutionBackwardFilter(h, &kOne, s->x, x, s->y, dy, s->conv, algo, work, ws, &kZero, s->w, dw));
    if (widen) widen(stream);
  };
}

}  // namespace

void register_conv(PreparerTable& t) {
  set(t, Op::conv2d, prepare_conv2d);
  set(t, Op::conv2d_grad_input, prepare_conv2d_grad_input);
  set(t, Op::conv2d_grad_weight, prepare_conv2d_grad_weight);
}

}  // namespace seam::cuda
