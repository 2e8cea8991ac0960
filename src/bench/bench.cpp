// `seam bench`: the workloads and their timing.
#include "bench/bench.h"
#include "bench/trace_report.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>

#include "backend/backend.h"
#include "backend/clocks.h"
#include "ops/registry.h"
#include "dist/comm.h"
#include "bench/workload_models.h"
#include "train/trainer.h"
#include "io/model_file.h"
#include "plan/explain.h"
#include "seam/seam.h"

namespace seam::bench {

namespace {

struct Workload {
  std::string name;
  std::string description;
  int64_t batch, in, classes;
  std::function<Var(Graph&, Var)> net;  // logits from x
  OptimizerConfig opt;
  Precision precision = Precision::tf32;      // the built-in workloads: fp32 values, TF32 GEMMs
  std::function<io::BuiltGraph()> file = {};  // a model file's graph instead of net
  LayoutPolicy layout = LayoutPolicy::automatic;
  std::vector<std::string> recompute = {};  // a model file's own
  size_t memory_budget = 0;                 // a model file's own
  int output_chunks = 1;                    // a model file's own
};

// A model file as a workload: its graph, batch size and optimizer.
Workload spec_workload(io::ModelSpec spec, std::string name, std::string description) {
  spec.fix_schedule_length(train::data_steps_per_epoch(spec, spec.batch_size));  // as seam step and plan
  Workload w{std::move(name), std::move(description), spec.batch_size, numel(spec.input_shape), spec.classes,
             nullptr, spec.optimizer, spec.precision};
  w.file = [spec] { return io::build_graph(spec, spec.batch_size); };
  w.layout = spec.layout;
  w.recompute = spec.recompute;
  w.memory_budget = spec.memory_budget;
  w.output_chunks = spec.output_chunks;
  return w;
}

Workload file_workload(const std::string& path) {
  io::ModelSpec spec = io::parse_model_file(path);
  std::string name = spec.name;
  return spec_workload(std::move(spec), std::move(name), "model file " + path);
}

// W5: ResNet-18 (examples/resnet18_cifar.json, built into the binary), at the file's
// precision (bf16) unless --precision says otherwise.
Workload resnet18_workload() {
  return spec_workload(resnet18_spec(), "W5",
                       "ResNet-18 (torchvision's resnet18, 10 classes) on 32x32x3, SGD momentum 0.9, weight decay "
                       "5e-4, batch 256 (" + std::string(kResnet18Name) + ")");
}

// W6: GPT-2 124M (examples/gpt2_124m.json, built into the binary), on random tokens.
Workload gpt2_workload() {
  return spec_workload(gpt2_spec(), "W6",
                       "GPT-2 124M (12 layers, 768 wide, T 1024, vocabulary 50304 padded from 50257, tied), AdamW "
                       "(0.9, 0.95) decay 0.1 on 2-D weights, clip 1.0, batch 16 (" + std::string(kGpt2Name) + ")");
}

// W3's and W4's shape: 1024 wide in, four residual blocks, 1000 classes out.
Var residual_net(Var x, const std::function<Var(Var, const std::string&)>& block) {
  Var h = nn::linear(x, 1024, "in");
  for (int b = 0; b < 4; ++b) h = block(h, "block" + std::to_string(b));
  return nn::linear(h, 1000, "head");
}

std::vector<Workload> workloads() {
  return {
      {"W1", "MLP 784-1024-1024-10, ReLU, cross-entropy, Adam, batch 128", 128, 784, 10,
       [](Graph&, Var x) {
         Var h = relu(nn::linear(x, 1024, "fc1"));
         h = relu(nn::linear(h, 1024, "fc2"));
         return nn::linear(h, 10, "fc3");
       },
       OptimizerConfig::adam(1e-3)},
      {"W2", "MLP 4096-4096-4096-4096-1000, GELU (tanh form) between, AdamW, batch 8192", 8192,
       4096, 1000,
       [](Graph&, Var x) {
         Var h = gelu(nn::linear(x, 4096, "fc1"), true);
         h = gelu(nn::linear(h, 4096, "fc2"), true);
         h = gelu(nn::linear(h, 4096, "fc3"), true);
         return nn::linear(h, 1000, "fc4");
       },
       OptimizerConfig::adamw(1e-3, 0.01)},
      {"W3",
       "residual gated MLP: 1024 wide, 4 blocks h += gamma * down(silu(gate(h)) * up(h)) with 2048 hidden, 1000 "
       "classes, AdamW, batch 4096",
       4096, 1024, 1000,
       [](Graph& g, Var x) {
         return residual_net(x, [&](Var h, const std::string& n) {
           Var u = mul(silu(nn::linear(h, 2048, n + ".gate")), nn::linear(h, 2048, n + ".up"));
           Var gamma = g.param(n + ".gamma", {1024}, Init::constant(0.1));
           return add(h, mul(gamma, nn::linear(u, 1024, n + ".down")));
         });
       },
       OptimizerConfig::adamw(1e-3, 0.01)},
      {"W4",
       "post-norm residual MLP: 1024 wide, 4 blocks h = layer_norm(h + down(gelu(up(h)))) with 4096 hidden, 1000 "
       "classes, AdamW, batch 4096",
       4096, 1024, 1000,
       [](Graph&, Var x) {
         return residual_net(x, [](Var h, const std::string& n) {
           Var f = nn::linear(gelu(nn::linear(h, 4096, n + ".up"), true), 1024, n + ".down");
           return nn::layer_norm(add(h, f), n + ".norm");
         });
       },
       OptimizerConfig::adamw(1e-3, 0.01)},
  };
}

// Bytes each step reads and writes once, plus the optimizer's pass (p, g, m, v read;
// p, m, v written): the traffic of the plan as it runs, fusion included.
double step_bytes(const Plan& p) {
  double b = 0;
  for (auto& s : p.steps) {
    for (auto& r : s.in) b += static_cast<double>(r.bytes());
    for (auto& r : s.out) b += static_cast<double>(r.bytes());
  }
  if (p.optimizer) b += 7.0 * static_cast<double>(p.layout.param_bytes);
  return b;
}

// `comm`: the ranks this process benches with (each on its own batch share and GPU), or
// null for one process alone.
BenchResult bench_one(const Workload& w, const BenchOptions& o, Device dev, const std::shared_ptr<dist::Comm>& comm) {
  Graph g;
  ValueId loss_id = -1;
  std::vector<PrecisionOverride> overrides;
  if (w.file) {
    io::BuiltGraph b = w.file();
    g = std::move(b.graph);
    loss_id = b.loss;
    overrides = std::move(b.overrides);
  } else {
    Var x = g.input("x", {w.batch, w.in});
    Var y = g.input("y", {w.batch}, DType::i32);
    loss_id = cross_entropy(w.net(g, x), y).id();
  }
  const Var loss = g.var(loss_id);
  // Rank 0 alone reads the driver's count and the clock: it runs on GPU 0, the device a
  // process that has not chosen one yet asks (and would make a context on); the others
  // stay off it.
  const bool reads_gpu = dev == Device::cuda && (!comm || comm->rank() == 0);
  const std::optional<size_t> used_before = reads_gpu ? cuda_device_used_bytes() : std::nullopt;
  const EpiloguePolicy epilogue = parse_epilogue_policy(o.epilogue).value_or(EpiloguePolicy::fastest);
  const Precision precision = o.precision.value_or(w.precision);
  Model m(g, {.seed = 1,
              .device = dev,
              .precision = precision,
              .precision_overrides = overrides,
              .master_weights = o.master_weights,
              .layout = o.layout.value_or(w.layout),
              .cuda_graph = o.graph,
              .epilogue = epilogue,
              .cuda_streams = o.streams,
              .deterministic = o.deterministic,
              .comm = comm ? comm : o.one_rank ? std::shared_ptr<dist::Comm>(dist::single_process()) : nullptr,
              .zero = o.zero});
  Program p = m.compile({.loss = loss.id(),
                         .optimizer = w.opt,
                         .fuse = o.fusion != "none",
                         .fuse_elementwise = o.fusion == "all",
                         .recompute = o.recompute.value_or(w.recompute),
                         .output_chunks = o.output_chunks.value_or(w.output_chunks),
                         .memory_budget = o.memory_budget.value_or(w.memory_budget)});

  // Two random batches (io::random_batch) in the shapes the graph takes.
  const TensorType xt = g.value(*g.find("x")).type, yt = g.value(*g.find("y")).type;
  std::mt19937_64 rng(7 + static_cast<uint64_t>(comm ? comm->rank() : 0));  // each rank its own rows
  const io::RandomBatch batches[2] = {io::random_batch(xt, yt, w.classes, rng), io::random_batch(xt, yt, w.classes, rng)};
  const std::vector<std::byte> xs[2] = {batches[0].x_bytes(), batches[1].x_bytes()};
  auto feed = [&](int k) {
    p.set_input("x", std::span<const std::byte>(xs[k]));
    p.set_input("y", std::span<const int32_t>(batches[k].y));
  };
  feed(0);
  for (int i = 0; i < o.warmup; ++i) {
    if (o.upload) feed(i % 2);
    p.run();
  }
  p.check();
  using Clock = std::chrono::steady_clock;
  std::optional<ClockWatch> clocks;
  if (reads_gpu) clocks.emplace();
  std::vector<double> per_step, host;
  for (int r = 0; r < o.repeats; ++r) {
    double in_run = 0;
    auto t0 = Clock::now();
    for (int i = 0; i < o.steps; ++i) {
      auto h0 = Clock::now();
      if (o.upload) feed(i % 2);
      p.run();
      in_run += std::chrono::duration<double, std::micro>(Clock::now() - h0).count();
    }
    p.check();  // waits for the device
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / o.steps;
    per_step.push_back(ms);
    host.push_back(in_run / o.steps);
  }
  const std::optional<ClockReport> clock_report = clocks ? clocks->stop() : std::nullopt;
  auto loss_now = p.read_as<float>(loss.name())[0];
  if (!std::isfinite(loss_now)) fail(w.name, ": the loss is ", loss_now, " after the timed steps");
  std::vector<double> sorted = per_step;
  std::sort(sorted.begin(), sorted.end());
  std::sort(host.begin(), host.end());
  BenchResult res{w.name, device_name(dev), precision_name(precision), o.graph && dev == Device::cuda, w.batch,
                  sorted[sorted.size() / 2], sorted.front(), sorted.back(), host[host.size() / 2], 0, 0, -1,
                  p.executable().stats().kernels};
  res.memory_mib = static_cast<double>(m.device_bytes() + p.plan().arena_bytes + p.executable().stats().device_bytes) /
                   1048576.0;
  res.budget_note = p.plan().budget_note;
  res.clocks = clock_report;
  if (const std::optional<size_t> used = used_before ? cuda_device_used_bytes() : std::nullopt)
    res.device_mib = (static_cast<double>(*used) - static_cast<double>(*used_before)) / 1048576.0;
  res.tflops = p.plan().flops() / (res.ms * 1e-3) / 1e12;
  res.gbps = step_bytes(p.plan()) / (res.ms * 1e-3) / 1e9;
  if (o.breakdown) {
    auto t = p.time_steps(20);
    const ExecStats stats = p.executable().stats();
    double gemm = 0, total = 0;
    std::printf("\n%s: each step alone (median of 20)\n", w.name.c_str());
    for (size_t i = 0; i < p.plan().steps.size(); ++i) {
      const PlanStep& s = p.plan().steps[i];
      std::string choice;
      for (auto& [step, what] : stats.choices)
        if (step == static_cast<int>(i)) choice = "  " + what;
      std::printf("  %8.4f ms  %-24s %-28s %8.3f GFLOP%s\n", t[i], op_name(s.op), s.name.c_str(), s.flops / 1e9,
                  choice.c_str());
      total += t[i];
      if (is_gemm(s.op)) gemm += t[i];
    }
    if (t.size() > p.plan().steps.size()) std::printf("  %8.4f ms  %-24s\n", t.back(), "optimizer update"), total += t.back();
    std::printf("  %8.4f ms  sum of steps alone; GEMMs alone %.4f ms (%.0f%% of the measured step)\n", total, gemm,
                100.0 * gemm / res.ms);
    res.gemm_ms = gemm;
  }
  if (o.trace > 0) {
    if (dev != Device::cuda) fail("--trace: the device's record of a step needs --device cuda");
#ifdef SEAM_HAS_CUDA
    const auto spans = cuda::trace_device([&] {
      for (int i = 0; i < o.trace; ++i) p.run();
      p.check();
    });
    std::printf("\n%s: traced\n%s", w.name.c_str(), trace_report(spans, o.trace, true).c_str());
#endif
  }
  if (o.explain) {
    // The kernel table against the same step without fusion (planned on the CPU: only its
    // steps are read), with each kernel's measured time.
    const Plan plain = Model(g, {.seed = 1}).plan({.loss = loss.id(), .optimizer = w.opt, .fuse = false});
    const auto measured = p.time_steps(20);
    std::printf("\n%s: the plan's kernels\n%s", w.name.c_str(),
                explain_plan(p.plan(), plain, DeviceModel{}, true, measured).c_str());
  }
  return res;
}

}  // namespace

void write_csv(std::ostream& f, const std::vector<BenchResult>& results, const BenchOptions& o, int ranks) {
  f << "framework,workload,variant,device,ms_per_step,ms_min,ms_max,samples_per_s,kernels_per_step,host_us_per_step,"
       "tflops,gbps,gemm_ms,precision,memory_mib,device_memory_mib,sm_mhz,watts,power_capped\n";
  for (auto& r : results) {
    f << "seam," << r.name << "," << (r.graph ? "graph" : "eager") << (o.upload ? "+upload" : "")
      << (o.epilogue != "fastest" ? "+" + o.epilogue : std::string())
      << (o.streams != 4 ? "+streams" + std::to_string(o.streams) : std::string())
      << (o.fusion != "all" ? "+fusion-" + o.fusion : std::string())
      << (o.master_weights ? std::string() : std::string("+no-masters"))
      << (o.deterministic ? std::string("+deterministic") : std::string())
      << (ranks > 1 ? "+ranks" + std::to_string(ranks) : o.one_rank ? std::string("+one-rank") : std::string())
      << (o.zero ? std::string("+zero1") : std::string()) << "," << r.device << "," << r.ms << "," << r.ms_min << ","
      << r.ms_max << "," << static_cast<double>(r.batch * ranks) / (r.ms * 1e-3) << "," << r.kernels << ","
      << r.host_us << "," << r.tflops << "," << r.gbps << "," << r.gemm_ms << "," << r.precision << ","
      << r.memory_mib << "," << r.device_mib;
    // The clock the window ran at, so that a figure read later says whether the power
    // cap bound it; empty where it could not be read (the CPU, no NVML).
    if (r.clocks)
      f << "," << r.clocks->sm_mhz_mean << "," << r.clocks->watts_mean << "," << r.clocks->power_capped << "\n";
    else
      f << ",,,\n";
  }
}

io::ModelSpec resnet18_spec() { return io::parse_model_json(kResnet18Json, kResnet18Name); }
io::ModelSpec gpt2_spec() { return io::parse_model_json(kGpt2Json, kGpt2Name); }

namespace {

int bench_on_rank(const BenchOptions& o, const std::shared_ptr<dist::Comm>& comm) {
  const int ranks = comm ? comm->size() : 1;
  const bool report = !comm || comm->rank() == 0;  // every rank times its steps; rank 0 speaks
  if (o.zero && !comm && !o.one_rank) fail("--zero 1 shards the optimizer over ranks: give --nproc N or --one-rank");
  if (ranks > 1 && (o.breakdown || o.explain || o.trace > 0))
    fail("--breakdown, --explain and --trace time steps on one rank alone, which a step summed over ", ranks,
         " ranks cannot do: run them without --nproc");
  Device dev = o.device == "cpu" ? Device::cpu : o.device == "cuda" ? Device::cuda : default_device();
  std::vector<BenchResult> results;
  std::vector<Workload> chosen;
  for (const std::string& name : o.workloads) {
    std::vector<Workload> builtin = workloads();
    auto it = std::find_if(builtin.begin(), builtin.end(), [&](const Workload& w) { return w.name == name; });
    if (it != builtin.end()) chosen.push_back(*it);
    else if (name == "W5") chosen.push_back(resnet18_workload());
    else if (name == "W6") chosen.push_back(gpt2_workload());
    else if (name.ends_with(".json")) chosen.push_back(file_workload(name));
    else fail("no workload named ", name, " (known: W1, W2, W3, W4, W5, W6, or a model file)");
  }
  if (o.workloads.empty()) chosen = workloads();  // W1-W4: W5 (ResNet-18) and W6 (GPT-2) are asked for by name
  const std::string over = ranks > 1 ? ", each of " + std::to_string(ranks) + " ranks on its own batch" : "";
  for (const Workload& w : chosen) {
    if (report) {
      std::printf("%s: %s, %s%s%s\n", w.name.c_str(), w.description.c_str(),
                  precision_name(o.precision.value_or(w.precision)), over.c_str(), o.zero ? ", ZeRO-1" : "");
      std::fflush(stdout);
    }
    results.push_back(bench_one(w, o, dev, comm));
    if (report && !results.back().budget_note.empty()) std::printf("  %s\n", results.back().budget_note.c_str());
    if (report && results.back().clocks) std::printf("  %s\n", results.back().clocks->str().c_str());
  }
  if (!report) return 0;
  // MiB: what seam accounts for (its buffers, arena, workspaces); device MiB: what the
  // driver saw the process take meanwhile.
  std::printf("\n%-4s %-5s %-6s %10s %10s %14s %9s %10s %9s %9s %9s %10s\n", "name", "dev", "graph", "ms/step",
              "(min-max)", "samples/s", "kernels", "host us", "TFLOP/s", "GB/s", "MiB", "device MiB");
  for (auto& r : results) {
    char device_mib[32] = "-";
    if (r.device_mib >= 0) std::snprintf(device_mib, sizeof device_mib, "%.1f", r.device_mib);
    std::printf("%-4s %-5s %-6s %10.4f %4.3f-%-5.3f %14.0f %9d %10.1f %9.2f %9.1f %9.1f %10s\n", r.name.c_str(),
                r.device.c_str(), r.graph ? "yes" : "no", r.ms, r.ms_min, r.ms_max,
                static_cast<double>(r.batch * ranks) / (r.ms * 1e-3), r.kernels, r.host_us, r.tflops, r.gbps, r.memory_mib,
                device_mib);
  }
  if (!o.csv.empty()) {
    std::ofstream f(o.csv);
    if (!f) fail(o.csv, ": cannot write");
    write_csv(f, results, o, ranks);
  }
  return 0;
}

}  // namespace

int run_bench(const BenchOptions& o) {
  return dist::run_on_ranks([&](const std::shared_ptr<dist::Comm>& comm) { return bench_on_rank(o, comm); });
}

}  // namespace seam::bench
