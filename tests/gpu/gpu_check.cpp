// GPU against CPU comparisons.
#include "../test_util.h"
#include "gpu_check.h"

#include "io/model_file.h"

#include <algorithm>
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace seam::gpu_testing {

using seam::testing::bytes_of;

Var GpuCase::param(const std::string& name, Shape shape, double lo, double hi, bool decay) {
  return g.param(name, std::move(shape), Init::uniform(lo, hi), decay);
}

Var GpuCase::data(const std::string& name, Shape shape, double lo, double hi, DType dtype) {
  Var v = g.input(name, shape, dtype);
  std::uniform_real_distribution<float> d(static_cast<float>(lo), static_cast<float>(hi));
  std::vector<float> x(static_cast<size_t>(numel(shape)));
  for (auto& e : x) e = d(rng_);
  if (dtype == DType::f32) {
    feeds.emplace_back(name, bytes_of(x));
  } else {
    SEAM_ASSERT(is_half(dtype));
    std::vector<uint16_t> bits(x.size());
    for (size_t i = 0; i < x.size(); ++i) bits[i] = float_to_half(x[i], dtype);
    feeds.emplace_back(name, bytes_of(bits));
  }
  return v;
}

Var GpuCase::labels(const std::string& name, Shape shape, int32_t n) {
  std::uniform_int_distribution<int32_t> d(0, n - 1);
  std::vector<int32_t> x(static_cast<size_t>(numel(shape)));
  for (auto& e : x) e = d(rng_);
  return ints(name, std::move(shape), std::move(x));
}

Var GpuCase::ints(const std::string& name, Shape shape, std::vector<int32_t> values) {
  Var v = g.input(name, shape, DType::i32);
  feeds.emplace_back(name, bytes_of(values));
  return v;
}

Var GpuCase::state(const std::string& name, Shape shape, Init init) { return g.state(name, std::move(shape), init); }

double expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, const Tolerance& tol,
                    const std::string& what) {
  EXPECT_EQ(gpu.size(), cpu.size()) << what;
  if (gpu.size() != cpu.size()) return INFINITY;
  double diff = 0, ref = 0;
  for (float c : cpu) ref += static_cast<double>(c) * c;
  const double floor_abs = tol.atol + tol.rms_atol * std::sqrt(ref / std::max<double>(1, static_cast<double>(cpu.size())));
  size_t worst = 0;
  double worst_excess = 0;
  bool finite = true;
  for (size_t i = 0; i < gpu.size(); ++i) {
    double d = static_cast<double>(gpu[i]) - cpu[i];
    finite = finite && std::isfinite(gpu[i]);
    diff += d * d;
    double excess = std::abs(d) - (floor_abs + tol.elem_rel * std::abs(cpu[i]));
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  double rel = std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
  EXPECT_TRUE(finite) << what << ": the GPU produced NaN or inf";
  // Within tol.rel of the reference's norm, or within the norm of atol in every element: a
  // gradient that is zero in exact arithmetic (attention's dq at one key) comes out as
  // rounding residue on both sides, whose ratio means nothing.
  const double floor = tol.atol * std::sqrt(static_cast<double>(gpu.size()));
  EXPECT_LE(std::sqrt(diff), std::max(tol.rel * std::sqrt(ref), floor))
      << what << ": relative L2 error " << rel << " (L2 error " << std::sqrt(diff) << ")";
  EXPECT_LE(worst_excess, 0.0) << what << "[" << worst << "]: GPU " << gpu[worst] << ", CPU " << cpu[worst];
  return rel;
}

TempCacheDir::TempCacheDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "seam-cache-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) ADD_FAILURE() << "mkdtemp " << tmpl << ": " << std::strerror(errno);
  dir_ = tmpl;
  const char* old = std::getenv("XDG_CACHE_HOME");
  had_old_ = old != nullptr;
  if (old) old_ = old;
  use();
}

