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

// "model": {"type": "onnx", "file": "net.onnx", ...}: a network imported from an ONNX file
// (src/io/onnx.h), its sample input fed the data and one of its outputs taken as the
// logits; the loss, optimizer and data are the model file's.
struct OnnxNetwork {
  std::string file;     // resolved against the model file's folder
  std::string input;    // the graph input the samples feed (empty: the graph's only one)
  std::string output;   // the graph output that is the logits (empty: the only one)
  std::vector<std::string> freeze;  // initializer name prefixes kept constant
};

// data.arrays: samples and labels in .npy files (resolved against the model file's folder).
// x [N, sample...] float (or integer token ids), y [N] or [N, labels...] integer class ids.
struct ArrayFiles {
  std::string x, y, test_x, test_y;  // test_*: optional, both or neither
};

struct ModelSpec {
  std::string source;        // file name, for messages
  nlohmann::ordered_json json;  // the parsed file
  std::string name;
  Shape input_shape;         // one sample, e.g. [1, 28, 28], or [T] token ids
  DType input_dtype = DType::f32;  // i32 for token ids
  int64_t classes = 10;      // the logits' last dim (a language model's vocabulary)
  Shape label_shape;         // one sample's labels: [] (a class) or [T] (a token window)
  // "model": {"type": "gpt", ...} in place of layers or nodes: the network built by
  // nn::gpt, its input [block_size] token ids.
  std::optional<nn::GptConfig> gpt;
  std::optional<OnnxNetwork> onnx;
  int64_t batch_size = 128;
  int64_t epochs = 10;
  uint64_t seed = 0;
  std::string device = "auto";     // auto | cpu | cuda
  Precision precision = Precision::f32;  // what GEMMs and convolutions compute in
  bool master_weights = true;            // false: 16-bit parameters (ModelOptions::master_weights)
  bool deterministic = false;            // bitwise repeatable GPU steps (ModelOptions::deterministic)
  LayoutPolicy layout = LayoutPolicy::automatic;  // where convolutions run channels-last
  std::vector<std::string> recompute;    // activations the backward recomputes (CompileOptions::recompute)
  int output_chunks = 1;                 // CompileOptions::output_chunks
  size_t memory_budget = 0;              // "memory_budget_gib" in bytes (CompileOptions::memory_budget)
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
  std::optional<ArrayFiles> arrays;
  bool token_input() const { return input_dtype == DType::i32; }
};

// Parses and checks a model file; throws seam::Error with file:line:column for JSON
// syntax errors and the layer index/name for everything else.
ModelSpec parse_model_file(const std::string& path);
ModelSpec parse_model_json(const std::string& text, const std::string& source);
// An ONNX file trained with the settings of a model file without a network (`config`,
// empty for the defaults): `seam train model.onnx --config train.json`.
ModelSpec parse_onnx_training(const std::string& onnx_path, const std::string& config_path);
// A model file, or an ONNX file with its training config (see above).
ModelSpec load_model_spec(const std::string& path, const std::string& config_path = "");

// The state tensor the training step adds its loss and correct-prediction count to
// (summed on the device; the trainer reads and clears it).
inline constexpr const char* kTrainMetrics = "train.metrics";

struct BuiltGraph {
  Graph graph;
  ValueId x = -1, y = -1, logits = -1, loss = -1, prediction = -1;
  std::vector<std::string> layer_names;
  std::vector<PrecisionOverride> overrides;  // layers with a "precision" of their own
  // Values an imported network starts from (its initializers), by parameter or state name.
  std::vector<HostTensor> initial;
};

// Writes BuiltGraph::initial into a model made from its graph (nothing for a network seam
// initializes itself).
void load_initial(Model& model, const BuiltGraph& b);

// What an imported network gives build_graph: its graph with the sample input named "x",
// the logits, and its initial values.
struct ImportedNetwork {
  Graph graph;
  ValueId x = -1, logits = -1;
  std::vector<HostTensor> initial;
};
// x_shape: the sample shape to bind (empty: the file's), batch: the leading dim.
using NetworkImporter = ImportedNetwork (*)(const OnnxNetwork& net, const Shape& x_shape, int64_t batch,
                                            const std::string& where);
// The ONNX importer lives in its own library (seam_onnx); the programs that link it
// register it here (onnx::enable_model_files), and model files then take "type": "onnx".
void set_onnx_importer(NetworkImporter f);

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
