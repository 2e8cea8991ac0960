// Small helpers shared by the cuDNN-backed kernels (conv.cu, pool.cu, batch_norm.cu):
// owning descriptor wrappers that launches keep alive through a shared_ptr, packed 4-d
// tensor descriptors (f32, bf16 or f16; NCHW or channels-last NHWC) with their dimensions
// checked against cuDNN's int range, the step's `layout` attribute (src/ops/layout.h), and
// the host-side blend factors cuDNN reads when a call is made.
#pragma once
#include <cudnn.h>

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "ops/layout.h"

namespace seam::cuda {

// A GPU name as it stands in a cache file's name: letters, digits, '-' and '.' kept,
// anything else '_'.
inline std::string cache_name_part(const std::string& s) {
  std::string out;
  for (char ch : s) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                    ch == '.';
    out += ok ? ch : '_';
  }
  return out.empty() ? "unknown" : out;
}

inline cudnnHandle_t cudnn_of(const Context& ctx) { return static_cast<cudnnHandle_t>(ctx.cudnn); }

// alpha = 1, beta = 0 / 1 (cuDNN reads them on the host during the call). Floats for f32,
// bf16 and f16 data alike: cuDNN takes float blend factors for every type but double.
inline const float kOne = 1.0f;
inline const float kZero = 0.0f;
inline const double kOneF64 = 1.0;
inline const double kZeroF64 = 0.0;

// One cuDNN descriptor, destroyed with its owner; not copyable (launches share it).
template <class T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class CudnnDesc {
 public:
  CudnnDesc() { SEAM_CUDNN_CHECK(Create(&d_)); }
  ~CudnnDesc() {
    if (d_) Destroy(d_);
  }
  CudnnDesc(const CudnnDesc&) = delete;
  CudnnDesc& operator=(const CudnnDesc&) = delete;
  T get() const { return d_; }
  operator T() const { return d_; }

 private:
  T d_ = nullptr;
};

using TensorDesc = CudnnDesc<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc = CudnnDesc<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc =
    CudnnDesc<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;
using PoolDesc = CudnnDesc<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;
using ActivationDesc =
    CudnnDesc<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor, cudnnDestroyActivationDescriptor>;

// cuDNN's 4-d descriptors take int dimensions and int strides: every dimension and the
// element count must fit. Fails naming the step otherwise.
inline int cudnn_dim(const StepArgs& a, int64_t v, const char* what) {
  if (v < 1 || v > INT_MAX)
    fail(op_name(a.step.op), " '", a.step.name, "': ", what, " = ", v, " is outside what cuDNN takes (1..", INT_MAX,
         ")");
  return static_cast<int>(v);
}

inline void check_cudnn_count(const StepArgs& a, std::initializer_list<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    n *= d;
    if (n > INT_MAX)
      fail(op_name(a.step.op), " '", a.step.name, "': a tensor of more than ", INT_MAX,
           " elements is outside what cuDNN's 4-d descriptors take");
  }
}

// cuDNN's name of a storage type; fails naming the step for any other dtype.
inline cudnnDataType_t cudnn_type(const StepArgs& a, DType t) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::f64: return CUDNN_DATA_DOUBLE;  // pooling only: the other steps take kStored
    default:
      fail(op_name(a.step.op), " '", a.step.name, "': cuDNN is given f32, bf16, f16 or f64 data, got ", dtype_name(t));
  }
}

// The step's layout: true for "nhwc", false for "nchw" or no attribute. Shape inference
// rejects other values; a plan that reached the backend another way fails here, naming
// the step, rather than running as NCHW.
inline bool step_nhwc(const StepArgs& a) {
  if (!a.step.attrs.has("layout")) return false;
  const std::string& l = a.step.attrs.s("layout");
  if (l != "nchw" && l != "nhwc")
    fail(op_name(a.step.op), " '", a.step.name, "': layout must be \"nchw\" or \"nhwc\", got \"", l, "\"");
  return l == "nhwc";
}

inline cudnnTensorFormat_t cudnn_format(bool nhwc) { return nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW; }

// The logical [N, C, H, W] dims of a 4-d operand whose shape is written in the step's
// layout ([N, H, W, C] for nhwc; a filter [C_out, kh, kw, C_in/g] maps the same way to
// [C_out, C_in/g, kh, kw]). cuDNN's descriptors, and every shape check, take these.
inline Shape logical_nchw(const StepArgs& a, const Shape& s, bool nhwc, const char* what) {
  if (s.size() != 4)
    fail(op_name(a.step.op), " '", a.step.name, "': ", what, " must be 4-d (layout ", nhwc ? "nhwc" : "nchw",
         "), got ", shape_str(s));
  return nhwc ? nchw_order(s) : s;
}

// A packed 4-d tensor descriptor of dtype t for the logical dims (n, c, h, w), stored
// NCHW or channels-last: cuDNN takes the logical dims with the format either way and
// derives the strides from it.
inline void set_4d(const StepArgs& a, const TensorDesc& d, DType t, int64_t n, int64_t c, int64_t h, int64_t w,
                   bool nhwc) {
  check_cudnn_count(a, {n, c, h, w});
  SEAM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, cudnn_format(nhwc), cudnn_type(a, t), cudnn_dim(a, n, "N"),
                                              cudnn_dim(a, c, "C"), cudnn_dim(a, h, "H"), cudnn_dim(a, w, "W")));
}

// The same from a logical [N, C, H, W] shape.
inline void set_4d(const StepArgs& a, const TensorDesc& d, DType t, const Shape& nchw, bool nhwc) {
  if (nchw.size() != 4) fail(op_name(a.step.op), " '", a.step.name, "': expected a 4-d tensor, got ", shape_str(nchw));
  set_4d(a, d, t, nchw[0], nchw[1], nchw[2], nchw[3], nhwc);
}

// A packed NCHW tensor descriptor of dtype t.
inline void set_nchw(const StepArgs& a, const TensorDesc& d, DType t, int64_t n, int64_t c, int64_t h, int64_t w) {
  set_4d(a, d, t, n, c, h, w, false);
}

inline void set_nchw(const StepArgs& a, const TensorDesc& d, DType t, const Shape& s) {
  if (s.size() != 4) fail(op_name(a.step.op), " '", a.step.name, "': expected an NCHW tensor, got ", shape_str(s));
  set_nchw(a, d, t, s[0], s[1], s[2], s[3]);
}

}  // namespace seam::cuda
