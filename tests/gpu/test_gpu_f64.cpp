// f64 on the GPU: the elementwise ops, reductions, pooling and elementwise groups (run op
// by op: the generated kernels compute in float) compute in double, against the CPU's
// double kernels. Inputs and parameters are random doubles that no float represents, and
// the tolerance (1e-12 relative) is far below float's 6e-8: a kernel that rounded through
// float would fail it. Gradients come back to f64 parameters and are held to the same.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ew_cases.h"
#include "test_util.h"

using namespace seam;

namespace {

struct F64Case {
  Graph g;
  std::vector<std::pair<std::string, std::vector<double>>> feeds;
  std::mt19937_64 rng{29};

  Var input(const std::string& name, Shape shape, double lo = -1, double hi = 1) {
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> v(static_cast<size_t>(numel(shape)));
    for (auto& x : v) x = u(rng);
    feeds.emplace_back(name, std::move(v));
    return g.input(name, std::move(shape), DType::f64);
  }
  Var param(const std::string& name, Shape shape, double lo = -1, double hi = 1) {
    return g.param(name, std::move(shape), Init::uniform(lo, hi), true, DType::f64);
  }
};

// out and the gradient of sum(out * r) (r random) for every parameter, on `device`.
std::vector<std::vector<double>> run_on(F64Case& c, Var out, Var loss, Device device, bool fuse) {
  Model m(c.g, {.seed = 5, .device = device, .precision = Precision::f32});
  CompileOptions co{.outputs = {out.id()}, .fuse = fuse};
  co.loss = loss.id();
  co.gradients = true;
  Program p = m.compile(co);
  for (auto& [name, v] : c.feeds) p.set_input(name, seam::testing::bytes_of(v));
  p.run();
  std::vector<std::vector<double>> r{Program::cast_bytes<double>(p.read(out.name()))};
  for (ValueId id : c.g.params()) r.push_back(p.grad_as<double>(c.g.value(id).name));
  return r;
}

void compare(const std::function<Var(F64Case&)>& build, bool fuse = false) {
  F64Case c;
  Var out = build(c);
  ASSERT_EQ(out.dtype(), DType::f64);
  Var loss = sum(mul(out, c.input("__weights", out.shape(), 0.5, 1.5)));
  const auto cpu = run_on(c, out, loss, Device::cpu, fuse);
  const auto gpu = run_on(c, out, loss, Device::cuda, fuse);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t t = 0; t < cpu.size(); ++t) {
    ASSERT_EQ(cpu[t].size(), gpu[t].size());
    int bad = 0;
    for (size_t i = 0; i < cpu[t].size() && bad < 5; ++i)
      if (!(std::abs(gpu[t][i] - cpu[t][i]) <= 1e-14 + 1e-12 * std::abs(cpu[t][i]))) {
        ADD_FAILURE() << (t == 0 ? "output" : "gradient " + std::to_string(t)) << " element " << i << ": gpu "
                      << gpu[t][i] << ", cpu " << cpu[t][i];
        ++bad;
      }
  }
}

// The vector path with and without a tail (2 doubles a pack), tiny and odd shapes.
const std::vector<Shape> kShapes = {{1}, {7}, {3, 7, 129}, {999, 1027}};

}  // namespace

TEST(GpuF64, UnaryOpsAndTheirGradients) {
  for (auto& u : gpu_testing::unary_cases())
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(u.name + " of " + shape_str(s));
      compare([&](F64Case& c) { return u.f(c.param("x", s, u.lo, u.hi)); });
    }
}

TEST(GpuF64, BinaryOpsBroadcastAndTheirGradients) {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{3}, {3}}, {{3, 7}, {7}}, {{3, 1}, {1, 7}}, {{999, 1027}, {999, 1027}}, {{6, 5, 24}, {5, 24}}, {{1000, 1}, {1000, 7}},
  };
  for (auto& [name, f] : gpu_testing::binary_ops())
    for (auto& [sa, sb] : pairs) {
      SCOPED_TRACE(name + " of " + shape_str(sa) + " and " + shape_str(sb));
      compare([&](F64Case& c) { return f(c.param("a", sa), c.param("b", sb, 0.5, 2)); });
    }
}

TEST(GpuF64, SumAndMeanOverAxes) {
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
  };
  const std::vector<Case> cases = {
      {{5, 7, 129}, {}},     {{5, 7, 129}, {1}},  {{5, 7, 129}, {0, 2}}, {{4099, 257}, {0}},
      {{4099, 257}, {1}},    {{2, 40000}, {1}},   {{1000, 3, 7}, {1}},   {{64, 3, 5000}, {-1}},
  };
  for (auto& k : cases)
    for (bool is_mean : {false, true}) {
      SCOPED_TRACE(std::string(is_mean ? "mean" : "sum") + " of " + shape_str(k.shape) + " over " + shape_str(k.axes));
      compare([&](F64Case& c) {
        Var x = c.param("x", k.shape);
        return is_mean ? mean(x, k.axes) : sum(x, k.axes);
      });
    }
}

TEST(GpuF64, PoolingAndItsGradients) {
  for (const Shape& s : {Shape{2, 3, 9, 9}, Shape{4, 16, 32, 32}}) {
    SCOPED_TRACE(shape_str(s));
    compare([&](F64Case& c) { return max_pool2d(c.param("x", s), {3, 3}, {2, 2}, {1, 1}); });
    compare([&](F64Case& c) { return avg_pool2d(c.param("x", s), {2, 2}); });
    compare([&](F64Case& c) { return avg_pool2d(c.param("x", s), {3, 3}, {2, 2}, {1, 1}, false); });
    compare([&](F64Case& c) { return global_avg_pool(c.param("x", s)); });
  }
}

TEST(GpuF64, ElementwiseGroupsRunOpByOpInDouble) {
  // A log-sum-exp over the rows (as the ONNX importer writes ReduceLogSumExp, its maximum a
  // max pool), fused into groups on both sides: the GPU runs the f64 groups op by op.
  for (bool fuse : {false, true}) {
    SCOPED_TRACE(fuse ? "fused" : "unfused");
    compare(
        [](F64Case& c) {
          Var x = c.param("x", {6, 1, 40, 1}, -3, 3);
          Var m = max_pool2d(x, {40, 1});  // [6, 1, 1, 1]
          return add(log(sum(exp(sub(x, m)), {2}, true)), m);
        },
        fuse);
  }
}
