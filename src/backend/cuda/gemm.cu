// cuBLASLt GEMMs: descriptors, algorithm choice by timing (or the heuristics' first when
// deterministic), and the choice of a step's variants; the cache records live in gemm_store.h.

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <system_error>

#include "backend/cuda/check.h"
#include "backend/cuda/graph_memset.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_store.h"
#include "common/file.h"

namespace seam::cuda {

namespace {


uint32_t low_bit_alignment(uint64_t v) {
  if (v == 0) return 256;
  uint64_t b = v & (~v + 1);
  return static_cast<uint32_t>(std::min<uint64_t>(b, 256));
}

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_RELU: return "RELU";
    case CUBLASLT_EPILOGUE_RELU_AUX: return "RELU_AUX";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS: return "RELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DRELU: return "DRELU";
    case CUBLASLT_EPILOGUE_DRELU_BGRAD: return "DRELU_BGRAD";
    case CUBLASLT_EPILOGUE_GELU: return "GELU";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADA: return "BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    default: return "?";
  }
}

bool uses_aux(cublasLtEpilogue_t e) { return (static_cast<uint32_t>(e) & 128u) != 0; }
bool uses_bias(cublasLtEpilogue_t e) {
  const auto v = static_cast<uint32_t>(e);
  return (v & (4u | 16u | 256u | 512u)) != 0;
}

// ---------------------------------------------------------------------------------------
// A prepared GEMM: descriptors, the buffers of each run, the chosen algorithm.

struct GemmPlan {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  std::vector<GemmOperands> calls;
  cublasLtMatmulAlgo_t algo{};

  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }

  // Enqueues every call with `al`; the first failing status, or success.
  cublasStatus_t run(const cublasLtMatmulAlgo_t& al, void* ws, size_t ws_bytes, cudaStream_t s) const {
    static const float one = 1.0f, zero = 0.0f;
    for (const GemmOperands& c : calls) {
      cublasStatus_t st = cublasLtMatmul(lt, desc, &one, c.a, a, c.b, b, c.c ? &one : &zero, c.c ? c.c : c.d, d, c.d,
                                         d, &al, ws, ws_bytes, s);
      if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
  }
};

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    SEAM_CUDA_CHECK(cudaEventCreate(&start));
    SEAM_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(stop);
    cudaEventDestroy(start);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

// Back-to-back runs for ~0.3 ms given the time of one, so that tiny GEMMs are not timed
// by the event resolution alone.
int reps_for(float once_ms) { return std::clamp(static_cast<int>(0.3f / std::max(once_ms, 1e-4f)), 2, 30); }

