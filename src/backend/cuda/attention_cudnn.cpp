// Attention through cuDNN's fused flash attention (attention.h): the SDPA forward and
// backward nodes of the graph API, built by cudnn-frontend. cuDNN's "Stats" output is each
// query row's log-sum-exp of the scaled scores, which is seam's lse as it stands, so its
// forward and backward pair with the other variants'. The backward asks for cuDNN's
// deterministic algorithm (no atomics in dq) where the plan is deterministic; else the
// atomic one, faster by about a tenth (docs/perf.md). Every plan cuDNN's heuristics build
// is timed once a shape (pick_plan), unless the plan is deterministic.
#include <cudnn_frontend.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>
#include <unordered_map>

#include "backend/cuda/attention.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cudnn_util.h"

namespace seam::cuda {

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDo, kDq, kDk, kDv };

std::shared_ptr<fe::graph::Graph> sdpa_graph(DType t, const AttentionGeom& g, bool backward, bool deterministic) {
  auto gr = std::make_shared<fe::graph::Graph>();
  gr->set_io_data_type(t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  // Dimensions [B, H, T, D] with each operand's own strides (attention.h).
  auto dims = [&](int64_t rows, int64_t d) { return std::vector<int64_t>{g.b, g.h, rows, d}; };
  auto strides = [](const Rows& r) { return std::vector<int64_t>{r.batch, r.head, r.row, 1}; };
  auto tensor = [&](const char* name, Uid uid, int64_t rows, int64_t d, const Rows& r) {
    return gr->tensor(
        fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims(rows, d)).set_stride(strides(r)));
  };
  auto output = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& x, Uid uid, int64_t rows, int64_t d,
                    const Rows& r) { x->set_output(true).set_uid(uid).set_dim(dims(rows, d)).set_stride(strides(r)); };
  const Rows stats_rows = contiguous_rows(g.h, g.tq, 1);
  auto q = tensor("q", kQ, g.tq, g.d, g.q), k = tensor("k", kK, g.tk, g.d, g.k), v = tensor("v", kV, g.tk, g.dv, g.v);
  if (!backward) {
    auto attrs = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(g.scale);
    if (g.causal) attrs.set_causal_mask(true);
    auto [o, stats] = gr->sdpa(q, k, v, attrs);
    output(o, kO, g.tq, g.dv, g.o);
    output(stats, kStats, g.tq, 1, stats_rows);
    stats->set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto o = tensor("o", kO, g.tq, g.dv, g.o), dout = tensor("do", kDo, g.tq, g.dv, g.o);
    auto stats = gr->tensor(fe::graph::Tensor_attributes()
                                .set_name("stats")
                                .set_uid(kStats)
                                .set_dim(dims(g.tq, 1))
                                .set_stride(strides(stats_rows))
                                .set_data_type(fe::DataType_t::FLOAT));
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_grad")
                     .set_attn_scale(g.scale)
                     .set_deterministic_algorithm(deterministic);
    if (g.causal) attrs.set_causal_mask(true);
    auto [dq, dk, dv] = gr->sdpa_backward(q, k, v, o, dout, stats, attrs);
    output(dq, kDq, g.tq, g.d, g.q);
    output(dk, kDk, g.tk, g.d, g.k);
    output(dv, kDv, g.tk, g.dv, g.v);
  }
  return gr;
}

// The plan a step runs: where `fixed`, the heuristics' first (a timed pick could differ
// between runs); else the fastest of those built, each timed on the step's buffers inside
// a CUDA graph, as the step runs it. The heuristics' first is not always the fastest: for
// GPT-2's causal forward (T = 1024, d = 64) on the H200, cuDNN 9.14 ranks a 64x256 tile
// first and PyTorch's 9.19 runs a 64x128 one in 0.88x its time.
struct Picked {
  int64_t index = -1, workspace = 0, built = 0;
  float ms = -1, first_ms = -1;
};

// The pick of each graph already timed in this process (its key: the graph's every input
// to cuDNN), so that a model's twelve layers of one shape time their plans once.
std::string plan_key(DType t, const AttentionGeom& g, bool backward) {
  int device = 0;
  SEAM_CUDA_CHECK(cudaGetDevice(&device));
  std::ostringstream k;
  k << device << ' ' << static_cast<int>(t) << (backward ? " b" : " f") << (g.causal ? " c" : " n");
  for (int64_t v : {g.b, g.h, g.tq, g.tk, g.d, g.dv}) k << ' ' << v;
  for (const Rows& r : {g.q, g.k, g.v, g.o}) k << ' ' << r.batch << ',' << r.head << ',' << r.row;
  k << ' ' << std::hexfloat << g.scale;
  return k.str();
}

