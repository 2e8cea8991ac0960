// The seam command line: train, eval, plan, bench, numerics, ops. Every command reports
// bad input as one line on stderr starting "seam: error:"; a usage mistake (a flag, value
// or argument the command does not take) exits with status 2, a failure while running
// with 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <csignal>
#include <iostream>
#include <limits>
#include <sstream>
#include <unistd.h>

#include "backend/cpu/gemm.h"
#include "bench/bench.h"
#include "bench/numerics.h"
#include "common/strings.h"
#include "data/fashion_mnist.h"
#include "data/tokens.h"
#include "dist/launch.h"
#include "ops/registry.h"
#include "passes/fuse.h"
#include "seam/seam.h"
#include "train/trainer.h"
#ifdef SEAM_HAS_ONNX
#include "io/onnx.h"
#include "io/onnx_cli.h"
#include "io/onnx_export.h"
#include "io/onnx_suite.h"
#endif
#ifdef SEAM_HAS_CUDA
#include "backend/cuda/device.h"
#endif

namespace {

constexpr int kUsageExit = 2;

// A usage mistake found after CLI11 has parsed (an unknown flag, a stray argument).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A value as a message shows it: a number as given, anything else quoted.
std::string shown(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size() ? s : "'" + s + "'";
}

std::string num_str(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// A whole number from lo to hi (hi: the type's largest unless given). It is written back in
// plain decimal because CLI11's own conversion would read "010" as octal.
template <class T>
CLI::Validator whole(T lo, T hi = std::numeric_limits<T>::max()) {
  const bool open = hi == std::numeric_limits<T>::max();
  const std::string range = open ? ">= " + std::to_string(lo) : "from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        T v{};
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        std::string why = "must be a whole number " + range + ", got " + shown(s);
        if (ec == std::errc::result_out_of_range && s[0] != '-' && open)
          return "must be a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " + s;
        if (ec != std::errc{} || end != s.data() + s.size() || v < lo || v > hi) return why;
        s = std::to_string(v);
        return "";
      },
      range);
}

// A finite number above lo (or equal to it, when lo_included), and at most hi if given.
CLI::Validator number(double lo, bool lo_included, std::optional<double> hi = {}) {
  const std::string range = hi ? "from " + num_str(lo) + " to " + num_str(*hi) : (lo_included ? ">= " : "> ") + num_str(lo);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        double v = std::strtod(s.c_str(), &end);
        bool ok = !s.empty() && end == s.c_str() + s.size() && std::isfinite(v) && (lo_included ? v >= lo : v > lo) &&
                  (!hi || v <= *hi);
        return ok ? "" : "must be a number " + range + ", got " + shown(s);
      },
      range);
}

CLI::Validator one_of(std::vector<std::string> allowed) {
  std::string list;
  for (auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        return std::find(allowed.begin(), allowed.end(), s) != allowed.end() ? "" : "must be one of " + list + ", got '" + s + "'";
      },
      "{" + list + "}");
}

// A case of `seam numerics`, or a family of them ("matmul").
CLI::Validator numerics_case() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (seam::bench::selects_numerics_op(s)) return "";
        std::string near = seam::nearest_names(s, seam::bench::numerics_ops());
        return "must be a case or a family of cases (see --list), got '" + s + "'" +
               (near.empty() ? "" : "; did you mean " + near + "?");
      },
      "CASE");
}

