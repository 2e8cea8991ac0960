// Model files: JSON describing the network (a sequential list of layers, or named nodes
// with explicit inputs for residual connections), the loss, the optimizer and schedule,
// and the run settings. Parsing checks everything and reports errors with the file,
// line and column, or the layer and the nearest known names.
#pragma once
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "seam/graph.h"
#include "seam/model.h"
#include "seam/nn.h"
#include "seam/optim.h"

namespace seam::io {

struct ModelSpec {
  std::string source;        // file name, for messages
  nlohmann::ordered_json json;  // the parsed file
  std::string name;
  Shape input_shape;         // one sample, e.g. [1, 28, 28], or [T] token ids
  DType input_dtype = DType::f32;  // i32 for token ids
  int64_t classes = 10;      // the logits' last dim (a language model's vocabulary)
  // "model": {"type": "gpt", ...} in place of layers or nodes: the network built by
  // nn::gpt, its input [block_size] token ids.
  std::optional<nn::GptConfig> gpt;
  int64_t batch_size = 128;
  int64_t epochs = 10;
  uint64_t seed = 0;
  std::string device = "auto";     // auto | cpu | cuda
  Precision precision = Precision::f32;  // what GEMMs and convolutions compute in
  bool master_weights = true;            // false: 16-bit parameters (ModelOptions::master_weights)
  LayoutPolicy layout = LayoutPolicy::automatic;  // where convolutions run channels-last
  OptimizerConfig optimizer;
  bool cosine_total_from_run = false;  // schedule.total_steps was left to the run length
  // Sets a cosine schedule's total_steps from the run's length when the file left it
  // out: `steps_per_epoch` optimizer steps an epoch.
  void fix_schedule_length(int64_t steps_per_epoch) {
    if (cosine_total_from_run)
      optimizer.schedule.total_steps = std::max<int64_t>(1, epochs * steps_per_epoch - optimizer.schedule.warmup_steps);
  }
  double label_smoothing = 0.0;
  double val_split = 0.0;
  // Train-time augmentation (data.augment): random crops of the image padded by this many
  // pixels, and left-right flips (data::Augment).
  int64_t crop_padding = 0;
  bool horizontal_flip = false;
  // data.tokens: a folder with train.tok and val.tok (docs/data.md) for a model of token
  // ids; empty: the images of the data folder given to the trainer.
  std::string tokens_dir;
  bool token_input() const { return input_dtype == DType::i32; }
};

// Parses and checks a model file; throws seam::Error with file:line:column for JSON
// syntax errors and the layer index/name for everything else.
ModelSpec parse_model_file(const std::string& path);
ModelSpec parse_model_json(const std::string& text, const std::string& source);

// The state tensor the training step adds its loss and correct-prediction count to
// (summed on the device; the trainer reads and clears it).
inline constexpr const char* kTrainMetrics = "train.metrics";

struct BuiltGraph {
  Graph graph;
  ValueId x = -1, y = -1, logits = -1, loss = -1, prediction = -1;
  std::vector<std::string> layer_names;
  std::vector<PrecisionOverride> overrides;  // layers with a "precision" of their own
};

// A random batch for a graph's inputs x and y: x N(0, 1) (f32) or token ids uniform over
// [0, classes) (i32), labels uniform over [0, classes), drawn from `rng` in that order;
// what `seam step` writes out and `seam bench` times.
struct RandomBatch {
  std::vector<float> x;
  std::vector<int32_t> ids, y;
  std::vector<std::byte> x_bytes() const;  // x or ids, whichever the input takes
};
RandomBatch random_batch(const TensorType& x, const TensorType& y, int64_t classes, std::mt19937_64& rng);

// The graph for a batch size: input "x" [batch, input_shape...], the layers, logits
// [batch, ..., classes], labels "y" (i32) of the logits' shape less its last dim (one per
// image, or one per position of a token sequence), the mean cross-entropy over the labels
// that are not -100, and argmax predictions.
BuiltGraph build_graph(const ModelSpec& spec, int64_t batch);

}  // namespace seam::io