Picked pick_plan(cudnnHandle_t h, fe::graph::Graph& g, std::unordered_map<int64_t, void*>& pack, bool fixed,
                 cudaStream_t stream, const std::string& key) {
  static std::mutex mu;
  static std::map<std::string, Picked> picked;
  Picked p;
  if (!fixed) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = picked.find(key);
    if (it != picked.end()) p = it->second;
  }
  const int64_t count = g.get_execution_plan_count();
  std::vector<std::pair<int64_t, int64_t>> built;  // index, workspace
  int64_t most = 0;
  for (int64_t i = 0; i < count; ++i) {
    int64_t ws = 0;
    if (!g.get_workspace_size_plan_at_index(i, ws).is_good()) continue;  // not built
    built.emplace_back(i, ws);
    most = std::max(most, ws);
  }
  if (p.index >= 0) {  // timed before: the same plan, if it built here too
    for (auto [i, ws] : built)
      if (i == p.index) return p;
    p = Picked{};
  }
  p.built = static_cast<int64_t>(built.size());
  if (built.empty()) return p;
  if (fixed || built.size() == 1) {
    p.index = built.front().first;
    p.workspace = built.front().second;
    return p;
  }
  void* trial_ws = nullptr;
  if (most > 0) SEAM_CUDA_CHECK(cudaMalloc(&trial_ws, static_cast<size_t>(most)));
  SEAM_CUDA_CHECK(cudaStreamSynchronize(stream));  // the step's inputs were written on this stream
  for (auto [i, ws] : built) {
    float ms = -1;
    try {
      ms = time_in_graph([&](cudaStream_t) { return g.execute_plan_at_index(h, pack, trial_ws, i).is_good(); }, stream);
    } catch (const Error&) {
      (void)cudaGetLastError();  // a plan that cannot run in a graph cannot run in the step's
    }
    if (i == built.front().first) p.first_ms = ms;
    if (ms >= 0 && (p.ms < 0 || ms < p.ms)) p.index = i, p.workspace = ws, p.ms = ms;
  }
  SEAM_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (trial_ws) SEAM_CUDA_CHECK(cudaFree(trial_ws));
  if (p.index >= 0) {
    std::lock_guard<std::mutex> lock(mu);
    picked[key] = p;
  }
  return p;
}

}  // namespace

std::optional<Launch> cudnn_attention(const StepArgs& a, DType t, const AttentionGeom& g, const AttentionBuffers& buf,
                                      bool backward, std::string* why) {
  if (t != DType::bf16 && t != DType::f16) {
    *why = "cuDNN's SDPA takes bf16 or f16 data";
    return std::nullopt;
  }
  if (g.dropout > 0) {  // cuDNN's own generator could not draw seam's masks
    *why = "dropout: cuDNN draws other masks than seam's";
    return std::nullopt;
  }
  cudnnHandle_t h = cudnn_of(a.ctx);
  SEAM_CUDNN_CHECK(cudnnSetStream(h, a.ctx.stream));
  std::shared_ptr<fe::graph::Graph> gr = sdpa_graph(t, g, backward, a.ctx.deterministic);
  auto ok = [&](fe::error_t e, const char* what) {
    if (e.is_good()) return true;
    *why = std::string("cuDNN ") + what + ": " + e.get_message();
    return false;
  };
  const bool fixed = a.ctx.deterministic;
  if (!ok(gr->validate(), "validate") || !ok(gr->build_operation_graph(h), "operation graph") ||
      !ok(gr->create_execution_plans({fe::HeurMode_t::A}), "heuristics") || !ok(gr->check_support(h), "support") ||
      !ok(gr->build_plans(h, fixed ? fe::BuildPlanPolicy_t::HEURISTICS_CHOICE : fe::BuildPlanPolicy_t::ALL), "build"))
    return std::nullopt;
  auto pack = std::make_shared<std::unordered_map<int64_t, void*>>();
  auto in = [](const void* p) { return const_cast<void*>(p); };  // cuDNN's map takes void* for inputs too
  if (!backward) {
    *pack = {{kQ, in(buf.q)}, {kK, in(buf.k)}, {kV, in(buf.v)}, {kO, buf.out_o}, {kStats, buf.out_lse}};
  } else {
    *pack = {{kQ, in(buf.q)},   {kK, in(buf.k)},    {kV, in(buf.v)}, {kO, in(buf.o)}, {kStats, in(buf.lse)},
             {kDo, in(buf.dout)}, {kDq, buf.dq},   {kDk, buf.dk},   {kDv, buf.dv}};
  }
  const Picked p = pick_plan(h, *gr, *pack, fixed, a.ctx.stream, plan_key(t, g, backward));
  if (p.index < 0) {
    *why = "cuDNN: none of the " + std::to_string(p.built) + " SDPA plans built ran";
    return std::nullopt;
  }
  a.ctx.need_workspace(static_cast<size_t>(p.workspace));
  std::string name;
  (void)gr->get_plan_name_at_index(p.index, name);
  char line[200];
  if (p.ms >= 0)
    std::snprintf(line, sizeof line, ", %.1f us in a graph, fastest of %lld built (heuristics' first %.1f us)",
                  p.ms * 1e3, static_cast<long long>(p.built), p.first_ms * 1e3);
  else
    std::snprintf(line, sizeof line, ", the heuristics' first%s", fixed ? " (deterministic)" : "");
  a.ctx.choices.emplace_back(a.index, std::string(op_name(a.step.op)) + ": cuDNN SDPA " + name + line);
  Context* ctx = &a.ctx;
  const std::string what = std::string(op_name(a.step.op)) + " '" + a.step.name + "'";
  const int64_t index = p.index, ws = p.workspace;
  return Launch([gr, pack, h, ctx, ws, index, what](cudaStream_t st) {
    SEAM_CUDNN_CHECK(cudnnSetStream(h, st));
    fe::error_t e = gr->execute_plan_at_index(h, *pack, ws ? ctx->workspace() : nullptr, index);
    if (e.is_bad()) fail(what, ": cuDNN SDPA failed: ", e.get_message());
  });
}

}  // namespace seam::cuda
