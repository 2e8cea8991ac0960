// The command line's ONNX verbs: `seam run model.onnx` (inference on .npy inputs, the
// outputs written as .npy) and `seam plan model.onnx` (its evaluation plan, as `seam plan`
// prints any model's).
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "seam/model.h"

namespace seam::onnx {

struct RunOptions {
  std::string model;
  std::map<std::string, std::string> inputs;  // graph input -> .npy file
  std::map<std::string, Shape> input_shapes;  // --input-shape name=1x3x224x224
  std::string out_dir = ".";                  // each output as <out_dir>/<output name>.npy
  Device device = Device::cpu;
  Precision precision = Precision::f32;
  int time_runs = 0;  // > 0: then times the model, 5 rounds of this many runs
  bool measure = false;  // plan: each kernel's measured time beside its estimate
};

int run_onnx(const RunOptions& o);
int plan_onnx(const RunOptions& o);

// "x=1x3x224x224" -> {"x", {1, 3, 224, 224}}; throws naming the text.
std::pair<std::string, Shape> parse_input_shape(const std::string& text);

}  // namespace seam::onnx