// CLI11's wording of a parse error, reworded where it reads badly as one sentence.
std::string usage_text(const CLI::ParseError& err) {
  std::string text = err.what();
  // CLI11 joins the option's name and a validator's text with ": ".
  if (auto p = text.find(": must be "); p != std::string::npos && dynamic_cast<const CLI::ValidationError*>(&err))
    text.erase(p, 1);
  // "--batch: 1 required INT missing": the flag came last, without its value.
  if (auto p = text.find(": "); p != std::string::npos && dynamic_cast<const CLI::ArgumentMismatch*>(&err) &&
                                 text.find(" required ") != std::string::npos && text.ends_with(" missing"))
    text = text.substr(0, p) + " needs a value";
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

// What is wrong with an argument CLI11 could not place: an unknown flag or command, or
// one argument too many.
std::string unexpected(const CLI::App& app, const std::string& arg, bool top) {
  std::vector<std::string> known;
  if (arg.size() > 1 && arg[0] == '-') {
    for (const CLI::Option* o : app.get_options()) {
      for (auto& l : o->get_lnames()) known.push_back("--" + l);
      for (auto& s : o->get_snames()) known.push_back("-" + s);
    }
    std::string flag = arg.substr(0, arg.find('='));
    std::string near = seam::nearest_names(flag, known);
    return "unknown flag '" + flag + "'" + (top ? "" : " for 'seam " + app.get_name() + "'") +
           (near.empty() ? "" : "; did you mean " + near + "?");
  }
  if (top) {
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) known.push_back(sub->get_name());
    std::string near = seam::nearest_names(arg, known);
    return "unknown command '" + arg + "'" + (near.empty() ? "" : "; did you mean " + near + "?");
  }
  return "unexpected argument '" + arg + "'";
}

void print_version() {
  std::cout << "seam " << SEAM_VERSION << "\n";
  std::cout << "CPU GEMMs: " << seam::cpu::gemm_library() << "\n";
#ifdef SEAM_HAS_CUDA
  std::string why;
  auto devs = seam::cuda::devices(&why);
  std::cout << "CUDA backend: built (runtime " << seam::cuda::runtime_version() / 1000 << "."
            << seam::cuda::runtime_version() % 1000 / 10 << ")\n";
  if (devs.empty()) std::cout << "  no GPU available: " << why << "\n";
  for (auto& d : devs)
    std::cout << "  GPU " << d.index << ": " << d.name << ", sm_" << d.compute_capability << ", "
              << d.multiprocessors << " SMs, " << d.memory_bytes / (1u << 20) << " MiB\n";
#else
  std::cout << "CUDA backend: not built\n";
#endif
}