// Milliseconds per run of `run` (false: it failed to launch; then -1) as a step runs
// it: `reps` runs captured into one CUDA Graph and replayed. Timed with host launches, a
// small GEMM's two-kernel algorithm (split-K and its reduction) or a split variant pays a
// host launch per kernel that a replayed graph does not, and the fastest eagerly is not
// the fastest in the step; at large sizes both ways agree.
float time_runs(const std::function<bool(cudaStream_t)>& run, cudaStream_t s, EventPair& ev) {
  if (!run(s)) return -1.0f;  // warm-up, and the failures of a candidate
  SEAM_CUDA_CHECK(cudaEventRecord(ev.start, s));
  if (!run(s)) return -1.0f;
  SEAM_CUDA_CHECK(cudaEventRecord(ev.stop, s));
  SEAM_CUDA_CHECK(cudaEventSynchronize(ev.stop));
  float once = 0;
  SEAM_CUDA_CHECK(cudaEventElapsedTime(&once, ev.start, ev.stop));
  const int reps = reps_for(once);
  cudaGraph_t graph = nullptr;
  SEAM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  bool ok = true;
  try {
    for (int r = 0; r < reps && ok; ++r) ok = run(s);
  } catch (...) {
    cudaStreamEndCapture(s, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  SEAM_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  if (!ok) {
    cudaGraphDestroy(graph);
    return -1.0f;
  }
  cudaGraphExec_t exec = nullptr;
  try {
    memsets_as_kernels(graph);  // as the step's graph runs them
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  SEAM_CUDA_CHECK(inst);
  float total = 0;
  cudaError_t e = cudaGraphLaunch(exec, s);  // warm
  if (e == cudaSuccess) e = cudaEventRecord(ev.start, s);
  if (e == cudaSuccess) e = cudaGraphLaunch(exec, s);
  if (e == cudaSuccess) e = cudaEventRecord(ev.stop, s);
  if (e == cudaSuccess) e = cudaEventSynchronize(ev.stop);
  if (e == cudaSuccess) e = cudaEventElapsedTime(&total, ev.start, ev.stop);
  cudaGraphExecDestroy(exec);
  SEAM_CUDA_CHECK(e);
  return total / static_cast<float>(reps);
}

}  // namespace

float time_in_graph(const std::function<bool(cudaStream_t)>& run, cudaStream_t s) {
  EventPair ev;
  return time_runs(run, s, ev);
}

namespace {

// Milliseconds per run of `al` (all calls), or a negative number if it fails to launch.
float time_algo(const GemmPlan& p, const cublasLtMatmulAlgo_t& al, void* ws, cudaStream_t s, EventPair& ev) {
  return time_runs([&](cudaStream_t st) { return p.run(al, ws, kGemmWorkspaceBytes, st) == CUBLAS_STATUS_SUCCESS; },
                   s, ev);
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: fail("cuBLASLt GEMMs store f32, bf16 or f16, not ", dtype_name(t));
  }
}

std::string describe(const GemmShape& g, bool tf32, const std::string& what) {
  std::ostringstream s;
  s << what << ": cuBLASLt GEMM m=" << g.m << " n=" << g.n << " k=" << g.k << " op(A)=" << (g.trans_a ? "T" : "N")
    << " op(B)=" << (g.trans_b ? "T" : "N") << " lda=" << g.lda << " ldb=" << g.ldb << " ldc=" << g.ldc;
  if (g.batch > 1) s << " batch=" << g.batch << " strides=" << g.stride_a << "," << g.stride_b << "," << g.stride_c;
  s << " epilogue=" << epilogue_name(g.epilogue) << " A/B " << dtype_name(g.ab_type) << " D " << dtype_name(g.d_type)
    << (tf32 ? " (TF32)" : " (FP32 accumulate)") << (g.accumulate ? " beta=1" : "");
  return s.str();
}

}  // namespace

// ---------------------------------------------------------------------------------------

struct GemmCache::Impl {
  std::shared_ptr<Store> store;
  void* workspace = nullptr;  // for timing and trial runs at prepare time

  void* tuning_workspace() {
    if (!workspace) SEAM_CUDA_CHECK(cudaMalloc(&workspace, kGemmWorkspaceBytes));
    return workspace;
  }
};

void GemmCache::release_tuning_workspace() {
  if (!impl_->workspace) return;
  SEAM_CUDA_CHECK(cudaFree(impl_->workspace));  // waits for the trial runs that used it
  impl_->workspace = nullptr;
}

GemmCache::GemmCache() : impl_(new Impl) {
  try {
    DeviceId d = current_device();
    impl_->store = store_for(file_path(d), header_line(d));
  } catch (...) {
    delete impl_;
    throw;
  }
}

GemmCache::~GemmCache() {
  try {
    if (impl_->store) save(*impl_->store);
  } catch (...) {  // a cache that cannot be written is only a slower next start
  }
  if (impl_->workspace) cudaFree(impl_->workspace);
  delete impl_;
}

GemmCacheStats gemm_cache_stats() {
  Counters& c = counters();
  return {c.tuned.load(),           c.memory_hits.load(),    c.disk_hits.load(),
          c.rejected.load(),        c.malformed_lines.load(), c.files_written.load(),
          c.variants_timed.load(),  c.variant_hits.load()};
}

std::string gemm_cache_path() { return file_path(current_device()); }

namespace {

// The descriptors and the chosen algorithm of a GEMM, tuned on calls[0]'s buffers; null
// (with *why) where cuBLASLt has none and `why` is given, else an error.
std::shared_ptr<GemmPlan> plan_gemm(Context& ctx, const GemmShape& g, std::vector<GemmOperands> calls,
                                    GemmEpilogueData epi, const std::string& what, std::string* why) {
  SEAM_ASSERT(ctx.gemm_cache != nullptr && ctx.cublaslt != nullptr);
  SEAM_ASSERT(!calls.empty());
  SEAM_ASSERT(g.m > 0 && g.n > 0 && g.k > 0 && g.batch >= 1 && g.batch <= INT32_MAX);
  SEAM_ASSERT(g.lda >= (g.trans_a ? g.k : g.m) && g.ldb >= (g.trans_b ? g.n : g.k) && g.ldc >= g.m);
  SEAM_ASSERT(uses_aux(g.epilogue) == (epi.aux != nullptr) && uses_bias(g.epilogue) == (epi.bias != nullptr));
  SEAM_ASSERT(g.batch == 1 || g.epilogue == CUBLASLT_EPILOGUE_DEFAULT);
  SEAM_ASSERT(g.d_type == g.ab_type || g.d_type == DType::f32);
  for (const GemmOperands& c : calls) SEAM_ASSERT(g.accumulate == (c.c != nullptr));  // C may be D (in place)
  // TF32 is a rounding of f32 inputs: 16-bit ones reach the tensor cores as they are.
  const bool tf32 = ctx.tf32 && g.ab_type == DType::f32;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t type = cuda_type(g.ab_type), d_type = cuda_type(g.d_type);
  const uint64_t ab_size = dtype_size(g.ab_type), d_size = dtype_size(g.d_type);
  // Where cuBLASLt has no algorithm: an empty launch for try_prepare_gemm, else an error.
  auto none = [&](const std::string& reason) -> std::shared_ptr<GemmPlan> {
    if (!why) fail(describe(g, tf32, what), ": ", reason);
    *why = reason;
    return nullptr;
  };

  auto p = std::make_shared<GemmPlan>();
  p->lt = static_cast<cublasLtHandle_t>(ctx.cublaslt);
  p->calls = std::move(calls);

  // Descriptors.
  SEAM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
  const int32_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint32_t epilogue = static_cast<uint32_t>(g.epilogue);
  SEAM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  SEAM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  SEAM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  if (epi.bias)
    SEAM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epi.bias, sizeof epi.bias));
  if (epi.aux) {
    const int64_t aux_ld = g.aux_ld;
    SEAM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epi.aux,
                                                     sizeof epi.aux));
    SEAM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
  }
  // Stored (pre-op) shapes: A is [m, k] or, transposed, [k, m]; B is [k, n] or [n, k].
  auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, type, u(g.trans_a ? g.k : g.m), u(g.trans_a ? g.m : g.k), g.lda));
  SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, type, u(g.trans_b ? g.n : g.k), u(g.trans_b ? g.k : g.n), g.ldb));
  SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, d_type, u(g.m), u(g.n), g.ldc));
  if (g.batch > 1) {
    const int32_t count = static_cast<int32_t>(g.batch);
    const std::array<std::pair<cublasLtMatrixLayout_t, int64_t>, 3> layouts = {
        {{p->a, g.stride_a}, {p->b, g.stride_b}, {p->d, g.stride_c}}};
    for (auto& [l, stride] : layouts) {
      SEAM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      SEAM_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
  }

  // Alignments the algorithm may assume: of every call's pointers and, in a batch, of
  // each matrix after the first.
  uint64_t bits_a = 0, bits_b = 0, bits_d = 0;
  for (const GemmOperands& c : p->calls) {
    bits_a |= reinterpret_cast<uintptr_t>(c.a);
    bits_b |= reinterpret_cast<uintptr_t>(c.b);
    bits_d |= reinterpret_cast<uintptr_t>(c.d) | reinterpret_cast<uintptr_t>(c.c);  // C shares D's alignment
  }
  if (g.batch > 1) {
    bits_a |= static_cast<uint64_t>(g.stride_a) * ab_size;
    bits_b |= static_cast<uint64_t>(g.stride_b) * ab_size;
    bits_d |= static_cast<uint64_t>(g.stride_c) * d_size;
  }
  const uint32_t align_a = low_bit_alignment(bits_a), align_b = low_bit_alignment(bits_b),
                 align_d = low_bit_alignment(bits_d);
  const int64_t align_bias = epi.bias ? low_bit_alignment(reinterpret_cast<uintptr_t>(epi.bias)) : 0;
  const int64_t align_aux = epi.aux ? low_bit_alignment(reinterpret_cast<uintptr_t>(epi.aux)) : 0;

  const KeyValues kv = {g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b,
                        g.stride_c, static_cast<int64_t>(type), static_cast<int64_t>(d_type),
                        static_cast<int64_t>(compute), static_cast<int64_t>(epilogue), epi.aux ? g.aux_ld : 0,
                        epi.bias != nullptr, align_a, align_b, align_d, align_bias, align_aux, g.accumulate};
  const std::string key = key_text(kv);

  GemmCache::Impl& cache = ctx.gemm_cache->impl();
  Store& store = *cache.store;
  cudaStream_t stream = ctx.stream;

  // 1. The table: an entry chosen or verified in this process is used as it is; one read
  //    from the file must pass the library's check and a trial run first.
  bool have = false;
  std::optional<Entry> found;
  {
    std::lock_guard<std::mutex> lock(store.mu);
    auto it = store.entries.find(key);
    if (it != store.entries.end()) found = it->second;
  }
  if (ctx.deterministic) {
    found.reset();  // the heuristics' first, below, not a pick timed in another run
  } else if (found && found->checked) {
    p->algo = found->algo;
    have = true;
    counters().memory_hits += 1;
  } else if (found) {
    cublasLtMatmulHeuristicResult_t r{};
    bool ok = cublasLtMatmulAlgoCheck(p->lt, p->desc, p->a, p->b, p->d, p->d, &found->algo, &r) ==
                  CUBLAS_STATUS_SUCCESS &&
              r.workspaceSize <= kGemmWorkspaceBytes;
    if (ok) {
      ok = p->run(found->algo, cache.tuning_workspace(), kGemmWorkspaceBytes, stream) == CUBLAS_STATUS_SUCCESS;
      SEAM_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    std::lock_guard<std::mutex> lock(store.mu);
    if (ok) {
      Entry e = *found;
      e.checked = true;
      e.workspace = r.workspaceSize;
      store.entries[key] = e;
      p->algo = e.algo;
      have = true;
      counters().disk_hits += 1;
    } else {
      store.entries.erase(key);
      store.dirty = true;
      counters().rejected += 1;
    }
  }

  // 2. Otherwise the heuristic's candidates, timed on these buffers.
  if (!have) {
    cublasLtMatmulPreference_t pref = nullptr;
    SEAM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    std::array<cublasLtMatmulHeuristicResult_t, kGemmCandidates> res{};
    int returned = 0;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    {
      const uint64_t max_ws = kGemmWorkspaceBytes;
      auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* v, size_t n) {
        if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attr, v, n);
      };
      set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws);
      set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a);
      set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b);
      set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof align_d);
      set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d);
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(p->lt, p->desc, p->a, p->b, p->d, p->d, pref, kGemmCandidates, res.data(),
                                            &returned);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || returned <= 0)
      return none(std::string("cuBLASLt offers no algorithm (") +
                  (st != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusName(st) : "no candidates") + ")");

    std::vector<int> usable;
    for (int i = 0; i < returned; ++i)
      if (res[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS &&
          res[static_cast<size_t>(i)].workspaceSize <= kGemmWorkspaceBytes)
        usable.push_back(i);
    if (usable.empty()) return none("cuBLASLt's candidates all report failure");

    int best = -1;
    float best_ms = 0;
    if (usable.size() == 1 || ctx.deterministic) {
      best = usable[0];
    } else {
      void* ws = cache.tuning_workspace();
      EventPair ev;
      std::vector<float> ms(usable.size(), -1.0f);
      for (int round = 0; round < 2; ++round)  // the minimum of two rounds evens out noise
        for (size_t c = 0; c < usable.size(); ++c) {
          if (round > 0 && ms[c] < 0) continue;  // failed in the first round
          float t = time_algo(*p, res[static_cast<size_t>(usable[c])].algo, ws, stream, ev);
          if (t < 0) {
            ms[c] = -1.0f;
            continue;
          }
          ms[c] = round == 0 ? t : std::min(ms[c], t);
        }
      for (size_t c = 0; c < usable.size(); ++c)
        if (ms[c] >= 0 && (best < 0 || ms[c] < best_ms)) best = usable[c], best_ms = ms[c];
      if (best < 0) return none("none of cuBLASLt's " + std::to_string(usable.size()) + " candidates ran");
    }
    Entry e;
    e.algo = res[static_cast<size_t>(best)].algo;
    e.workspace = res[static_cast<size_t>(best)].workspaceSize;
    e.ns = static_cast<int64_t>(static_cast<double>(best_ms) * 1e6);
    e.checked = true;
    p->algo = e.algo;
    if (!ctx.deterministic) {  // a fixed pick is not a timed one to remember
      std::lock_guard<std::mutex> lock(store.mu);
      store.entries[key] = e;
      store.dirty = true;
      counters().tuned += 1;
    }
  }

  ctx.need_workspace(kGemmWorkspaceBytes);
  return p;
}

}  // namespace