TempCacheDir::~TempCacheDir() {
  if (had_old_) setenv("XDG_CACHE_HOME", old_.c_str(), 1);
  else unsetenv("XDG_CACHE_HOME");
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void TempCacheDir::use() const { setenv("XDG_CACHE_HOME", dir_.c_str(), 1); }

double compare_with_cpu(const std::function<Var(GpuCase&)>& build, const CompareOptions& o) {
  GpuCase c(17);
  Var out = build(c);
  Var loss;
  std::vector<ValueId> outputs{out.id()};
  if (o.gradients && o.output_is_loss) {
    loss = out;
  } else if (o.gradients) {
    Var r = c.data("__weights", out.shape(), 0.5, 1.5);
    loss = sum(mul(out, r));
  }
  std::vector<std::string> params;
  for (ValueId id : c.g.params()) params.push_back(c.g.value(id).name);
  const std::string out_name = out.name();

  auto options = [&] {
    CompileOptions co{.mode = o.mode, .outputs = outputs, .fuse = o.fuse, .recompute = o.recompute,
                      .output_chunks = o.output_chunks};
    if (o.gradients) co.loss = loss.id(), co.gradients = true;
    return co;
  };
  size_t budget = 0;
  if (o.budget_just_under) {
    Model m(c.g, {.seed = 23, .precision = o.precision, .layout = o.layout});
    const size_t arena = m.compile(options()).plan().arena_bytes;
    budget = m.device_bytes() + arena - 1;
  }
  auto run = [&](Device d, std::vector<std::vector<float>>& results) {
    Model m(c.g, {.seed = 23, .device = d, .precision = o.precision, .layout = o.layout, .epilogue = o.epilogue,
                  .deterministic = o.deterministic});
    CompileOptions co = options();
    co.memory_budget = budget;
    Program p = m.compile(co);
    for (int k = 0; k < o.runs; ++k) {
      for (auto& [name, bytes] : c.feeds) p.set_input(name, bytes);
      p.run();
    }
    if (out.dtype() == DType::i32) {
      auto v = p.read_as<int32_t>(out_name);
      results.emplace_back(v.begin(), v.end());
    } else {
      results.push_back(testing::as_floats(p.read(out_name), out.dtype()));
    }
    if (o.gradients)
      for (auto& name : params) results.push_back(p.grad_as<float>(name));
    for (ValueId id : c.g.states())
      results.push_back(testing::as_floats(m.read_state(c.g.value(id).name), c.g.value(id).type.dtype));
  };
  std::vector<std::vector<float>> cpu, gpu;
  run(Device::cpu, cpu);
  run(Device::cuda, gpu);
  std::vector<std::string> names{"output " + out_name};
  if (o.gradients)
    for (auto& p : params) names.push_back("gradient of " + p);
  for (ValueId id : c.g.states()) names.push_back("state " + c.g.value(id).name);
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) worst = std::max(worst, expect_close(gpu[i], cpu[i], o.tol, names[i]));
  return worst;
}

std::vector<HostTensor> train_example(const std::string& example, const ExampleRun& r) {
  const TempCacheDir cache;
  const io::ModelSpec spec = io::parse_model_file(std::string(SEAM_EXAMPLES "/") + example + ".json");
  const io::BuiltGraph bg = io::build_graph(spec, r.batch);
  Model m(bg.graph, {.seed = 5,
                     .device = Device::cuda,
                     .precision = spec.precision,
                     .master_weights = spec.master_weights,
                     .cuda_graph = r.graph,
                     .deterministic = true,
                     .comm = r.ranks,
                     .grad_bucket_bytes = 64 << 10,
                     .zero = r.zero});
  Program p = m.compile({.loss = bg.loss, .optimizer = spec.optimizer});
  if (r.ranks) {
    EXPECT_GT(p.plan().buckets.size(), 1u) << example;
  }
  EXPECT_EQ(p.plan().zero, r.ranks && r.zero == 1) << example;
  std::mt19937_64 rng(9);
  const TensorType &xt = bg.graph.value(bg.x).type, &yt = bg.graph.value(bg.y).type;
  std::vector<io::RandomBatch> batches;
  for (int i = 0; i < 4; ++i) batches.push_back(io::random_batch(xt, yt, spec.classes, rng));
  for (int s = 0; s < r.steps; ++s) {
    const io::RandomBatch& b = batches[static_cast<size_t>(s) % batches.size()];
    const std::vector<std::byte> x = b.x_bytes();
    p.set_input("x", std::span<const std::byte>(x));
    p.set_input("y", std::span<const int32_t>(b.y));
    p.run();
  }
  p.check();
  return m.save_tensors();
}

}  // namespace seam::gpu_testing
