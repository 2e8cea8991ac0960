// The classic convolution API's algorithm choices: their keys and the process-wide cache
// conv.cu keeps them in.
//
// Each step builds its descriptors once, then picks an algorithm for its shape: the
// fastest one cudnnFind*AlgorithmEx measures on the step's own buffers (the executable
// keeps a copy of outputs outside the arena while a step is prepared), among the
// deterministic ones when there is any. The choice is kept in a process-wide cache keyed
// by (pass, x/w/y shapes, stride, padding, dilation, groups, dtype, math, layout) and
// saved to $XDG_CACHE_HOME/seam/ (else $HOME/.cache/seam/), one text file per GPU name and
// cuDNN version, so a later run measures nothing it has measured before.
//
// Cache file: a header line, then one line per choice, e.g.
//   # seam cudnn conv algorithms v1 gpu=NVIDIA_H200 cudnn=91400
//   fwd x=8,3,32,32 w=16,3,3,3 y=8,16,32,32 stride=1,1 pad=1,1 dil=1,1 groups=1 dtype=f32 math=tf32 layout=nchw algo=1 algo_math=0 ws=4096
//   bwd_data x=8,3,32,32 w=16,3,3,3 y=8,16,32,32 stride=1,1 pad=1,1 dil=1,1 groups=1 dtype=bf16 math=tensor layout=nhwc algo=1 algo_math=1 ws=0
// x, w and y are the logical NCHW dims ([N, C, H, W], [C_out, C_in/groups, kh, kw],
// [N, C_out, OH, OW]) in either layout, so that one geometry reads the same in both and
// the validity check is one; layout says how the buffers are stored. math is tf32 or fma
// for f32 data, tensor for bf16 and f16. A file whose header differs is ignored; a line
// that does not parse, or whose geometry is not a valid convolution, is skipped (its
// shape is measured again and the file rewritten). A cached algorithm is still checked
// with cuDNN before use.
// The 16-bit lines and the layout token left the header at v1: the dtype was always part
// of the key, and a build that knows only f32 (or only NCHW) skips the lines it cannot
// parse, while a new header would make builds of either kind that share a cache folder
// discard each other's whole file. A line without the layout token, written before it
// existed, is read as layout=nchw and rewritten with it.
#pragma once
#include <cudnn.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>

#include "ops/geometry.h"

namespace seam::cuda {

enum class Pass : int { fwd = 0, bwd_data = 1, bwd_filter = 2 };
constexpr const char* kPassName[] = {"fwd", "bwd_data", "bwd_filter"};

inline int algo_count(Pass p) {
  switch (p) {
    case Pass::fwd:
      return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case Pass::bwd_data:
      return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    case Pass::bwd_filter:
      return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  }
  return 0;
}

// The requested math: for f32 data TF32 allowed (DEFAULT_MATH) or not (FMA_MATH); for
// 16-bit data tensor cores (TENSOR_OP_MATH), with f32 accumulation either way.
enum class Math : int { tf32 = 0, fma = 1, tensor = 2 };
constexpr const char* kMathName[] = {"tf32", "fma", "tensor"};

struct ConvKey {
  Pass pass = Pass::fwd;
  // Roles: x-shaped, filter, y-shaped (dy for gradients); logical NCHW dims in either layout.
  int64_t x[4]{}, w[4]{}, y[4]{};
  int64_t stride[2]{}, pad[2]{}, dil[2]{};
  int64_t groups = 1;
  std::string dtype = "f32";  // of x, w and y alike
  Math math = Math::tf32;
  bool nhwc = false;  // x, y NHWC and the filter KRSC

  // x [N, C, H, W], w [O, C/g, kh, kw] and y [N, O, OH, OW] form a valid convolution.
  bool valid() const {
    for (int i = 0; i < 4; ++i)
      if (x[i] < 1 || w[i] < 1 || y[i] < 1 || x[i] > INT32_MAX || w[i] > INT32_MAX || y[i] > INT32_MAX) return false;
    for (int i = 0; i < 2; ++i)
      if (stride[i] < 1 || pad[i] < 0 || dil[i] < 1 || stride[i] > INT32_MAX || pad[i] > INT32_MAX ||
          dil[i] > INT32_MAX)
        return false;
    if (groups < 1 || groups > INT32_MAX || x[1] % groups || w[0] % groups || w[1] * groups != x[1]) return false;
    if (y[0] != x[0] || y[1] != w[0]) return false;
    for (int i = 0; i < 2; ++i) {
      if (x[2 + i] + 2 * pad[i] < dil[i] * (w[2 + i] - 1) + 1) return false;
      if (y[2 + i] != window_out(x[2 + i], w[2 + i], stride[i], pad[i], dil[i])) return false;
    }
    if (dtype == "f32") return math != Math::tensor;
    return (dtype == "bf16" || dtype == "f16") && math == Math::tensor;
  }

  // with_layout = false: the key as lines before the layout token wrote it (nchw only).
  std::string str(bool with_layout = true) const {
    std::ostringstream s;
    auto list = [&](const char* name, const int64_t* v, int n) {
      s << ' ' << name << '=';
      for (int i = 0; i < n; ++i) s << (i ? "," : "") << v[i];
    };
    s << kPassName[static_cast<int>(pass)];
    list("x", x, 4);
    list("w", w, 4);
    list("y", y, 4);
    list("stride", stride, 2);
    list("pad", pad, 2);
    list("dil", dil, 2);
    s << " groups=" << groups << " dtype=" << dtype << " math=" << kMathName[static_cast<int>(math)];
    if (with_layout) s << " layout=" << (nhwc ? "nhwc" : "nchw");
    return s.str();
  }
};

struct ConvChoice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;  // as Find reported it
  size_t workspace = 0;                       // informational; re-queried before use
};

inline bool valid_math(int64_t m) {
  return m == CUDNN_DEFAULT_MATH || m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ||
         m == CUDNN_FMA_MATH;
}

// The process-wide cache, one store per GPU name and cuDNN version, read from and saved
// to the cache folder the environment names when a store is first used (conv_cache.cpp).
std::optional<ConvChoice> cached_conv_choice(const std::string& key);
void remember_conv_choice(const std::string& key, const ConvChoice& c);

}  // namespace seam::cuda
