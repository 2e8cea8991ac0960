// Named training workloads and `seam bench`: time whole training steps on a device and
// report ms/step, throughput, kernels and host time per step, and achieved TFLOP/s and
// GB/s, as a table and as CSV. bench/compare_torch.py runs the same workloads in PyTorch.
#pragma once
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "backend/clocks.h"
#include "io/model_file.h"
#include "seam/model.h"

namespace seam::bench {

struct BenchOptions {
  std::vector<std::string> workloads;  // W1..W6 or model files (empty: W1..W4)
  int steps = 200;                     // timed steps per repetition
  int repeats = 5;                     // the median repetition is reported
  int warmup = 20;
  bool graph = true;                   // replay the step as one CUDA Graph
  bool upload = false;                 // upload a new batch from the host every step
  bool breakdown = false;              // also time every plan step alone
  bool explain = false;                // also print the plan's kernel table (seam plan) with times
  int trace = 0;                       // also trace this many steps on the device (CUPTI): overlap, gaps
  std::string device = "auto";
  std::string epilogue = "fastest";    // fused GEMM epilogues: fastest, fused, split, split_t
  int streams = 4;                     // CUDA streams a step may spread over
  std::string fusion = "all";          // all; epilogues (GEMM epilogues and loss only); none
  std::optional<Precision> precision;  // overrides each workload's (W1-W4: tf32; W5 and a file: its own)
  bool master_weights = true;          // false: 16-bit parameters (ModelOptions::master_weights)
  bool deterministic = false;          // ModelOptions::deterministic, to measure what it costs
  // The data-parallel step over a group of one: gradient buckets summed (NCCL on the GPU)
  // beside the backward pass, to measure what the sums cost where nothing travels.
  bool one_rank = false;
  // 1: ZeRO-1 over the ranks (ModelOptions::zero), with --one-rank or as one of several
  // ranks (`seam bench --nproc N`: every rank times its steps, rank 0 reports).
  int zero = 0;
  std::optional<LayoutPolicy> layout;  // overrides each workload's (a model file's own, else automatic)
  std::string csv;                     // also write the results here
  // Activations recomputed in the backward (CompileOptions::recompute); unset: a model
  // file's own "recompute", else none.
  std::optional<std::vector<std::string>> recompute;
  // CompileOptions::memory_budget in bytes; unset: a model file's own "memory_budget_gib".
  std::optional<size_t> memory_budget;
  // CompileOptions::output_chunks; unset: a model file's own "output_chunks".
  std::optional<int> output_chunks;
};

int run_bench(const BenchOptions& o);

// One workload's figures from `seam bench`.
struct BenchResult {
  std::string name, device, precision;
  bool graph;
  int64_t batch;
  double ms, ms_min, ms_max, host_us, tflops, gbps, gemm_ms = -1;
  int kernels;
  double memory_mib = 0;  // the model's buffers, the arena and the steps' workspaces and scratch
  std::string budget_note;  // Plan::budget_note
  std::optional<ClockReport> clocks;  // the GPU in the timed steps, where its clock could be read
  // The GPU's memory in use after the timed steps less before the model was made, as the
  // driver counts it (libraries' handles and the allocator's pool included); -1 on the CPU.
  double device_mib = -1;
};

// The results as `--csv` writes them (bench/report.py's columns): a header and a row a
// result, each row's variant naming the options that differ from the defaults; `ranks`
// benched together, each on its own batch.
void write_csv(std::ostream& out, const std::vector<BenchResult>& results, const BenchOptions& o, int ranks);

// W5's and W6's models: examples/resnet18_cifar.json and gpt2_124m.json as built into the
// binary.
io::ModelSpec resnet18_spec();
io::ModelSpec gpt2_spec();

}  // namespace seam::bench
