// ONNX export: a seam graph's forward computation, from its input to one value, written
// as an ONNX model (opset 17) with the parameters and state values as initializers.
// `seam export MODEL --onnx FILE` writes a model file's network, its logits as the
// output "logits", from a checkpoint's values or the model's initialization.
#pragma once
#include <string>
#include <vector>

#include "seam/graph.h"
#include "seam/model.h"

namespace seam::onnx {

// The ONNX bytes of what `output` computes from the graph's inputs, in evaluation mode
// (dropout the identity, batch norm from its running statistics). `values` holds every
// parameter and state value the computation reads, by name. Shapes are static, as in the
// graph (the batch fixed). Throws naming the node whose op has no ONNX form.
std::string export_onnx(const Graph& g, ValueId output, const std::vector<HostTensor>& values,
                        const std::string& output_name = "logits");

struct ExportOptions {
  std::string model;       // a model file; empty: the checkpoint's stored model
  std::string checkpoint;  // empty: the model's initialization (its seed)
  std::string out;         // the .onnx file, written atomically
  int64_t batch = 1;
};
int run_export(const ExportOptions& o);

}  // namespace seam::onnx
