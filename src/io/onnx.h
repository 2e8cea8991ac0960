// ONNX import: an ONNX model (ModelProto, opsets 7 to 17 of the default domain) becomes a
// seam Graph. The rest of seam sees an ordinary graph: the precision and layout passes,
// fusion, the memory plan and the CUDA Graph apply to it unchanged.
//
// - Graph inputs that are not initializers become seam inputs, their dtype mapped
//   (float -> f32, double -> f64, float16 -> f16, bfloat16 -> bf16, int64/int32 -> i32,
//   bool/uint8 -> u8) and their shape static: a dimension the file leaves symbolic must be
//   bound by OnnxOptions::input_shapes (`--input-shape x=1x3x224x224`).
// - Initializers that nodes read as data become parameters (float ones; trainable unless
//   OnnxOptions::freeze) or state values (frozen or integer ones), their values in
//   OnnxImport::initial for Model::write_param / write_state (load_initial). Initializers
//   and Constant nodes that an op reads as an attribute-like operand (Reshape's shape,
//   Slice's starts, Clip's bounds...) are folded at import.
// - Each node maps onto seam ops (src/io/onnx_ops.cpp); a node whose op type, attribute or
//   operand seam cannot express fails the import with an error naming the node, its op
//   type and the reason. So does a malformed file.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "seam/model.h"

namespace seam::onnx {

struct OnnxOptions {
  std::map<std::string, Shape> input_shapes;  // binds symbolic dims of graph inputs
  bool freeze = false;                        // initializers as constants, not parameters
  // Initializers whose names start with one of these are frozen (state values), the rest
  // trained: fine-tuning a head on a frozen body.
  std::vector<std::string> freeze_prefixes;
  // Graph inputs given another name in the seam graph (a trainer feeds "x").
  std::map<std::string, std::string> input_names;
  // Graph inputs given a value: constants at import, as if they were initializers of a
  // frozen model (a shape or axes fed as an input; the node tests do that).
  std::map<std::string, HostTensor> values;
};

struct OnnxImport {
  Graph graph;
  std::vector<std::string> inputs;   // the graph's inputs, in the file's order
  std::vector<std::string> outputs;  // seam value names of the graph's outputs, in order
  std::vector<std::string> output_names;  // the file's names of them
  // The initializers that became parameters or state values, by their seam names.
  std::vector<HostTensor> initial;
  int64_t opset = 0;                 // of the default domain
  std::string producer;              // producer_name producer_version, as the file says
};

OnnxImport import_onnx(const std::string& path, const OnnxOptions& options = {});
// From bytes already read (`where` names them in errors): for tests and fuzzing.
OnnxImport import_onnx_bytes(std::span<const std::byte> bytes, const std::string& where,
                             const OnnxOptions& options = {});
// Writes OnnxImport::initial into a model made from its graph.
void load_initial(Model& model, const OnnxImport& imported);

// Lets model files name ONNX networks ("model": {"type": "onnx", "file": ...}) and
// `seam train model.onnx --config c.json` train them (src/io/onnx_train.cpp).
void enable_model_files();

// A serialized TensorProto (the node tests' input_N.pb / output_N.pb), its data in the
// dtype seam keeps it in (int64 as i32, bool as u8); `name` is the proto's.
HostTensor read_tensor_file(const std::string& path);

}  // namespace seam::onnx
