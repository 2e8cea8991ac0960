// A convolution case for the GPU conv2d tests (NCHW and NHWC, f32 and 16-bit alike), the
// cases they all run, and readers of the algorithm cache's conv-*.txt files.
#pragma once
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "gpu_check.h"

namespace seam::gpu_testing {

// A 16-bit dtype of the convolution tests: through the precision pass (options) or as
// explicit 16-bit operands with no pass (direct).
struct Low {
  DType dtype;
  const char* name;
  CompareOptions options() const { return dtype == DType::bf16 ? gpu_testing::bf16() : gpu_testing::f16(); }
  Tolerance tol() const { return dtype == DType::bf16 ? Tolerance::bf16() : Tolerance::f16(); }
  CompareOptions direct() const { return CompareOptions(Precision::f32, tol()); }
};
constexpr Low kLows[] = {{DType::bf16, "bf16"}, {DType::f16, "f16"}};

struct ConvCase {
  Shape x, w;  // NCHW geometry: [N, C, H, W] and [C_out, C_in/groups, kh, kw]
  bool bias;
  Conv2dOptions o;
  // Without TF32. A large layer's gradients are float sums of thousands of terms that
  // largely cancel: an element near zero carries rounding far above f32()'s atol of 1e-6
  // on both devices (seen on the H200: 1.7e-5 on a weight gradient of 0.064, the tensor's
  // norm being ~1000x larger), while the relative L2 error stays below 1e-5.
  Tolerance no_tf32 = Tolerance::f32();
  // At TF32: Tolerance::tf32_nhwc(), whose elementwise floor was measured on sums of 288
  // terms. TF32 rounds every operand to 10 mantissa bits, so an element's error grows as
  // the square root of the terms it sums: the floor scales with the case's longest sum (the
  // weight gradient's N * Ho * Wo, the data gradient's C_out / groups * kh * kw, the
  // forward's C_in / groups * kh * kw). The weight gradient of [8, 16, 16, 16] sums 2048
  // terms, and one element came out 0.020 off (0.101 for 0.081) on cuDNN's graph-API
  // kernels: 2.5 standard deviations of that rounding among 4608 elements.
  Tolerance tf32() const {
    Tolerance t = Tolerance::tf32_nhwc();
    auto out_dim = [&](size_t i) {
      const int64_t extent = o.dilation[i] * (w[2 + i] - 1) + 1;
      return (x[2 + i] + 2 * o.padding[i] - extent) / o.stride[i] + 1;
    };
    const int64_t taps = w[2] * w[3];
    const int64_t longest = std::max({x[0] * out_dim(0) * out_dim(1), w[0] / o.groups * taps, w[1] * taps});
    if (longest > 288) t.atol *= std::sqrt(static_cast<double>(longest) / 288.0);
    return t;
  }
  std::string str() const {
    return "x " + shape_str(x) + " w " + shape_str(w) + (bias ? " +b" : "") + " stride " + shape_str(o.stride) +
           " pad " + shape_str(o.padding) + " dil " + shape_str(o.dilation) + " groups " + std::to_string(o.groups);
  }
};

// The cases of every conv2d test file (test_gpu_cudnn.cpp, test_gpu_nhwc.cpp,
// test_gpu_precision_conv.cpp); each adds its own with shared_conv_cases_and(). Their
// 16-bit tests without the pass pick some of these by position: add new ones at the end.
inline std::vector<ConvCase> shared_conv_cases() {
  return {
      // 3x3 with padding, batch 1, bias; 3x3 stride 2, no padding, batch 3, no bias
      {{1, 3, 7, 7}, {4, 3, 3, 3}, true, {.padding = {1, 1}}},
      {{3, 3, 7, 7}, {5, 3, 3, 3}, false, {.stride = {2, 2}}},
      // 1x1 (pointwise), batch 3, bias
      {{3, 4, 7, 7}, {6, 4, 1, 1}, true, {}},
      // groups 2
      {{3, 4, 7, 7}, {6, 2, 3, 3}, true, {.padding = {1, 1}, .groups = 2}},
      // depthwise (groups = C) with stride 2 and padding
      {{3, 4, 7, 7}, {4, 1, 3, 3}, true, {.stride = {2, 2}, .padding = {1, 1}, .groups = 4}},
      // asymmetric stride, padding and dilation on a non-square input
      {{3, 3, 7, 8}, {4, 3, 3, 2}, true, {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}}},
      // a layer of a real network's size, where cuDNN picks tensor-core algorithms
      {{8, 16, 16, 16}, {32, 16, 3, 3}, true, {.padding = {1, 1}}, {1e-5, 1e-4, 1e-4}},
  };
}

// shared_conv_cases(), then a file's own.
inline std::vector<ConvCase> shared_conv_cases_and(const std::vector<ConvCase>& own) {
  std::vector<ConvCase> all = shared_conv_cases();
  all.insert(all.end(), own.begin(), own.end());
  return all;
}

// The case as an NCHW conv2d. x is a parameter, so that conv2d_grad_input runs beside
// conv2d_grad_weight (and the bias gradient).
inline Var build_conv(GpuCase& c, const ConvCase& k) {
  Var x = c.param("x", k.x);
  Var w = c.param("w", k.w);
  std::optional<Var> b;
  if (k.bias) b = c.param("b", {k.w[0]});
  return conv2d(x, w, b, k.o);
}

// ------------------------------------------------------------------------------------------
// The algorithm cache's files (under XDG_CACHE_HOME/seam, see TempCacheDir)

inline const char* const kConvCacheHeader = "# seam cudnn conv algorithms v1 gpu=";

// An environment variable set while the object lives (the backend's switches).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// Convolutions on cuDNN's classic API while it lives (SEAM_CUDNN_CONV=classic): for the
// tests of the classic algorithm cache, which the graph API path never writes.
class ClassicConvApi : ScopedEnv {
 public:
  ClassicConvApi() : ScopedEnv("SEAM_CUDNN_CONV", "classic") {}
};

// The conv-*.txt files under a cache folder.
inline std::vector<std::filesystem::path> conv_files(const TempCacheDir& cache) {
  std::vector<std::filesystem::path> out;
  const std::filesystem::path dir = std::filesystem::path(cache.dir()) / "seam";
  if (!std::filesystem::exists(dir)) return out;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("conv-", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".txt")
      out.push_back(e.path());
  }
  return out;
}

inline std::vector<std::string> lines_of(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// How many of the lines start with prefix.
inline int lines_starting(const std::vector<std::string>& lines, const std::string& prefix) {
  int n = 0;
  for (const std::string& l : lines) n += l.rfind(prefix, 0) == 0;
  return n;
}

}  // namespace seam::gpu_testing
