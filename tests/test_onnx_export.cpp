// ONNX export (src/io/onnx_export.h), checked by round trip: each example network written
// as ONNX from random values (running statistics too), read back by seam's importer, and
// run on random inputs gives the logits the original model gives; the CLI writes a file
// `seam run` reads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "cli_fixture.h"
#include "io/model_file.h"
#include "io/npy.h"
#include "io/onnx.h"
#include "io/onnx_export.h"
#include "seam/seam.h"
#include "test_util.h"

namespace seam::testing {
namespace {

// Every float parameter and state value random (variances positive), so that an export
// that dropped or swapped one shows; at a tenth of the unit scale, so that a deep
// network's activations stay where a trained one's are and rounding is not amplified.
std::vector<HostTensor> randomized(Model& m, uint64_t seed) {
  std::vector<HostTensor> all = m.save_tensors();
  for (HostTensor& h : all) {
    if (h.type.dtype != DType::f32) continue;
    std::vector<float> v = random_floats(static_cast<size_t>(h.type.numel()), seed++);
    for (float& x : v) x *= 0.1f;
    if (h.name.find("var") != std::string::npos)
      for (float& x : v) x = 0.5f + std::abs(x);
    std::memcpy(h.data.data(), v.data(), h.data.size());
  }
  m.load_tensors(all);
  return all;
}

std::vector<std::byte> sample_input(const TensorType& t, int64_t classes, uint64_t seed) {
  if (t.dtype == DType::i32) return bytes_of(random_labels(static_cast<size_t>(t.numel()), static_cast<int32_t>(classes), seed));
  return bytes_of(random_floats(static_cast<size_t>(t.numel()), seed));
}

class OnnxExport : public ::testing::TestWithParam<const char*> {};

TEST_P(OnnxExport, AnExampleRoundTripsToTheSameLogits) {
  const io::ModelSpec spec = io::parse_model_file(std::string(SEAM_EXAMPLES "/") + GetParam() + ".json");
  const io::BuiltGraph bg = io::build_graph(spec, 2);
  Model original(bg.graph, {.seed = 3});
  const std::vector<HostTensor> values = randomized(original, 100);
  const std::string bytes = onnx::export_onnx(bg.graph, bg.logits, values);

  onnx::OnnxImport imp = onnx::import_onnx_bytes(std::as_bytes(std::span(bytes)), "export.onnx", {});
  ASSERT_EQ(imp.inputs, std::vector<std::string>{"x"});
  ASSERT_EQ(imp.output_names, std::vector<std::string>{"logits"});
  Model back(imp.graph, {.seed = 4});
  onnx::load_initial(back, imp);
  // The parameters come back as parameters (trainable), by their names.
  for (const Slot& p : original.layout().params) EXPECT_NE(back.layout().param(p.name), nullptr) << p.name;
  EXPECT_EQ(back.layout().params.size(), original.layout().params.size());  // constants stay constants
  // Attention, written as MatMul, Softmax and MatMul, comes back as the attention op.
  auto attentions = [](const Graph& graph) {
    int n = 0;
    for (const Node& node : graph.nodes()) n += node.op == Op::attention || node.op == Op::attention_qkv;
    return n;
  };
  EXPECT_EQ(attentions(imp.graph), attentions(bg.graph));

  const TensorType& xt = bg.graph.value(bg.x).type;
  const std::vector<std::byte> x = sample_input(xt, spec.classes, 7);
  Program a = original.compile({.mode = Mode::eval, .outputs = {bg.logits}});
  a.set_input("x", std::span<const std::byte>(x));
  a.run();
  const ValueId out = *imp.graph.find(imp.outputs[0]);
  Program b = back.compile({.mode = Mode::eval, .outputs = {out}});
  b.set_input("x", std::span<const std::byte>(x));
  b.run();
  const auto want = a.read_as<float>(bg.graph.value(bg.logits).name);
  const auto got = b.read_as<float>(imp.outputs[0]);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::abs(want[i]))) << i;
}

INSTANTIATE_TEST_SUITE_P(Examples, OnnxExport,
                         ::testing::Values("fmnist_mlp", "fmnist_cnn", "fmnist_resnet", "resnet18_cifar", "gpt_fortunes"));

class OnnxExportCli : public CliTest {};

TEST_F(OnnxExportCli, ACheckpointExportsAndRunsAndBadInputIsNamed) {
  const std::string model = std::string(SEAM_EXAMPLES) + "/fmnist_mlp.json";
  const std::string out = (dir / "mlp.onnx").string();
  const CliResult r = run("export " + model + " --onnx " + out + " --batch 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("x f32[3,784] -> logits f32[3,10]; initial values"), std::string::npos) << r.out;
  io::write_npy((dir / "x.npy").string(), HostTensor{"x", {DType::f32, {3, 784}}, bytes_of(random_floats(3 * 784, 9))});
  const CliResult ran = run("run " + out + " --input x=" + (dir / "x.npy").string() + " --out " + dir.string() +
                            " --device cpu");
  ASSERT_EQ(ran.code, 0) << ran.err;
  EXPECT_EQ(io::read_npy((dir / "logits.npy").string()).type.shape, (Shape{3, 10}));

  const CliResult none = run("export --onnx " + out);
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("give a model file, a checkpoint, or both"), std::string::npos) << none.err;
  const CliResult missing = run("export " + model);
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("--onnx"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace seam::testing
