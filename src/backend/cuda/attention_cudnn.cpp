// Attention through cuDNN's fused flash attention (attention.h): the SDPA forward and
// backward nodes of the graph API, built by cudnn-frontend. cuDNN's "Stats" output is each
// query row's log-sum-exp of the scaled scores, which is seam's lse as it stands, so its
// forward and backward pair with the other variants'. The backward asks for cuDNN's
// deterministic algorithm (no atomics in dq) where the plan is deterministic; else the
// atomic one, faster by about a tenth (docs/perf.md).
#include <cudnn_frontend.h>

#include <memory>
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
  if (!ok(gr->validate(), "validate") || !ok(gr->build_operation_graph(h), "operation graph") ||
      !ok(gr->create_execution_plans({fe::HeurMode_t::A}), "heuristics") || !ok(gr->check_support(h), "support") ||
      !ok(gr->build_plans(h), "build"))
    return std::nullopt;
  int64_t ws = 0;
  if (!ok(gr->get_workspace_size(ws), "workspace")) return std::nullopt;
  a.ctx.need_workspace(static_cast<size_t>(ws));
  auto pack = std::make_shared<std::unordered_map<int64_t, void*>>();
  auto in = [](const void* p) { return const_cast<void*>(p); };  // cuDNN's map takes void* for inputs too
  if (!backward) {
    *pack = {{kQ, in(buf.q)}, {kK, in(buf.k)}, {kV, in(buf.v)}, {kO, buf.out_o}, {kStats, buf.out_lse}};
  } else {
    *pack = {{kQ, in(buf.q)},   {kK, in(buf.k)},    {kV, in(buf.v)}, {kO, in(buf.o)}, {kStats, in(buf.lse)},
             {kDo, in(buf.dout)}, {kDq, buf.dq},   {kDk, buf.dk},   {kDv, buf.dv}};
  }
  Context* ctx = &a.ctx;
  const std::string what = std::string(op_name(a.step.op)) + " '" + a.step.name + "'";
  return Launch([gr, pack, h, ctx, ws, what](cudaStream_t st) {
    SEAM_CUDNN_CHECK(cudnnSetStream(h, st));
    fe::error_t e = gr->execute(h, *pack, ws ? ctx->workspace() : nullptr);
    if (e.is_bad()) fail(what, ": cuDNN SDPA failed: ", e.get_message());
  });
}

}  // namespace seam::cuda
