// The three ways the CUDA backend computes attention and its gradient (the op is in
// src/ops/attention.cpp); attention.cu times those a step can use and keeps the fastest
// (choose_variant), per shape and precision:
//   cudnn - cuDNN's fused flash attention through the graph API (attention_cudnn.cpp);
//   flash - seam's own tiled kernels on tensor cores, bf16 and f16 (flash_attention.cu),
//           whose backward adds dq with atomics unless the plan is deterministic;
//   gemm  - the products on cuBLASLt with the [Tq, Tk] scores stored between them, a
//           chunk of heads at a time in the workspace (attention_gemm.cu): where neither
//           fused variant runs (f32 storage, TF32 or not; head sizes the kernels lack);
//   plain - one warp per row in f32 arithmetic, any storage type and head size up to 256
//           (attention.cu): what serves every shape, and checks the other two.
// All three write the same lse (each query row's natural log-sum-exp of its scaled
// scores, f32, [B, H, Tq]), so any forward pairs with any backward. All three read and
// write q, k, v, o and their gradients through strides: the unpacked op's contiguous
// [B, H, T, D] and attention_qkv's [B, T, 3, H, D] (with o [B, T, H, D]) alike.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "backend/cuda/cuda.h"

namespace seam::cuda {

// Element strides of a [B, H, T, D] operand (and of its gradient) whose D elements are
// contiguous.
struct Rows {
  int64_t batch, head, row;
#ifdef __CUDACC__
  __host__ __device__
#endif
  int64_t at(int64_t bh, int64_t heads) const { return bh / heads * batch + bh % heads * head; }
};
inline Rows contiguous_rows(int64_t h, int64_t t, int64_t d) { return {h * t * d, t * d, d}; }

struct AttentionGeom {
  int64_t b, h, tq, tk, d, dv;
  Rows q, k, v, o;  // o's also do's
  float scale;  // resolved: 1 / sqrt(D) where the op's attribute is 0
  bool causal;
  float dropout;  // of the probabilities; 0 outside training
  uint32_t stream;                   // the dropout's random stream
  const DeviceCounters* counters;    // its seed and step, read when a kernel runs
  int64_t bh() const { return b * h; }
};

// Operands by role; null where a pass has none.
struct AttentionBuffers {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *lse = nullptr, *dout = nullptr;
  void *out_o = nullptr, *out_lse = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

// Empty where the tiled kernels serve this storage type, geometry and buffers, else why not.
std::string flash_unavailable(DType t, const AttentionGeom& g, const AttentionBuffers& buf);
// The forward (q, k, v -> out_o, out_lse) or the backward (dout, q, k, v, o, lse -> dq,
// dk, dv; with f32 scratch of tq * bh floats for rowsum(do * o)). sums_in: null for the
// deterministic backward; else the context whose workspace (flash_dq_sums_bytes, read
// when the launch runs) takes dq's f32 sums, added with atomics.
Launch flash_forward(DType t, const AttentionGeom& g, const AttentionBuffers& buf);
Launch flash_backward(DType t, const AttentionGeom& g, const AttentionBuffers& buf, float* rows,
                      const Context* sums_in);
size_t flash_dq_sums_bytes(const AttentionGeom& g);

// cuDNN's SDPA forward or backward for this step, or nothing (with *why) where cuDNN builds
// no plan for it. Its workspace is the context's (need_workspace).
std::optional<Launch> cudnn_attention(const StepArgs& a, DType t, const AttentionGeom& g, const AttentionBuffers& buf,
                                      bool backward, std::string* why);

// The gemm variant for this step, or nothing (with *why). Its matrices take the context's
// workspace past kGemmWorkspaceBytes.
std::optional<Launch> gemm_attention(const StepArgs& a, DType t, const AttentionGeom& g, const AttentionBuffers& buf,
                                     bool backward, std::string* why);

}  // namespace seam::cuda
