// Convolutions through cuDNN's graph API (cudnn-frontend): every engine configuration the
// heuristics offer for one pass is built, each is timed on the step's own buffers as a
// step runs it (replayed inside a CUDA graph), and the fastest is kept. The classic API
// that conv.cu otherwise calls maps each of its few algorithms onto one engine it picks
// by itself; on the small channels-last layers of a ResNet those picks run several times
// slower than the engines PyTorch finds through the same graph API.
//
// The choice is kept per (pass, shapes, geometry, dtype, math, layout, bias) in a
// process-wide cache and saved beside the classic one ($XDG_CACHE_HOME/seam/, one file per
// GPU name and cuDNN version: cudnn-conv-engines-<gpu>-cudnn<version>.txt), as the
// engine's global id and knob choices, which cuDNN rebuilds without asking its
// heuristics again.
//
// File: a header line, then "<key> engine=<global id> knobs=<type>:<value>,... us=<time>"
// lines.
//
// Numerics: computes in f32 (16-bit data as "pseudo" bf16/half configurations); f32 data
// without TF32 excludes tensor-core engines; engines cuDNN marks non-deterministic or as
// reducing in reduced precision are excluded, so a step repeats its bits.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "backend/cuda/cuda.h"

namespace seam::cuda {

struct EngineConv {
  int pass = 0;                    // 0 forward, 1 data gradient, 2 filter gradient
  int64_t x[4]{}, w[4]{}, y[4]{};  // logical NCHW dims of the x-shaped, filter and y-shaped roles
  int64_t stride[2]{}, pad[2]{}, dil[2]{};
  DType dtype = DType::f32;        // of every operand but the output
  DType out_dtype = DType::f32;    // the output's: dtype, or f32 for a 16-bit filter gradient
  bool tensor_math = true;         // f32 data: TF32 tensor cores allowed
  bool nhwc = false;               // x, y channels-last and the filter KRSC
  // The forward's epilogue, in f32 before y is rounded once: y = conv(x, w) + b[c], or
  // (affine, conv2d_bn) conv(x, w) * scale[c] + shift[c] with f32 scale and shift; then + z
  // (residual, of y's type and shape); then relu. The data gradient's: dx masked by r > 0
  // (relu: cuDNN's pointwise RELU_BWD on the gradient before it is stored), or dx + z
  // (residual, z of x's type and shape: another gradient of x).
  bool bias = false;
  bool affine = false;
  bool residual = false;
  bool relu = false;
  std::string key;                 // the cache key: the classic cache's, with the epilogue
};

// By role, as EngineConv's dims: the output is one of them, which trials overwrite.
struct EngineBuffers {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  void* b = nullptr;
  void* r = nullptr;  // the data gradient's relu mask source, x-shaped
  void* scale = nullptr;  // affine: f32 per output channel
  void* shift = nullptr;
  void* z = nullptr;  // residual: y-shaped for the forward, x-shaped for the data gradient
};

// The fastest engine's launch, or nothing (with *why) where the graph API builds and runs
// no plan for this convolution; the caller then takes the classic API. Says what it chose
// in the context's choices, and its time per run in *ms (if given; as timed when it was
// chosen). Groups are the caller's to exclude (EngineConv has none).
std::optional<Launch> prepare_engine_conv(const StepArgs& a, const EngineConv& c, const EngineBuffers& buf,
                                          std::string* why, float* ms = nullptr);

// The forward convolution of step `a` (x = a.in[0], w = a.in[1] into y = a.out[0], the
// step's geometry attributes) with the epilogue `buf` names (affine, residual) and the
// step's activation, as one cuDNN graph where the graph API runs it; else the classic
// API's convolution followed by `epilogue`, the caller's kernels for the same (conv.cu).
Launch prepare_conv_forward(const StepArgs& a, const EngineBuffers& buf, Launch epilogue);

// Whether the graph API path is on: SEAM_CUDNN_CONV=classic turns it off (for comparing
// the two; the default is the graph API).
bool engine_conv_enabled();

}  // namespace seam::cuda
