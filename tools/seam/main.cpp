// The seam command line: train, eval, plan, ops. Every command reports bad input as one
// clear line on stderr and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <iostream>

#include "bench/bench.h"
#include "data/fashion_mnist.h"
#include "ops/registry.h"
#include "seam/seam.h"
#include "train/trainer.h"
#ifdef SEAM_HAS_CUDA
#include "backend/cuda/device.h"
#endif

namespace {

void print_version() {
  std::cout << "seam " << SEAM_VERSION << "\n";
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
    bool is_grad = d.name.find("_grad") != std::string::npos;
    if (is_grad && !with_grads) continue;
    std::cout << d.signature() << "\n    " << d.doc;
    if (!is_grad && !d.grad) std::cout << "  [no gradient]";
    if (d.view_of >= 0) std::cout << "  [view: no copy]";
    std::cout << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"seam: compiles a neural network's whole training step into one plan and runs it"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "print the version and the devices seam sees");

  seam::train::TrainOptions t;
  t.data_dir = seam::data::default_fashion_mnist_dir();
  std::string train_model;
  bool quiet = false, json = false;
  auto* train = app.add_subcommand("train", "train a model file on Fashion-MNIST (default: examples/fmnist_mlp.json)");
  train->add_option("model", train_model, "model file (JSON)");
  train->add_option("--epochs", t.epochs, "number of epochs")->check(CLI::PositiveNumber);
  train->add_option("--batch", t.batch, "batch size")->check(CLI::PositiveNumber);
  train->add_option("--lr", t.lr, "learning rate")->check(CLI::NonNegativeNumber);
  train->add_option("--seed", t.seed, "seed for initialization, data order and dropout");
  train->add_option("--device", t.device, "cpu, cuda or auto (default: the model file's, auto = the GPU if there is one)")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  train->add_option("--out", t.out_dir, "output folder for metrics.csv and checkpoint.safetensors (default runs/<name>)");
  train->add_option("--resume", t.resume, "continue from a checkpoint exactly where it stopped");
  train->add_option("--data", t.data_dir, "folder with the four Fashion-MNIST IDX files");
  train->add_option("--val-split", t.val_split, "fraction of the training set held out for validation")->check(CLI::Range(0.0, 0.99));
  train->add_option("--max-steps", t.max_steps, "stop after this many steps and write a checkpoint")->check(CLI::PositiveNumber);
  train->add_option("--limit-train", t.limit_train, "train on the first N samples only")->check(CLI::PositiveNumber);
  train->add_option("--limit-test", t.limit_test, "evaluate on the first N test samples only")->check(CLI::PositiveNumber);
  train->add_option("--log-every", t.log_every, "read loss and accuracy from the device every N steps")
      ->check(CLI::PositiveNumber);
  train->add_flag("--quiet", quiet, "print only errors");
  train->add_flag("--json", json, "print JSON lines (one per step and per epoch) instead of text");

  seam::train::EvalOptions e;
  e.data_dir = seam::data::default_fashion_mnist_dir();
  std::string eval_model;
  auto* eval = app.add_subcommand("eval", "test accuracy, loss and confusion matrix of a checkpoint");
  eval->add_option("model", eval_model, "model file (default: the one stored in the checkpoint)");
  eval->add_option("--checkpoint", e.checkpoint, "checkpoint (safetensors)")->required();
  eval->add_option("--data", e.data_dir, "folder with the Fashion-MNIST IDX files");
  eval->add_option("--batch", e.batch, "batch size")->check(CLI::PositiveNumber);
  eval->add_option("--limit-test", e.limit_test, "evaluate on the first N test samples only")->check(CLI::PositiveNumber);
  eval->add_flag("--json", e.json, "print one JSON object");
  eval->add_option("--device", e.device, "cpu, cuda or auto (default: the GPU if there is one)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));

  std::string plan_model;
  std::optional<int64_t> plan_batch;
  bool plan_eval = false;
  auto* plan = app.add_subcommand("plan", "print the compiled training step: steps, shapes, arena offsets, memory, FLOPs");
  plan->add_option("model", plan_model, "model file (JSON)")->required();
  plan->add_option("--batch", plan_batch, "batch size")->check(CLI::PositiveNumber);
  plan->add_flag("--eval", plan_eval, "print the evaluation step instead");
  bool plan_measure = false;
  plan->add_flag("--measure", plan_measure, "time each kernel alone on the device and show it next to its estimate");
  std::string plan_device = "cpu";
  plan->add_option("--device", plan_device, "prepare the plan's kernels for cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));

  seam::bench::BenchOptions bo;
  bool no_graph = false;
  auto* bench = app.add_subcommand("bench", "time training steps of named workloads (W1 to W4, or model files): ms/step, kernels, TFLOP/s");
  bench->add_option("workloads", bo.workloads, "W1, W2, W3, W4 or MODEL.json files (default: W1 to W4)");
  bench->add_option("--steps", bo.steps, "timed steps per repetition")->check(CLI::PositiveNumber);
  bench->add_option("--repeats", bo.repeats, "repetitions; the median is reported")->check(CLI::PositiveNumber);
  bench->add_option("--warmup", bo.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  bench->add_flag("--no-graph", no_graph, "launch each step's kernels one by one instead of replaying a CUDA Graph");
  bench->add_flag("--upload", bo.upload, "upload a new batch from the host every step");
  bench->add_flag("--breakdown", bo.breakdown, "also time every step of the plan alone");
  bench->add_flag("--explain", bo.explain,
                  "also print each workload's kernel table as `seam plan --measure` does, against the unfused step");
  bench->add_option("--device", bo.device, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  bench->add_option("--csv", bo.csv, "also write the results as CSV");
  bench->add_option("--epilogue", bo.epilogue,
                    "GEMMs with a fused bias/activation: the faster of epilogue and separate kernels per shape "
                    "(fastest), or always one of them")
      ->check(CLI::IsMember({"fastest", "fused", "split", "split_t"}));
  bench->add_option("--fusion", bo.fusion,
                    "which fusions run: all, epilogues (GEMM epilogues and the loss, no elementwise groups) or none")
      ->check(CLI::IsMember({"all", "epilogues", "none"}));
  bench->add_option("--streams", bo.streams, "CUDA streams independent steps may run on side by side (1: one)")
      ->check(CLI::Range(1, 16));

  auto* ops = app.add_subcommand("ops", "list every op with its signature");
  bool grads = false;
  ops->add_flag("--grads", grads, "include the gradient ops that autodiff inserts");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    return app.exit(err);
  }
  try {
    if (version) {
      print_version();
      return 0;
    }
    if (*train) {
      if (!train_model.empty()) t.model_path = train_model;
      t.output = json ? seam::train::Output::json : quiet ? seam::train::Output::quiet : seam::train::Output::bar;
      return seam::train::run_train(t);
    }
    if (*eval) {
      if (!eval_model.empty()) e.model_path = eval_model;
      return seam::train::run_eval(e);
    }
    if (*plan) return seam::train::run_plan(plan_model, plan_batch, plan_eval, plan_device, plan_measure);
    if (*bench) {
      bo.graph = !no_graph;
      return seam::bench::run_bench(bo);
    }
    if (*ops) {
      print_ops(grads);
      return 0;
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