Launch try_prepare_gemm(Context& ctx, const GemmShape& g, std::vector<GemmOperands> calls, GemmEpilogueData epi,
                        const std::string& what, std::string* why) {
  std::shared_ptr<const GemmPlan> plan = plan_gemm(ctx, g, std::move(calls), epi, what, why);
  if (!plan) return {};
  Context* c = &ctx;
  return [plan, c](cudaStream_t s) {
    SEAM_CUBLAS_CHECK(plan->run(plan->algo, c->workspace(), c->workspace_size(), s));
  };
}

GemmRun prepare_gemm_run(Context& ctx, const GemmShape& g, std::vector<GemmOperands> calls, const std::string& what) {
  SEAM_ASSERT(!g.accumulate);
  std::shared_ptr<const GemmPlan> plan = plan_gemm(ctx, g, std::move(calls), {}, what, nullptr);
  Context* c = &ctx;
  return [plan, c](const GemmOperands& o, cudaStream_t s) {
    static const float one = 1.0f, zero = 0.0f;
    SEAM_CUBLAS_CHECK(cublasLtMatmul(plan->lt, plan->desc, &one, o.a, plan->a, o.b, plan->b, &zero, o.d, plan->d, o.d,
                                     plan->d, &plan->algo, c->workspace(), kGemmWorkspaceBytes, s));
  };
}

