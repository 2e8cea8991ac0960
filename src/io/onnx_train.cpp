// ONNX networks in model files ("model": {"type": "onnx", ...}; src/io/model_file.h): the
// graph input the samples feed becomes "x", at the trainer's batch, and one graph output
// becomes the logits that the model file's loss reads.
#include <algorithm>
#include <fstream>
#include <iterator>

#include "io/model_file.h"
#include "io/onnx.h"
#include "onnx.pb.h"

namespace seam::onnx {

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return s;
}

io::ImportedNetwork import_network(const io::OnnxNetwork& net, const Shape& sample, int64_t batch,
                                   const std::string& where) {
  std::ifstream in(net.file, std::ios::binary);
  if (!in) fail(where, ": cannot open the ONNX file ", net.file);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ::onnx::ModelProto m;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) || !m.ParseFromString(bytes))
    fail(net.file, ": not an ONNX model (its protobuf does not parse)");
  // The graph's data inputs (older files list initializers among the inputs too).
  std::vector<const ::onnx::ValueInfoProto*> inputs;
  std::vector<std::string> names;
  for (const auto& v : m.graph().input()) {
    const bool init = std::any_of(m.graph().initializer().begin(), m.graph().initializer().end(),
                                  [&](const ::onnx::TensorProto& t) { return t.name() == v.name(); });
    if (!init) inputs.push_back(&v), names.push_back(v.name());
  }
  if (inputs.size() != 1 && net.input.empty())
    fail(where, ": ", net.file, " has the inputs ", joined(names), "; name the one the samples feed with \"input\"");
  const auto chosen = std::find_if(inputs.begin(), inputs.end(), [&](const ::onnx::ValueInfoProto* v) {
    return net.input.empty() || v->name() == net.input;
  });
  if (chosen == inputs.end()) fail(where, ": input '", net.input, "' is none of ", net.file, "'s: ", joined(names));
  if (inputs.size() != 1)
    fail(where, ": ", net.file, " has the inputs ", joined(names), "; a trained network takes one, its samples");
  // Its shape at this batch: the leading dim is the batch (symbolic, or fixed at it), the
  // rest the file's, or `sample` where the file leaves them symbolic.
  const ::onnx::ValueInfoProto& x = **chosen;
  const auto& dims = x.type().tensor_type().shape().dim();
  if (dims.empty()) fail(where, ": input '", x.name(), "' has no batch dimension");
  if (dims[0].has_dim_value() && dims[0].dim_value() != batch)
    fail(where, ": input '", x.name(), "' has a fixed batch of ", dims[0].dim_value(), ", not the batch_size ", batch,
         "; train at that batch, or export with a dynamic batch axis");
  if (!sample.empty() && sample.size() + 1 != static_cast<size_t>(dims.size()))
    fail(where, ": input '", x.name(), "' has rank ", dims.size(), "; the sample shape ", shape_str(sample),
         " needs rank ", sample.size() + 1, " with the batch");
  Shape shape{batch};
  for (int i = 1; i < dims.size(); ++i) {
    const int64_t given = sample.empty() ? -1 : sample[static_cast<size_t>(i - 1)];
    if (dims[i].has_dim_value() && given >= 0 && given != dims[i].dim_value())
      fail(where, ": input '", x.name(), "' has dim ", i, " = ", dims[i].dim_value(), ", not ", given);
    if (!dims[i].has_dim_value() && given < 0)
      fail(where, ": input '", x.name(), "' has the symbolic dim '", dims[i].dim_param(),
           "'; bind the sample shape with \"input\": {\"shape\": [...]}");
    shape.push_back(dims[i].has_dim_value() ? dims[i].dim_value() : given);
  }
  const OnnxOptions o{.input_shapes = {{x.name(), shape}},
                      .freeze_prefixes = net.freeze,
                      .input_names = {{x.name(), std::string("x")}}};
  OnnxImport imp = import_onnx_bytes(std::as_bytes(std::span(bytes)), net.file, o);
  size_t out = 0;
  if (net.output.empty()) {
    if (imp.outputs.size() != 1)
      fail(where, ": ", net.file, " has the outputs ", joined(imp.output_names), "; name the logits with \"output\"");
  } else {
    out = static_cast<size_t>(std::find(imp.output_names.begin(), imp.output_names.end(), net.output) -
                              imp.output_names.begin());
    if (out == imp.outputs.size())
      fail(where, ": output '", net.output, "' is none of ", net.file, "'s: ", joined(imp.output_names));
  }
  io::ImportedNetwork r;
  r.x = *imp.graph.find("x");
  r.logits = *imp.graph.find(imp.outputs[out]);
  r.graph = std::move(imp.graph);
  r.initial = std::move(imp.initial);
  return r;
}

}  // namespace

void enable_model_files() { io::set_onnx_importer(import_network); }

}  // namespace seam::onnx
