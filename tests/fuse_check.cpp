// Fused plans against unfused ones (tests/fuse_check.h).
#include "fuse_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/backend.h"
#include "common/half.h"
#include "plan/explain.h"
#ifdef SEAM_HAS_CUDA
#include "backend/cuda/codegen.h"
#endif

namespace seam::testing {

namespace {

// Element i of a float tensor's bytes, as a double.
double element(const std::vector<std::byte>& b, DType t, size_t i) {
  const std::byte* at = b.data() + i * dtype_size(t);
  uint16_t h = 0;
  float f = 0;
  double d = 0;
  switch (t) {
    case DType::f64: std::memcpy(&d, at, 8); return d;
    case DType::bf16: std::memcpy(&h, at, 2); return bf16_to_float(h);
    case DType::f16: std::memcpy(&h, at, 2); return f16_to_float(h);
    default: std::memcpy(&f, at, 4); return f;
  }
}

// Bitwise equal, except that any NaN equals any NaN: which operand's NaN an add or mul
// passes on (and so its sign bit) depends on the order the compiler put them in. With a
// tolerance, within it relative to the larger of 1 and |b|.
std::string differences(const std::vector<std::byte>& a, const std::vector<std::byte>& b, DType t, double tol) {
  if (a.size() != b.size()) return "sizes differ";
  const size_t size = dtype_size(t);
  std::string s;
  for (size_t i = 0; (i + 1) * size <= a.size(); ++i) {
    const double x = element(a, t, i), y = element(b, t, i);
    const bool same = tol > 0 ? std::abs(x - y) <= tol * std::max(1.0, std::abs(y))
                              : std::memcmp(a.data() + i * size, b.data() + i * size, size) == 0;
    if (!same && !(std::isnan(x) && std::isnan(y)))
      s += "[" + std::to_string(i) + "] " + std::to_string(x) + " vs " + std::to_string(y) + "\n";
  }
  return s;
}

// Random values in [-2, 2) as the bytes of a dtype.
std::vector<std::byte> random_bytes(const TensorType& t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> b(t.bytes());
  for (size_t i = 0; i < static_cast<size_t>(t.numel()); ++i) {
    const float v = std::uniform_real_distribution<float>(-2, 2)(rng);
    std::byte* at = b.data() + i * dtype_size(t.dtype);
    const uint16_t h = t.dtype == DType::bf16 ? float_to_bf16(v) : float_to_f16(v);
    const double d = v;
    if (t.dtype == DType::f64) std::memcpy(at, &d, 8);
    else if (is_half(t.dtype)) std::memcpy(at, &h, 2);
    else std::memcpy(at, &v, 4);
  }
  return b;
}

}  // namespace

Plan expect_same_bits(const Graph& g, Var loss, const std::vector<Var>& outputs, const std::string& what,
                      Precision policy, double tol) {
  std::vector<std::pair<DType, std::vector<std::byte>>> got[2];
  Plan fused_plan;
  for (bool fuse : {false, true}) {
    Model m(g, {.seed = 5, .precision = policy});
    CompileOptions o{.loss = loss.id(), .gradients = true, .fuse = fuse};
    for (Var v : outputs) o.outputs.push_back(v.id());
    Program p = m.compile(o);
    for (ValueId id : g.inputs())
      p.set_input(g.value(id).name, random_bytes(g.value(id).type, static_cast<uint32_t>(id)));
    p.run();
    auto& r = got[fuse];
    r.emplace_back(loss.dtype(), p.read(loss.name()));
    for (Var v : outputs) r.emplace_back(v.dtype(), p.read(v.name()));
    for (ValueId id : g.params()) r.emplace_back(g.value(id).type.dtype, p.read_grad(g.value(id).name));
    if (fuse) fused_plan = p.plan();
  }
  EXPECT_EQ(got[0].size(), got[1].size());
  for (size_t i = 0; i < got[0].size(); ++i) {
    const std::string d = differences(got[0][i].second, got[1][i].second, got[0][i].first, tol);
    EXPECT_TRUE(d.empty()) << what << ": tensor " << i << " differs\n" << d << fused_plan.str();
  }
  return fused_plan;
}

void expect_kernels_compile(const Plan& plan) {
#ifdef SEAM_HAS_CUDA
  for (auto& s : plan.steps)
    if (auto k = generated_kernel_report(s)) {
      EXPECT_GT(k->registers, 0) << s.attrs.s("program");
    }
#else
  (void)plan;
#endif
}


}  // namespace seam::testing