Launch prepare_gemm(Context& ctx, const GemmShape& g, std::vector<GemmOperands> calls, GemmEpilogueData epi,
                    const std::string& what) {
  return try_prepare_gemm(ctx, g, std::move(calls), epi, what, nullptr);
}

}  // namespace seam::cuda

namespace seam::cuda {

namespace {

float time_launch(const Launch& l, cudaStream_t s, EventPair& ev) {
  return time_runs(
      [&](cudaStream_t st) {
        l(st);
        return true;
      },
      s, ev);
}

}  // namespace

Launch choose_variant(Context& ctx, int step, const std::string& key, std::vector<Variant> offered) {
  SEAM_ASSERT(ctx.gemm_cache != nullptr && is_word(key));
  std::vector<Variant> variants;
  std::string missing;  // the names of the variants not available, for ctx.choices
  for (Variant& v : offered) {
    SEAM_ASSERT(is_word(v.name));
    if (v.launch) {
      variants.push_back(std::move(v));
      continue;
    }
    missing += (missing.empty() ? "" : ", ") + v.name + (v.why_not.empty() ? "" : " (" + v.why_not + ")");
    if (v.unused) v.unused();
  }
  SEAM_ASSERT(!variants.empty());
  const std::string note_missing = missing.empty() ? "" : "; " + missing + " not available";
  std::string pick_key = key + ":";  // a pick holds among the variants it was timed against
  for (const Variant& v : variants) pick_key += (&v == &variants[0] ? "" : ",") + v.name;
  Store& store = *ctx.gemm_cache->impl().store;
  auto named = [&](const std::string& name) -> const Variant* {
    for (const Variant& v : variants)
      if (v.name == name) return &v;
    return nullptr;
  };
  auto keep = [&](const Variant* v) {
    for (const Variant& o : variants)
      if (&o != v && o.unused) o.unused();
    return v->launch;
  };
  if (ctx.epilogue != EpiloguePolicy::fastest) {
    const Variant* v = named(ctx.epilogue == EpiloguePolicy::fused ? "fused" : "split");
    if (ctx.epilogue == EpiloguePolicy::split_t && named("split_t")) v = named("split_t");
    if (ctx.epilogue == EpiloguePolicy::fused && named("wgmma")) v = named("wgmma");  // our GEMM's epilogue
    if (!v) v = named("split");
    if (!v) v = named("cublaslt");  // beside ours: cuBLASLt's GEMM, its own epilogue choice forced
    if (v) {
      ctx.choices.emplace_back(step, v->name + " (forced" + note_missing + ")");
      return keep(v);
    }
    // Variants that are not an epilogue's (attention's kernels): chosen as under fastest.
  }
  if (variants.size() == 1) {  // nothing to time, and no pick to keep
    ctx.choices.emplace_back(step, variants[0].name + " (only one" + note_missing + ")");
    return variants[0].launch;
  }
  if (ctx.deterministic) {  // the first offered, whatever timing would say
    ctx.choices.emplace_back(step, variants[0].name + " (deterministic: the first offered" + note_missing + ")");
    return keep(&variants[0]);
  }
  std::string cached;
  {
    std::lock_guard<std::mutex> lock(store.mu);
    if (auto it = store.picks.find(pick_key); it != store.picks.end()) cached = it->second.use;
  }
  if (const Variant* v = named(cached)) {  // freeing the others may synchronize: not under the lock
    counters().variant_hits += 1;
    ctx.choices.emplace_back(step, v->name + " (cached pick" + note_missing + ")");
    return keep(v);
  }
  std::vector<float> ms(variants.size(), 0.0f);
  {
    EventPair ev;
    for (int round = 0; round < 2; ++round)  // the minimum of two rounds evens out noise
      for (size_t i = 0; i < variants.size(); ++i) {
        const float t = time_launch(variants[i].launch, ctx.stream, ev);
        ms[i] = round == 0 ? t : std::min(ms[i], t);
      }
  }
  const size_t best = static_cast<size_t>(std::min_element(ms.begin(), ms.end()) - ms.begin());
  std::ostringstream note;
  note << variants[best].name << " (timed:";
  for (size_t i = 0; i < variants.size(); ++i) note << ' ' << variants[i].name << ' ' << ms[i] << " ms";
  note << note_missing << ")";
  ctx.choices.emplace_back(step, note.str());
  {
    std::lock_guard<std::mutex> lock(store.mu);
    store.picks[pick_key] = Pick{variants[best].name, static_cast<int64_t>(static_cast<double>(ms[best]) * 1e6)};
    store.dirty = true;
  }
  counters().variants_timed += 1;
  return keep(&variants[best]);
}

}  // namespace seam::cuda