void print_ops(bool with_grads) {
  for (int i = 0; i < seam::kNumOps; ++i) {
    const seam::OpDef& d = seam::op_def(static_cast<seam::Op>(i));
    bool is_grad = seam::is_gradient_op(static_cast<seam::Op>(i));
    if (is_grad && !with_grads) continue;
    std::cout << d.signature() << "\n    " << d.doc;
    if (!is_grad && !d.grad) std::cout << "  [no gradient]";
    if (d.view_of >= 0) std::cout << "  [view: no copy]";
    std::cout << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  // OpenBLAS chose its generic kernels on a CPU that has faster ones (gemm.h says when):
  // run again with them. If the exec fails, go on with what was loaded.
  if (const char* core = seam::cpu::blas_core_override()) {
    setenv("OPENBLAS_CORETYPE", core, 0);
    execv("/proc/self/exe", argv);
  }
  // Past a file-size limit (ulimit -f) a write then fails with EFBIG, which names the file
  // and keeps the previous checkpoint, instead of the signal killing the run mid-write.
  std::signal(SIGXFSZ, SIG_IGN);
#ifdef SEAM_HAS_ONNX
  seam::onnx::enable_model_files();
#endif
  CLI::App app{"seam: compiles a neural network's whole training step into one plan and runs it"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "print the version and the devices seam sees");

  // --precision for train, plan and bench: a name of seam::parse_precision, or the model
  // file's (a workload's) own when not given.
  const std::string precision_help =
      "f32 (IEEE), tf32 (TF32 tensor cores in GEMMs and convolutions), bf16 or f16 (mixed precision, fp32 masters)";
  auto precision_of = [](const std::string& s) -> std::optional<seam::Precision> {
    if (s.empty()) return std::nullopt;
    return seam::parse_precision(s);
  };
  std::string train_precision, plan_precision, bench_precision;
  // --layout for train, plan and bench: where convolutions run channels-last.
  const std::string layout_help =
      "auto (each convolution region costed both ways: nhwc on CUDA's tensor cores, else nchw), nchw or nhwc: the "
      "layout of convolution regions";
  std::string train_layout, plan_layout, bench_layout;
  // --memory-budget for train, plan and bench (CompileOptions::memory_budget), in GiB.
  const std::string budget_help =
      "GiB that the model's buffers and the step's arena may take: where the step needs more, layer norm gradients "
      "from the norms' outputs, the output layer in up to 4 chunks, then GELU and layer norm outputs recomputed in "
      "the backward until it fits (default: the model file's memory_budget_gib, else no limit)";
  // --output-chunks for train, plan and bench (CompileOptions::output_chunks).
  const std::string chunks_help =
      "row chunks of the output layer (logits, loss and their gradient GEMMs a chunk at a time: a language model's "
      "logits shrink by that factor; default: the model file's output_chunks, else 1)";
  auto chunks_of = [](int64_t n) -> std::optional<int> {
    if (n <= 0) return std::nullopt;
    return static_cast<int>(n);
  };
  auto gib_bytes = [](double gib) -> std::optional<size_t> {
    if (gib <= 0) return std::nullopt;
    return static_cast<size_t>(gib * 1073741824.0);
  };
  auto layout_of = [](const std::string& s) -> std::optional<seam::LayoutPolicy> {
    if (s.empty()) return std::nullopt;
    return seam::parse_layout_policy(s);
  };
  bool no_masters = false;

  seam::train::TrainOptions t;
  std::string train_model;
  bool quiet = false, json = false;
  auto* train = app.add_subcommand("train", "train a model file on Fashion-MNIST (default: examples/fmnist_mlp.json)");
  train->add_option("model", train_model, "model file (JSON), or an ONNX file (.onnx) trained with --config");
  train->add_option("--config", t.config,
                    "with an ONNX file: a model file's settings without a network (loss, optimizer, batch_size, epochs, "
                    "data; docs/onnx.md)");
  train->add_option("--epochs", t.epochs, "number of epochs")->transform(whole<int64_t>(1));
  train->add_option("--batch", t.batch, "batch size")->transform(whole<int64_t>(1));
  train->add_option("--lr", t.lr, "learning rate")->check(number(0, true));
  train->add_option("--seed", t.seed, "seed for initialization, data order and dropout")->transform(whole<uint64_t>(0));
  train->add_option("--device", t.device, "cpu, cuda or auto (default: the model file's, auto = the GPU if there is one)")
      ->check(one_of({"cpu", "cuda", "auto"}));
  train->add_option("--precision", train_precision, precision_help + " (default: the model file's)")
      ->check(one_of(seam::precision_names()));
  train->add_flag("--deterministic", t.deterministic,
                  "bitwise repeatable GPU runs: fixed algorithm picks, no atomics (the CPU's runs repeat anyway)");
  train->add_option("--layout", train_layout, layout_help + " (default: the model file's)")
      ->check(one_of(seam::layout_policy_names()));
  double train_budget = 0;
  train->add_option("--memory-budget", train_budget, budget_help)->check(number(0, false));
  int64_t train_chunks = 0;
  train->add_option("--output-chunks", train_chunks, chunks_help)->transform(whole<int64_t>(1));
  train->add_option("--out", t.out_dir, "output folder for metrics.csv and checkpoint.safetensors (default runs/<name>)");
  train->add_option("--resume", t.resume, "continue from a checkpoint exactly where it stopped");
  train->add_option("--data", t.data_dir,
                    "data folder: the four IDX files of an image set (default: Debian's Fashion-MNIST), or train.tok and "
                    "val.tok for a model of token ids (default: the model file's data.tokens)");
  train->add_option("--val-split", t.val_split, "fraction of the training set held out for validation")->check(number(0, true, 0.99));
  train->add_option("--max-steps", t.max_steps, "stop after this many steps and write a checkpoint")->transform(whole<int64_t>(1));
  train->add_option("--limit-train", t.limit_train, "train on the first N samples only")->transform(whole<int64_t>(1));
  train->add_option("--limit-test", t.limit_test, "evaluate on the first N test samples only")->transform(whole<int64_t>(1));
  train->add_option("--log-every", t.log_every, "read loss and accuracy from the device every N steps")
      ->transform(whole<int64_t>(1));
  train->add_option("--max-skipped-steps", t.max_skipped_steps,
                    "stop with an error after N updates in a row skipped for a non-finite loss or gradient")
      ->transform(whole<int64_t>(1));
  train->add_flag("--quiet", quiet, "print only errors");
  int64_t nproc = 0;
  train->add_option("--nproc", nproc,
                    "train as N processes on this host (data parallel: one GPU each with --device cuda, else on the "
                    "CPU), through mpirun where there is one: each takes 1/N of every batch; or launch `mpirun -np N "
                    "seam train ...` yourself")
      ->transform(whole<int64_t>(1));
  train->add_option("--zero", t.zero,
                    "1: ZeRO-1 across the ranks: each keeps the optimizer moments of 1/N of the parameters and "
                    "updates those (0: every rank keeps all)")
      ->check(one_of({"0", "1"}));
  train->add_flag("--json", json, "print JSON lines (one per step and per epoch) instead of text");

  seam::train::StepOptions so;
  std::string step_precision, step_layout, step_epilogue = "fastest";
  auto* step = app.add_subcommand(
      "step", "run one training step of a model file on a random batch and write it out (for bench/torch_twin.py); "
      "--steps: the loss curve of more steps on that batch");
  step->add_option("model", so.model_path, "model file (JSON)")->required();
  step->add_option("--out", so.out_dir, "folder for init/batch/after.safetensors and step.json")->required();
  step->add_option("--batch", so.batch, "batch size (default: the model file's)")->transform(whole<int64_t>(1));
  step->add_option("--device", so.device, "cpu, cuda or auto")->check(one_of({"cpu", "cuda", "auto"}));
  step->add_option("--precision", step_precision, precision_help + " (default: the model file's)")
      ->check(one_of(seam::precision_names()));
  step->add_option("--layout", step_layout, layout_help + " (default: the model file's)")
      ->check(one_of(seam::layout_policy_names()));
  step->add_option("--epilogue", step_epilogue,
                   "GEMMs with a fused bias/activation/residual: the faster of epilogue and separate kernels per "
                   "shape (fastest), or always one of them (to check one against the other)")
      ->check(one_of(seam::epilogue_policy_names()));
  step->add_option("--data-seed", so.data_seed, "seed of the random batch")->transform(whole<uint64_t>(0));
  step->add_option("--steps", so.steps,
                   "steps on the same batch (the first written out, every loss in step.json's \"losses\")")
      ->transform(whole<int64_t>(1));

  std::vector<std::string> tokenize_files;
  std::string tokenize_out;
  double val_fraction = 0.1;
  auto* tokenize = app.add_subcommand(
      "tokenize", "byte-level token files (train.tok, val.tok; docs/data.md) from text files, for language models");
  tokenize->add_option("files", tokenize_files, "text files, concatenated in the order given")->required();
  tokenize->add_option("--out", tokenize_out, "folder for train.tok and val.tok")->required();
  tokenize->add_option("--val-fraction", val_fraction, "the share of the text, from its end, kept for validation")
      ->check(CLI::Range(0.0, 1.0));

  seam::train::SampleOptions sa;
  std::string sample_model;
  auto* sample = app.add_subcommand("sample", "generate text from a language model's checkpoint");
  sample->add_option("checkpoint", sa.checkpoint, "checkpoint.safetensors written by seam train")->required();
  sample->add_option("--model", sample_model, "model file (default: the one stored in the checkpoint)");
  sample->add_option("--prompt", sa.prompt, "text to continue (default: a newline)");
  sample->add_option("--tokens", sa.tokens, "tokens to generate")->transform(whole<int64_t>(0));
  sample->add_option("--temperature", sa.temperature, "softmax temperature; 0 takes the most likely token")
      ->check(number(0, true));
  sample->add_option("--top-k", sa.top_k, "draw among the K most likely tokens only (0: all)")->transform(whole<int64_t>(0));
  sample->add_option("--seed", sa.seed, "seed of the draws")->transform(whole<uint64_t>(0));
  sample->add_option("--device", sa.device, "cpu, cuda or auto")->check(one_of({"cpu", "cuda", "auto"}));

  seam::train::EvalOptions e;
  std::string eval_model;
  auto* eval = app.add_subcommand("eval", "test accuracy, loss and confusion matrix of a checkpoint");
  eval->add_option("model", eval_model, "model file (default: the one stored in the checkpoint)");
  eval->add_option("--checkpoint", e.checkpoint, "checkpoint (safetensors)")->required();
  eval->add_option("--data", e.data_dir, "data folder, as for train");
  eval->add_option("--batch", e.batch, "batch size")->transform(whole<int64_t>(1));
  eval->add_option("--limit-test", e.limit_test, "evaluate on the first N test samples only")->transform(whole<int64_t>(1));
  eval->add_flag("--json", e.json, "print one JSON object");
  eval->add_option("--device", e.device, "cpu, cuda or auto (default: the GPU if there is one)")
      ->check(one_of({"cpu", "cuda", "auto"}));

  std::string plan_model;
  std::optional<int64_t> plan_batch;
  bool plan_eval = false;
  auto* plan = app.add_subcommand("plan", "print the compiled training step: steps, shapes, arena offsets, memory, FLOPs");
  plan->add_option("model", plan_model, "model file (JSON), or an ONNX file (its evaluation step)")->required();
  std::vector<std::string> plan_input_shapes;
  plan->add_option("--input-shape", plan_input_shapes, "ONNX: binds a symbolic input shape, name=D1xD2x... (repeatable)");
  plan->add_option("--batch", plan_batch, "batch size")->transform(whole<int64_t>(1));
  plan->add_flag("--eval", plan_eval, "print the evaluation step instead");
  bool plan_measure = false;
  plan->add_flag("--measure", plan_measure, "time each kernel alone on the device and show it next to its estimate");
  std::string plan_device = "cpu";
  plan->add_option("--device", plan_device, "prepare the plan's kernels for cpu, cuda or auto")
      ->check(one_of({"cpu", "cuda", "auto"}));
  plan->add_option("--precision", plan_precision, precision_help + " (default: the model file's)")
      ->check(one_of(seam::precision_names()));
  plan->add_option("--layout", plan_layout, layout_help + " (default: the model file's)")
      ->check(one_of(seam::layout_policy_names()));
  double plan_budget = 0;
  plan->add_option("--memory-budget", plan_budget, budget_help)->check(number(0, false));
  int64_t plan_chunks = 0;
  plan->add_option("--output-chunks", plan_chunks, chunks_help)->transform(whole<int64_t>(1));

  seam::bench::BenchOptions bo;
  bool no_graph = false;
  auto* bench = app.add_subcommand("bench", "time training steps of named workloads (W1 to W6, or model files): ms/step, kernels, TFLOP/s");
  bench->add_option("workloads", bo.workloads,
                    "W1, W2, W3, W4, W5 (ResNet-18, examples/resnet18_cifar.json), W6 (GPT-2 124M, "
                    "examples/gpt2_124m.json) or MODEL.json files (default: W1 to W4)");
  bench->add_option("--steps", bo.steps, "timed steps per repetition")->transform(whole<int>(1));
  bench->add_option("--repeats", bo.repeats, "repetitions; the median is reported")->transform(whole<int>(1));
  bench->add_option("--warmup", bo.warmup, "untimed steps first")->transform(whole<int>(0));
  bench->add_flag("--no-graph", no_graph, "launch each step's kernels one by one instead of replaying a CUDA Graph");
  bench->add_flag("--upload", bo.upload, "upload a new batch from the host every step");
  bench->add_flag("--breakdown", bo.breakdown, "also time every step of the plan alone");
  bench->add_flag("--explain", bo.explain,
                  "also print each workload's kernel table as `seam plan --measure` does, against the unfused step");
  bench->add_option("--trace", bo.trace,
                    "also trace this many steps on the GPU (CUPTI): each kernel as it ran, the streams' overlap, the "
                    "idle gaps, the last step's timeline")
      ->transform(whole<int>(1));
  bench->add_option("--device", bo.device, "cpu, cuda or auto")->check(one_of({"cpu", "cuda", "auto"}));
  bench->add_option("--csv", bo.csv, "also write the results as CSV");
  bench->add_option("--precision", bench_precision, precision_help + " (default: tf32 for W1-W4, a model file's own, W5's bf16)")
      ->check(one_of(seam::precision_names()));
  bench->add_option("--layout", bench_layout, layout_help + " (default: a model file's own, else auto)")
      ->check(one_of(seam::layout_policy_names()));
  bench->add_flag("--deterministic", bo.deterministic,
                  "bitwise repeatable GPU steps: fixed algorithm picks, no atomics (to measure their cost)");
  bench->add_flag("--one-rank", bo.one_rank,
                  "the data-parallel step over a group of one: gradient buckets summed (NCCL on the GPU) beside the "
                  "backward pass (to measure their cost)");
  int64_t bench_nproc = 0;
  bench->add_option("--nproc", bench_nproc,
                    "bench data-parallel steps as N processes on this host, one GPU each, every rank on a batch of "
                    "the workload's size (the throughput is the ranks' together)")
      ->transform(whole<int64_t>(1));
  bench->add_option("--zero", bo.zero, "1: ZeRO-1 across the ranks (with --nproc or --one-rank)")->check(one_of({"0", "1"}));
  bench->add_flag("--no-master-weights", no_masters,
                  "with bf16 or f16: parameters stored in 16 bits, updated with stochastic rounding");
  bench->add_option("--epilogue", bo.epilogue,
                    "GEMMs with a fused bias/activation: the faster of epilogue and separate kernels per shape "
                    "(fastest), or always one of them")
      ->check(one_of(seam::epilogue_policy_names()));
  bench->add_option("--fusion", bo.fusion,
                    "which fusions run: all, epilogues (GEMM epilogues and the loss, no elementwise groups) or none")
      ->check(one_of({"all", "epilogues", "none"}));
  bench->add_option("--streams", bo.streams, "CUDA streams independent steps may run on side by side (1: one)")
      ->transform(whole<int>(1, 16));
  std::vector<std::string> bench_recompute;
  auto* recompute_opt =
      bench->add_option("--recompute", bench_recompute,
                        "activations the backward recomputes instead of keeping them, for memory: gelu, layer_norm, "
                        "or none (default: a model file's own \"recompute\")")
          ->check(one_of([] {
            std::vector<std::string> names = seam::recompute_names();
            names.push_back("none");
            return names;
          }()));

  double bench_budget = 0;
  bench->add_option("--memory-budget", bench_budget, budget_help)->check(number(0, false));
  int64_t bench_chunks = 0;
  bench->add_option("--output-chunks", bench_chunks, chunks_help)->transform(whole<int64_t>(1));

  seam::bench::NumericsOptions no;
  std::vector<std::string> numerics_precisions;
  bool numerics_list = false;
  auto* numerics = app.add_subcommand(
      "numerics", "error of each op family's output and gradients at each precision against a float64 reference");
  numerics->add_option("--device", no.device, "cpu, cuda or auto (default: the GPU if there is one)")
      ->check(one_of({"cpu", "cuda", "auto"}));
  numerics->add_option("--precision", numerics_precisions,
                       "precisions to measure, repeatable or comma-separated (default: f32, tf32, bf16, f16)")
      ->delimiter(',')
      ->check(one_of(seam::precision_names()));
  numerics->add_option("--op", no.ops, "only this case, or a family (matmul: every layout); repeatable or comma-separated")
      ->delimiter(',')
      ->check(numerics_case());
  numerics->add_option("--csv", no.csv, "also write the rows as CSV");
  numerics->add_flag("--list", numerics_list, "print the cases and exit");

  auto* ops = app.add_subcommand("ops", "list every op with its signature");
  bool grads = false;
  ops->add_flag("--grads", grads, "include the gradient ops that autodiff inserts");

#ifdef SEAM_HAS_ONNX
  seam::onnx::RunOptions ro;
  std::vector<std::string> run_inputs, run_input_shapes;
  std::string run_device = "auto", run_precision = "f32";
  auto* run = app.add_subcommand("run", "run an ONNX model on .npy inputs; its outputs are written as .npy files");
  run->add_option("model", ro.model, "the .onnx file")->required();
  run->add_option("--input", run_inputs, "name=FILE.npy for each graph input (repeatable)");
  run->add_option("--input-shape", run_input_shapes, "binds a symbolic input shape, name=D1xD2x... (repeatable)");
  run->add_option("--out", ro.out_dir, "folder for the outputs, one <output>.npy each (default: .)");
  run->add_option("--device", run_device, "cpu, cuda or auto")->check(one_of({"cpu", "cuda", "auto"}));
  run->add_option("--precision", run_precision, precision_help)->check(one_of(seam::precision_names()));
  run->add_option("--time", ro.time_runs, "then time N runs back to back (5 rounds; the median ms per run)")
      ->transform(whole<int>(1));
  seam::onnx::ExportOptions xo;
  auto* exp = app.add_subcommand("export", "write a model file's network as ONNX (opset 17), its output 'logits'");
  exp->add_option("model", xo.model, "model file (default: the checkpoint's stored model)");
  exp->add_option("--checkpoint", xo.checkpoint, "the values to write (default: the model's initialization)");
  exp->add_option("--onnx", xo.out, "the .onnx file to write")->required();
  exp->add_option("--batch", xo.batch, "the batch the file's shapes are fixed at (default 1)")
      ->transform(whole<int64_t>(1));
  seam::onnx::SuiteOptions suite;
  std::string suite_device = "cpu";
  auto* onnx_suite = app.add_subcommand(
      "onnx-suite", "run the ONNX backend node tests through the importer: a pass/fail table per op");
  onnx_suite->add_option("dir", suite.dir, "the folder of test folders (default: libonnx-testdata's node tests)");
  onnx_suite->add_option("--device", suite_device, "cpu, cuda or auto")->check(one_of({"cpu", "cuda", "auto"}));
  onnx_suite->add_option("--filter", suite.filter, "only the tests whose folder name contains this");
  onnx_suite->add_option("--markdown", suite.markdown, "also write the table to this file");
  onnx_suite->add_flag("--verbose", suite.verbose, "a line for every test, passed ones too");
  onnx_suite->add_option("--min-pass", suite.min_pass_percent,
                         "exit 1 when fewer than this percentage of the supported ops' tests pass");
#else
  CLI::App* onnx_suite = app.add_subcommand("onnx-suite", "(this build has no ONNX importer)");
  CLI::App* run = app.add_subcommand("run", "(this build has no ONNX importer)");
  CLI::App* exp = app.add_subcommand("export", "(this build has no ONNX importer)");
#endif

  // Arguments CLI11 cannot place are kept, not thrown, so that the message can name the
  // flag or command meant.
  for (CLI::App* a : {&app, train, eval, plan, bench, numerics, ops, onnx_suite, run, exp}) a->allow_extras();
  auto help_hint = [&] {
    auto subs = app.get_subcommands();
    return " (see 'seam " + (subs.empty() ? std::string() : subs[0]->get_name() + " ") + "--help')";
  };
  try {
    app.parse(argc, argv);
    for (CLI::App* a : {&app, train, eval, plan, bench, numerics, ops, onnx_suite, run, exp})
      if (!a->remaining().empty()) throw UsageError(unexpected(*a, a->remaining()[0], a == &app));
  } catch (const CLI::ParseError& err) {
    if (err.get_exit_code() == 0) return app.exit(err);  // --help
    std::cerr << "seam: error: " << usage_text(err) << help_hint() << "\n";
    return kUsageExit;
  } catch (const UsageError& err) {
    std::cerr << "seam: error: " << err.what() << help_hint() << "\n";
    return kUsageExit;
  }
  try {
    if (version) {
      print_version();
      return 0;
    }
    if (*train) {
      if (nproc > 1) return seam::dist::run_ranks(static_cast<int>(nproc), seam::dist::without_nproc(argc, argv));
      if (!train_model.empty()) t.model_path = train_model;
      t.output = json ? seam::train::Output::json : quiet ? seam::train::Output::quiet : seam::train::Output::bar;
      t.precision = precision_of(train_precision);
      t.layout = layout_of(train_layout);
      t.memory_budget = gib_bytes(train_budget);
      t.output_chunks = chunks_of(train_chunks);
      return seam::train::run_train(t);
    }
    if (*sample) {
      if (!sample_model.empty()) sa.model_path = sample_model;
      return seam::train::run_sample(sa);
    }
    if (*eval) {
      if (!eval_model.empty()) e.model_path = eval_model;
      return seam::train::run_eval(e);
    }
    if (*step) {
      so.precision = precision_of(step_precision);
      so.layout = layout_of(step_layout);
      so.epilogue = *seam::parse_epilogue_policy(step_epilogue);
      return seam::train::run_step(so);
    }
    if (*tokenize) {
      const auto n = seam::data::tokenize_files(tokenize_files, tokenize_out, val_fraction);
      std::cout << "tokenize: " << n.train + n.val << " bytes -> " << tokenize_out << "/train.tok (" << n.train
                << " tokens), " << tokenize_out << "/val.tok (" << n.val << " tokens), vocabulary 256\n";
      return 0;
    }
#ifdef SEAM_HAS_ONNX
    auto onnx_shapes = [](const std::vector<std::string>& texts) {
      std::map<std::string, seam::Shape> m;
      for (const std::string& t : texts) m.insert(seam::onnx::parse_input_shape(t));
      return m;
    };
    if (*plan && plan_model.ends_with(".onnx")) {
      seam::onnx::RunOptions po;
      po.model = plan_model;
      po.input_shapes = onnx_shapes(plan_input_shapes);
      po.device = seam::train::resolve_device(plan_device);
      if (auto p = precision_of(plan_precision)) po.precision = *p;
      po.measure = plan_measure;
      return seam::onnx::plan_onnx(po);
    }
    if (*run) {
      for (const std::string& t : run_inputs) {
        const size_t eq = t.find('=');
        if (eq == std::string::npos || eq == 0) throw seam::Error("--input '" + t + "': expected name=FILE.npy");
        ro.inputs[t.substr(0, eq)] = t.substr(eq + 1);
      }
      ro.input_shapes = onnx_shapes(run_input_shapes);
      ro.device = seam::train::resolve_device(run_device);
      ro.precision = *precision_of(run_precision);
      return seam::onnx::run_onnx(ro);
    }
    if (*exp) return seam::onnx::run_export(xo);
#else
    if (*run || *exp || (*plan && plan_model.ends_with(".onnx")))
      throw seam::Error("this build of seam has no ONNX importer (it needs protobuf and libonnx-dev's onnx.proto)");
#endif
    if (!plan_input_shapes.empty()) throw seam::Error("--input-shape is for ONNX files");
    if (*plan)
      return seam::train::run_plan(plan_model, plan_batch, plan_eval, plan_device, plan_measure,
                                   precision_of(plan_precision), layout_of(plan_layout), gib_bytes(plan_budget),
                                   chunks_of(plan_chunks));
    if (*bench) {
      if (bench_nproc > 1) return seam::dist::run_ranks(static_cast<int>(bench_nproc), seam::dist::without_nproc(argc, argv));
      bo.graph = !no_graph;
      bo.precision = precision_of(bench_precision);
      bo.layout = layout_of(bench_layout);
      bo.master_weights = !no_masters;
      bo.memory_budget = gib_bytes(bench_budget);
      bo.output_chunks = chunks_of(bench_chunks);
      if (recompute_opt->count() > 0) {
        bo.recompute.emplace();
        for (const std::string& r : bench_recompute)
          if (r != "none") bo.recompute->push_back(r);
      }
      return seam::bench::run_bench(bo);
    }
    if (*numerics) {
      if (numerics_list) {
        for (const std::string& n : seam::bench::numerics_ops()) std::cout << n << "\n";
        return 0;
      }
      for (const std::string& name : numerics_precisions) {
        const seam::Precision p = *seam::parse_precision(name);  // checked by one_of
        if (std::find(no.precisions.begin(), no.precisions.end(), p) == no.precisions.end()) no.precisions.push_back(p);
      }
      return seam::bench::run_numerics_command(no);
    }
    if (*ops) {
      print_ops(grads);
      return 0;
    }
    if (*onnx_suite) {
#ifdef SEAM_HAS_ONNX
      suite.device = seam::train::resolve_device(suite_device);
      return seam::onnx::run_onnx_suite(suite);
#else
      throw seam::Error("this build of seam has no ONNX importer (it needs protobuf and libonnx-dev's onnx.proto)");
#endif
    }
    std::cout << app.help();
    return 0;
  } catch (const seam::Error& err) {
    std::cerr << "seam: error: " << err.what() << "\n";
    return 1;
  } catch (const std::exception& err) {
    std::cerr << "seam: error: " << err.what() << "\n";
    return 1;
  }
}
