// Training and evaluation of classifiers and language models from model files: the loop behind
// `seam train` and `seam eval`, with checkpoints that resume exactly.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/model_file.h"

namespace seam::train {

enum class Output { bar, quiet, json };

// Where an epoch stands, at each log point and at the epoch's end (done == total).
struct ProgressEvent {
  int64_t epoch, epochs;  // from 1
  int64_t done, total;    // steps of this epoch
  double loss, accuracy;  // the epoch's means so far
};

struct TrainOptions {
  std::optional<std::string> model_path;  // empty: the model stored in the checkpoint
  std::string config;                     // with an ONNX model_path: its training settings
  std::string data_dir;                   // empty: the model's default data (see open_data)
  std::string out_dir;                    // empty: runs/<model name>
  std::optional<std::string> resume;      // checkpoint to continue from
  std::optional<int64_t> epochs, batch;
  std::optional<double> lr;
  std::optional<uint64_t> seed;
  std::optional<std::string> device;
  std::optional<Precision> precision;     // overrides the model file's
  std::optional<LayoutPolicy> layout;     // overrides the model file's
  std::optional<size_t> memory_budget;    // bytes; overrides the model file's memory_budget_gib
  std::optional<int> output_chunks;       // overrides the model file's output_chunks
  bool deterministic = false;             // --deterministic: on even where the model file leaves it off
  int zero = 0;                           // --zero 1: ZeRO-1 across the ranks (ModelOptions::zero)
  std::optional<double> val_split;
  Output output = Output::bar;
  // Called with each ProgressEvent; set, it replaces the terminal bar (Output::bar), as
  // Python's seam.train does with tqdm.
  std::function<void(const ProgressEvent&)> on_progress;
  int64_t max_steps = 0;    // > 0: stop after this many steps in all, checkpointing
  int64_t log_every = 50;   // read the metrics from the device every N steps (and per epoch)
  // Stop with an error when this many updates in a row were skipped for a non-finite
  // loss or gradient (checked where the metrics are read).
  int64_t max_skipped_steps = 20;
  int64_t limit_train = 0;  // > 0: use only the first N training samples
  int64_t limit_test = 0;   // > 0: evaluate on the first N test samples
};

// Optimizer steps in an epoch of the model's default data (its data.tokens, or Debian's
// Fashion-MNIST), for a cosine schedule whose length the file left to the run; 1 where
// that data is not there (a plan or an exported step then shows a schedule of one epoch).
int64_t data_steps_per_epoch(const io::ModelSpec& spec, int64_t batch);

// "cpu", "cuda", or "auto": the GPU if there is one.
Device resolve_device(const std::string& requested);

// Runs the whole training; returns the process exit code (0, or 128 + the signal when
// SIGINT or SIGTERM stopped it: 130, 143; it writes a checkpoint first).
int run_train(const TrainOptions& o);

struct EvalOptions {
  std::optional<std::string> model_path;
  std::string checkpoint;
  std::string data_dir;
  std::optional<int64_t> batch;
  int64_t limit_test = 0;
  bool json = false;
  std::string device = "auto";
  std::optional<Precision> precision;  // overrides the model file's
};

// Evaluates a checkpoint on the test set: accuracy, loss, confusion matrix.
int run_eval(const EvalOptions& o);

struct SampleOptions {
  std::string checkpoint;
  std::optional<std::string> model_path;  // empty: the model stored in the checkpoint
  std::string prompt;                     // text (byte tokens); empty: a newline
  int64_t tokens = 200;                   // how many to generate
  double temperature = 1.0;               // 0: the most likely token every time
  int64_t top_k = 0;                      // > 0: draw among the k most likely only
  uint64_t seed = 0;
  std::string device = "auto";
};

// Generates text from a language model's checkpoint, token by token, each from one
// forward pass over the last block_size tokens (recomputed, no key/value cache); prints
// the prompt and what follows it. Byte vocabularies print as text, larger ones as ids.
int run_sample(const SampleOptions& o);

// A checkpoint's model (the given file's, or the one stored in it) and its tensors.
std::pair<io::ModelSpec, std::vector<HostTensor>> read_checkpoint_model(const std::string& checkpoint,
                                                                        const std::optional<std::string>& model_path);

struct StepOptions {
  std::string model_path;
  std::string out_dir;
  std::optional<int64_t> batch;
  std::string device = "auto";
  std::optional<Precision> precision;  // overrides the model file's
  std::optional<LayoutPolicy> layout;
  EpiloguePolicy epilogue = EpiloguePolicy::fastest;
  uint64_t data_seed = 0;
  int64_t steps = 1;  // the first written out; each loss in step.json's "losses"
};

// One training step of a model file on a random batch, written out for another framework
// to check itself against (bench/torch_twin.py): OUT/init.safetensors (parameters and
// states before the step, by name), OUT/batch.safetensors (x, y), OUT/after.safetensors
// (parameters and states after the update, the gradients as "grad/<name>", the logits
// and the loss) and OUT/step.json (what was run, with the steps an epoch its schedule
// assumed). steps > 1: as many steps in all on the same batch, each one's loss in
// step.json's "losses" (a loss curve for the twin to follow).
int run_step(const StepOptions& o);

// Prints the compiled step of a model file (training plan, or evaluation with eval).
// device: where the plan's kernels are prepared (cpu, cuda, auto).
// measure: also time each step alone on the device (a GPU, or the CPU) and show it next to
// the estimate.
// precision: overrides the model file's.
int run_plan(const std::string& model_path, std::optional<int64_t> batch, bool eval, const std::string& device,
             bool measure = false, std::optional<Precision> precision = std::nullopt,
             std::optional<LayoutPolicy> layout = std::nullopt, std::optional<size_t> memory_budget = std::nullopt,
             std::optional<int> output_chunks = std::nullopt);

}  // namespace seam::train
