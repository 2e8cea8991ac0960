// The ONNX importer (src/io/onnx.h): a small CNN written as ONNX protobuf here imports
// into the same function seam computes from the same weights, trains, and every kind of
// bad input is refused with the node, its op type and the reason. The backend node tests
// run through `seam onnx-suite` (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "io/npy.h"
#include "io/onnx.h"
#include "io/safetensors.h"
#include "onnx.pb.h"
#include "seam/seam.h"
#include "onnx_build.h"
#include "test_util.h"

namespace seam::testing {
namespace {

namespace P = ::onnx;
using namespace onnx_build;

struct Cnn {
  std::vector<float> w1 = random_floats(8 * 3 * 3 * 3, 11), b1 = random_floats(8, 12),
                     fc = random_floats(10 * 8, 13), fcb = random_floats(10, 14);
  // x [N, 3, 8, 8] -> Conv 3x3 pad 1 -> Relu -> MaxPool 2 -> GlobalAveragePool -> Flatten
  // -> Gemm (transB) -> y [N, 10]
  std::string bytes(const std::string& symbolic = "", bool asymmetric = false) const {
    P::ModelProto m;
    m.set_ir_version(8);
    m.set_producer_name("seam test");
    m.add_opset_import()->set_version(13);
    P::GraphProto& g = *m.mutable_graph();
    g.set_name("cnn");
    add_io(g.mutable_input(), "x", {4, 3, 8, 8}, symbolic);
    add_tensor(g, "w1", {8, 3, 3, 3}, w1);
    add_tensor(g, "b1", {8}, b1);
    add_tensor(g, "fc", {10, 8}, fc);
    add_tensor(g, "fcb", {10}, fcb);
    P::NodeProto* conv = add_node(g, "Conv", {"x", "w1", "b1"}, {"c"});
    set_ints(conv, "pads", asymmetric ? std::vector<int64_t>{1, 1, 0, 1} : std::vector<int64_t>{1, 1, 1, 1});
    set_ints(conv, "kernel_shape", {3, 3});
    add_node(g, "Relu", {"c"}, {"r"});
    set_ints(add_node(g, "MaxPool", {"r"}, {"p"}), "kernel_shape", {2, 2});
    add_node(g, "GlobalAveragePool", {"p"}, {"gap"});
    add_node(g, "Flatten", {"gap"}, {"f"});
    P::NodeProto* gemm = add_node(g, "Gemm", {"f", "fc", "fcb"}, {"y"});
    auto* tb = gemm->add_attribute();
    tb->set_name("transB");
    tb->set_type(P::AttributeProto::INT);
    tb->set_i(1);
    add_io(g.mutable_output(), "y", {4, 10});
    return m.SerializeAsString();
  }
};

onnx::OnnxImport import(const std::string& bytes, const onnx::OnnxOptions& o = {}) {
  return onnx::import_onnx_bytes(std::as_bytes(std::span(bytes)), "model.onnx", o);
}

std::string error_of(const std::string& bytes, const onnx::OnnxOptions& o = {}) {
  try {
    import(bytes, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Onnx, ACnnComputesWhatSeamComputesFromTheSameWeights) {
  const Cnn net;
  onnx::OnnxImport imp = import(net.bytes());
  EXPECT_EQ(imp.opset, 13);
  EXPECT_EQ(imp.inputs, std::vector<std::string>{"x"});
  ASSERT_EQ(imp.outputs.size(), 1u);
  EXPECT_EQ(imp.initial.size(), 4u);
  Model m(imp.graph, {.seed = 1});
  onnx::load_initial(m, imp);
  for (const char* p : {"w1", "b1", "fc", "fcb"}) EXPECT_NE(m.layout().param(p), nullptr) << p;
  Program p = m.compile({.mode = Mode::eval, .outputs = {*imp.graph.find(imp.outputs[0])}});
  const auto x = random_floats(4 * 3 * 8 * 8, 15);
  p.set_input("x", std::span<const float>(x));
  p.run();
  const auto got = p.read_as<float>(imp.outputs[0]);

  // The same network from seam's builders.
  Graph g;
  Var xi = g.input("x", {4, 3, 8, 8});
  Var h = relu(conv2d(xi, g.param("w1", {8, 3, 3, 3}, Init::zeros()), g.param("b1", {8}, Init::zeros()),
                      {.padding = {1, 1}}));
  Var y = linear(global_avg_pool(max_pool2d(h, {2, 2}, {1, 1})), g.param("fc", {10, 8}, Init::zeros()),  // ONNX: stride 1
                 g.param("fcb", {10}, Init::zeros()));
  Model ref(g, {.seed = 1});
  ref.write_param("w1", bytes_of(net.w1));
  ref.write_param("b1", bytes_of(net.b1));
  ref.write_param("fc", bytes_of(net.fc));
  ref.write_param("fcb", bytes_of(net.fcb));
  Program rp = ref.compile({.mode = Mode::eval, .outputs = {y.id()}});
  rp.set_input("x", std::span<const float>(x));
  rp.run();
  const auto want = rp.read_as<float>(y.name());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << i;
}

TEST(Onnx, AnImportedNetworkTrains) {
  const Cnn net;
  onnx::OnnxImport imp = import(net.bytes());
  Graph& g = imp.graph;
  Var labels = g.input("labels", {4}, DType::i32);
  Var loss = cross_entropy(g.var(*g.find(imp.outputs[0])), labels);
  Model m(g, {.seed = 1});
  onnx::load_initial(m, imp);
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adamw(0.02)});
  const auto x = random_floats(4 * 3 * 8 * 8, 16);
  const auto y = random_labels(4, 10, 17);
  p.set_input("x", std::span<const float>(x));
  p.set_input("labels", std::span<const int32_t>(y));
  std::vector<float> losses;
  for (int i = 0; i < 40; ++i) {
    p.run();
    losses.push_back(p.read_as<float>(loss.name())[0]);
  }
  EXPECT_LT(losses.back(), 0.3f * losses.front()) << losses.front() << " -> " << losses.back();
}

// What exporters write for a position embedding: an int64 index buffer sliced to the end
// with INT64_MAX, and a trained table gathered by it (a graph gather, not a folded
// constant, so the table stays a parameter).
TEST(Onnx, APositionTableGatheredByASlicedConstantStaysAParameter) {
  P::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  P::GraphProto& g = *m.mutable_graph();
  add_io(g.mutable_input(), "x", {3, 2});
  const std::vector<float> table = random_floats(4 * 2, 51);
  add_tensor(g, "wpe", {4, 2}, table);
  P::TensorProto* pos = g.add_initializer();
  pos->set_name("pos");
  pos->set_data_type(P::TensorProto::INT64);
  pos->add_dims(4);
  for (int64_t i = 0; i < 4; ++i) pos->add_int64_data(i);
  auto ints = [&](const std::string& name, int64_t v) {
    P::TensorProto* t = g.add_initializer();
    t->set_name(name);
    t->set_data_type(P::TensorProto::INT64);
    t->add_dims(1);
    t->add_int64_data(v);
  };
  ints("one", 1);
  ints("end", std::numeric_limits<int64_t>::max());
  ints("zero", 0);
  add_node(g, "Slice", {"pos", "one", "end", "zero"}, {"idx"});
  add_node(g, "Gather", {"wpe", "idx"}, {"rows"});
  add_node(g, "Add", {"x", "rows"}, {"y"});
  add_io(g.mutable_output(), "y", {3, 2});
  onnx::OnnxImport imp = import(m.SerializeAsString());
  Model model(imp.graph, {.seed = 1});
  onnx::load_initial(model, imp);
  ASSERT_NE(model.layout().param("wpe"), nullptr);
  Program p = model.compile({.mode = Mode::eval, .outputs = {*imp.graph.find(imp.outputs[0])}});
  const auto x = random_floats(6, 52);
  p.set_input("x", std::span<const float>(x));
  p.run();
  const auto y = p.read_as<float>(imp.outputs[0]);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], x[i] + table[i + 2]) << i;
}

// PyTorch writes equal initializers (every layer norm's ones) once, the others as its
// Identity: each is still a parameter of its own, as in the exported model.
TEST(Onnx, AnInitializerIdentityIsAParameterOfItsOwn) {
  P::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  P::GraphProto& g = *m.mutable_graph();
  add_io(g.mutable_input(), "x", {2, 3});
  add_tensor(g, "ln1.weight", {3}, random_floats(3, 61));
  add_node(g, "Identity", {"ln1.weight"}, {"ln2.weight"});
  add_node(g, "Mul", {"x", "ln1.weight"}, {"h"});
  add_node(g, "Mul", {"h", "ln2.weight"}, {"y"});
  add_io(g.mutable_output(), "y", {2, 3});
  onnx::OnnxImport imp = import(m.SerializeAsString());
  Model model(imp.graph, {.seed = 1});
  EXPECT_NE(model.layout().param("ln1.weight"), nullptr);
  EXPECT_NE(model.layout().param("ln2.weight"), nullptr);
  EXPECT_EQ(model.layout().params.size(), 2u);
}

TEST(Onnx, FrozenInitializersAreStateNotParameters) {
  onnx::OnnxImport imp = import(Cnn().bytes(), {.freeze = true});
  Model m(imp.graph, {.seed = 1});
  EXPECT_EQ(m.layout().params.size(), 0u);
  EXPECT_EQ(m.layout().states.size(), 4u);
}

TEST(Onnx, ASymbolicDimensionIsBoundByName) {
  const Cnn net;
  EXPECT_NE(error_of(net.bytes("batch")).find("input 'x' has a symbolic dimension 'batch': bind it with --input-shape x="),
            std::string::npos)
      << error_of(net.bytes("batch"));
  onnx::OnnxImport imp = import(net.bytes("batch"), {.input_shapes = {{"x", {4, 3, 8, 8}}}});
  EXPECT_EQ(imp.graph.value(*imp.graph.find("x")).type.shape, (Shape{4, 3, 8, 8}));
  EXPECT_NE(error_of(net.bytes(), {.input_shapes = {{"z", {1}}}}).find("--input-shape names 'z', which is no input"),
            std::string::npos);
}

TEST(Onnx, BadInputIsRefusedNamingTheNodeAndTheReason) {
  EXPECT_EQ(error_of("not a protobuf at all, \xff\xff"), "model.onnx: not an ONNX model (its protobuf does not parse)");
  EXPECT_NE(error_of(Cnn().bytes("", true)).find("node 'c_node' (Conv): pads [1,1,0,1] differ at the two ends"),
            std::string::npos)
      << error_of(Cnn().bytes("", true));
  // An op type seam does not import.
  P::ModelProto m;
  m.ParseFromString(Cnn().bytes());
  m.mutable_graph()->mutable_node(1)->set_op_type("Hardmax");
  EXPECT_NE(error_of(m.SerializeAsString()).find("node 'r_node' (Hardmax): seam has no import for the op type Hardmax"),
            std::string::npos)
      << error_of(m.SerializeAsString());
  // A node reading a value nothing makes.
  m.ParseFromString(Cnn().bytes());
  m.mutable_graph()->mutable_node(1)->set_input(0, "nowhere");
  EXPECT_NE(error_of(m.SerializeAsString()).find("reads 'nowhere', which no earlier node, input or initializer makes"),
            std::string::npos);
  // An opset seam does not know, and raw data of the wrong size.
  m.ParseFromString(Cnn().bytes());
  m.mutable_opset_import(0)->set_version(99);
  EXPECT_NE(error_of(m.SerializeAsString()).find("opset 99 of the default domain"), std::string::npos);
  m.ParseFromString(Cnn().bytes());
  m.mutable_graph()->mutable_initializer(0)->mutable_raw_data()->resize(12);
  EXPECT_NE(error_of(m.SerializeAsString()).find("initializer 'w1': tensor 'w1' has 12 bytes of raw data for 216 FLOAT"),
            std::string::npos)
      << error_of(m.SerializeAsString());
}

// Ops the importer writes with seam's own (here ReduceLogSumExp: a max-pool, a stop
// gradient, exp, sum and log) differentiate as the op does: the gradient of
// logsumexp(x + p) along axis 1 with respect to the initializer p is softmax(x + p).
TEST(Onnx, AComposedOpDifferentiatesAsTheOp) {
  P::ModelProto m;
  m.add_opset_import()->set_version(13);
  P::GraphProto& g = *m.mutable_graph();
  add_io(g.mutable_input(), "x", {2, 5});
  const auto p0 = random_floats(10, 31);
  add_tensor(g, "p", {2, 5}, p0);
  add_node(g, "Add", {"x", "p"}, {"s"});
  P::NodeProto* lse = add_node(g, "ReduceLogSumExp", {"s"}, {"y"});
  set_ints(lse, "axes", {1});
  add_io(g.mutable_output(), "y", {2, 1});
  onnx::OnnxImport imp = import(m.SerializeAsString());
  Var loss = sum(imp.graph.var(*imp.graph.find(imp.outputs[0])));
  Model model(imp.graph, {.seed = 1});
  onnx::load_initial(model, imp);
  Program prog = model.compile({.loss = loss.id(), .gradients = true});
  const auto x = random_floats(10, 32);
  prog.set_input("x", std::span<const float>(x));
  prog.run();
  const auto grad = prog.grad_as<float>("p");
  for (int r = 0; r < 2; ++r) {
    double mx = -1e30, z = 0;
    for (int j = 0; j < 5; ++j) mx = std::max(mx, static_cast<double>(x[r * 5 + j] + p0[r * 5 + j]));
    for (int j = 0; j < 5; ++j) z += std::exp(x[r * 5 + j] + p0[r * 5 + j] - mx);
    for (int j = 0; j < 5; ++j)
      EXPECT_NEAR(grad[r * 5 + j], std::exp(x[r * 5 + j] + p0[r * 5 + j] - mx) / z, 1e-6) << r << "," << j;
  }
}

// SoftmaxCrossEntropyLoss with its labels as a graph input (a one-hot lookup), mean
// reduction: seam's own cross_entropy of the same logits and labels.
TEST(Onnx, SoftmaxCrossEntropyIsSeamsCrossEntropy) {
  P::ModelProto m;
  m.add_opset_import()->set_version(13);
  P::GraphProto& g = *m.mutable_graph();
  add_io(g.mutable_input(), "scores", {6, 4});
  P::ValueInfoProto* labels = g.add_input();
  labels->set_name("labels");
  labels->mutable_type()->mutable_tensor_type()->set_elem_type(P::TensorProto::INT64);
  labels->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(6);
  add_node(g, "SoftmaxCrossEntropyLoss", {"scores", "labels"}, {"loss"});
  P::ValueInfoProto* out = g.add_output();
  out->set_name("loss");
  onnx::OnnxImport imp = import(m.SerializeAsString());
  Var ref = cross_entropy(imp.graph.var(*imp.graph.find("scores")), imp.graph.var(*imp.graph.find("labels")));
  Model model(imp.graph, {.seed = 1});
  onnx::load_initial(model, imp);  // the one-hot table
  Program p = model.compile({.mode = Mode::eval, .outputs = {*imp.graph.find(imp.outputs[0]), ref.id()}});
  p.set_input("scores", std::span<const float>(random_floats(24, 41)));
  p.set_input("labels", std::span<const int32_t>(random_labels(6, 4, 42)));
  p.run();
  EXPECT_NEAR(p.read_as<float>(imp.outputs[0])[0], p.read_as<float>(ref.name())[0], 1e-6);
}

TEST(Npy, RoundTripsEveryTypeAndRefusesWhatItCannotRead) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("seam_npy_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto f = random_floats(6, 3);
  for (const HostTensor& t : {HostTensor{"a", {DType::f32, {2, 3}}, bytes_of(f)},
                              HostTensor{"b", {DType::f32, {6}}, bytes_of(f)},
                              HostTensor{"c", {DType::i32, {1, 2, 1}}, bytes_of(std::vector<int32_t>{-7, 9})},
                              HostTensor{"d", {DType::u8, {3}}, {std::byte{1}, std::byte{0}, std::byte{255}}}}) {
    const std::string path = (dir / (t.name + ".npy")).string();
    io::write_npy(path, t);
    const HostTensor back = io::read_npy(path);
    EXPECT_EQ(back.type, t.type) << t.name;
    EXPECT_EQ(back.data, t.data) << t.name;
  }
  auto error_of = [&](const std::string& contents) {
    const std::string path = (dir / "bad.npy").string();
    std::ofstream(path, std::ios::binary) << contents;
    try {
      io::read_npy(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("PK\x03\x04 a zip").find("not a .npy file"), std::string::npos);
  const std::string head = std::string("\x93NUMPY\x01\x00", 8);
  auto with = [&](const std::string& dict) {
    return head + std::string(1, static_cast<char>(dict.size())) + std::string(1, '\0') + dict;
  };
  EXPECT_NE(error_of(with("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }")).find("Fortran-ordered"),
            std::string::npos);
  EXPECT_NE(error_of(with("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }")).find("element type '>f4'"),
            std::string::npos);
  EXPECT_NE(error_of(with("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }") + "abc")
                .find("3 bytes of data for [2] of <f4"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

class OnnxCli : public CliTest {};

// seam run: the .npy input through the imported model, the output as .npy, equal to the
// same program run here; seam plan prints the ONNX model's evaluation plan.
TEST_F(OnnxCli, RunWritesTheOutputsAndPlanPrintsTheSteps) {
  const Cnn net;
  const std::string model = (dir / "cnn.onnx").string();
  std::ofstream(model, std::ios::binary) << net.bytes();
  const auto x = random_floats(4 * 3 * 8 * 8, 21);
  io::write_npy((dir / "x.npy").string(), HostTensor{"x", {DType::f32, {4, 3, 8, 8}}, bytes_of(x)});
  const CliResult r = run("run " + model + " --input x=" + (dir / "x.npy").string() + " --out " + (dir / "out").string() +
                          " --device cpu");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("y: f32[4,10] -> "), std::string::npos) << r.out;
  const HostTensor y = io::read_npy((dir / "out" / "y.npy").string());
  onnx::OnnxImport imp = import(net.bytes());
  Model m(imp.graph, {.seed = 1});
  onnx::load_initial(m, imp);
  Program p = m.compile({.mode = Mode::eval, .outputs = {*imp.graph.find(imp.outputs[0])}});
  p.set_input("x", std::span<const float>(x));
  p.run();
  EXPECT_EQ(y.data, p.read(imp.outputs[0]));

  const CliResult timed = run("run " + model + " --input x=" + (dir / "x.npy").string() + " --out " +
                              (dir / "out").string() + " --device cpu --time 2");
  ASSERT_EQ(timed.code, 0) << timed.err;
  EXPECT_NE(timed.out.find(" ms per run (median of 5 rounds of 2;"), std::string::npos) << timed.out;

  const CliResult missing = run("run " + model + " --device cpu");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("input 'x' needs a value: --input x=FILE.npy"), std::string::npos) << missing.err;
  io::write_npy((dir / "small.npy").string(), HostTensor{"x", {DType::f32, {2}}, bytes_of(std::vector<float>{1, 2})});
  const CliResult wrong = run("run " + model + " --input x=" + (dir / "small.npy").string() + " --device cpu");
  EXPECT_NE(wrong.err.find("holds f32[2], input 'x' takes f32[4,3,8,8]"), std::string::npos) << wrong.err;

  const CliResult plan = run("plan " + model);
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_NE(plan.out.find("ONNX, opset 13, seam test"), std::string::npos) << plan.out;
  EXPECT_NE(plan.out.find("conv2d"), std::string::npos);
  const CliResult measured = run("plan " + model + " --device cpu --measure");
  ASSERT_EQ(measured.code, 0) << measured.err;
  EXPECT_NE(measured.out.find("measured"), std::string::npos) << measured.out;
  const CliResult bad_shape = run("plan " + model + " --input-shape x=4x3xeight");
  EXPECT_NE(bad_shape.err.find("--input-shape 'x=4x3xeight': 'eight' is not a dimension"), std::string::npos)
      << bad_shape.err;
}

// What a teacher network (the Cnn's structure, other weights) predicts for n random
// samples: labels the student can learn.
std::pair<std::vector<float>, std::vector<int32_t>> teacher_data(int64_t n, uint64_t seed) {
  Cnn teacher;
  teacher.w1 = random_floats(8 * 3 * 3 * 3, seed + 1);
  teacher.fc = random_floats(10 * 8, seed + 2);
  onnx::OnnxImport imp = import(teacher.bytes("N"), {.input_shapes = {{"x", {n, 3, 8, 8}}}});
  Model m(imp.graph, {.seed = 1});
  onnx::load_initial(m, imp);
  Program p = m.compile({.mode = Mode::eval, .outputs = {*imp.graph.find(imp.outputs[0])}});
  std::vector<float> x = random_floats(static_cast<size_t>(n) * 3 * 8 * 8, seed);
  p.set_input("x", std::span<const float>(x));
  p.run();
  const auto logits = p.read_as<float>(imp.outputs[0]);
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (size_t i = 0; i < y.size(); ++i)
    y[i] = static_cast<int32_t>(std::max_element(logits.begin() + 10 * i, logits.begin() + 10 * (i + 1)) -
                                (logits.begin() + 10 * i));
  return {x, y};
}

std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> r;
  std::istringstream s(out);
  for (std::string line; std::getline(s, line);)
    if (!line.empty()) r.push_back(nlohmann::json::parse(line));
  return r;
}

// seam train cnn.onnx --config train.json: the file's weights are where training starts
// (a frozen prefix keeps them), the loss falls on .npy arrays named relative to the
// config, a stopped run resumes to the same bits, and eval of the checkpoint alone (its
// stored model names the ONNX file) reproduces the test accuracy.
TEST_F(OnnxCli, TrainsFromTheFileWeightsOnNpyArraysAndResumesBitwise) {
  const Cnn net;
  std::ofstream(dir / "cnn.onnx", std::ios::binary) << net.bytes("N");
  for (auto [name, n, seed] : {std::tuple{"train", 96, 31}, std::tuple{"test", 32, 41}}) {
    const auto [x, y] = teacher_data(n, static_cast<uint64_t>(seed));
    io::write_npy((dir / (std::string(name) + "_x.npy")).string(),
                  HostTensor{"x", {DType::f32, {n, 3, 8, 8}}, bytes_of(x)});
    io::write_npy((dir / (std::string(name) + "_y.npy")).string(), HostTensor{"y", {DType::i32, {n}}, bytes_of(y)});
  }
  std::ofstream(dir / "train.json") << R"({"batch_size": 16, "epochs": 4, "seed": 3,
    "optimizer": {"type": "adam", "lr": 0.01},
    "model": {"freeze": ["w1"]},
    "data": {"arrays": {"x": "train_x.npy", "y": "train_y.npy", "test_x": "test_x.npy", "test_y": "test_y.npy"}}})";
  const std::string model = (dir / "cnn.onnx").string() + " --config " + (dir / "train.json").string();
  const std::string common = " --device cpu --json --log-every 2";
  const CliResult whole = run("train " + model + common + " --out " + (dir / "whole").string());
  ASSERT_EQ(whole.code, 0) << whole.err;
  std::vector<double> losses;
  for (const auto& l : json_lines(whole.out))
    if (l["event"] == "epoch") losses.push_back(l["train_loss"].get<double>());
  ASSERT_EQ(losses.size(), 4u) << whole.out;
  EXPECT_LT(losses.back(), 0.8 * losses.front()) << whole.out;
  const std::string ck = (dir / "whole" / "checkpoint.safetensors").string();
  const io::TensorFile trained = io::read_safetensors(ck);
  ASSERT_NE(trained.find("w1"), nullptr);
  EXPECT_EQ(trained.find("w1")->data, bytes_of(net.w1));  // frozen: the file's values
  EXPECT_NE(trained.find("fc")->data, bytes_of(net.fc));   // trained from them

  const CliResult part = run("train " + model + common + " --out " + (dir / "parts").string() + " --max-steps 7");
  ASSERT_EQ(part.code, 0) << part.err;
  const std::string part_ck = (dir / "parts" / "checkpoint.safetensors").string();
  const CliResult rest = run("train --resume " + part_ck + common + " --out " + (dir / "parts").string());
  ASSERT_EQ(rest.code, 0) << rest.err;
  for (const auto& t : trained.tensors) EXPECT_EQ(io::read_safetensors(part_ck).find(t.name)->data, t.data) << t.name;

  const CliResult e = run_in(dir / "whole", "eval --checkpoint checkpoint.safetensors --device cpu --json");
  ASSERT_EQ(e.code, 0) << e.err;
  const auto done = json_lines(whole.out).back();
  EXPECT_EQ(nlohmann::json::parse(e.out)["accuracy"].get<double>(), done["test_accuracy"].get<double>()) << e.out;
  EXPECT_EQ(nlohmann::json::parse(e.out)["samples"], 32);
}

TEST_F(OnnxCli, TrainingSettingsThatDoNotFitTheFileAreRefusedByName) {
  std::ofstream(dir / "cnn.onnx", std::ios::binary) << Cnn().bytes("N");
  std::ofstream(dir / "fixed.onnx", std::ios::binary) << Cnn().bytes();
  io::write_npy((dir / "x.npy").string(), HostTensor{"x", {DType::f32, {8, 3, 8, 8}}, bytes_of(random_floats(8 * 192, 5))});
  io::write_npy((dir / "y.npy").string(), HostTensor{"y", {DType::i32, {8}}, bytes_of(std::vector<int32_t>(8, 3))});
  io::write_npy((dir / "flat.npy").string(), HostTensor{"x", {DType::f32, {8, 3}}, bytes_of(random_floats(24, 6))});
  const auto error = [&](const std::string& onnx, const std::string& config) {
    std::ofstream(dir / "c.json") << config;
    const CliResult r = run("train " + (dir / onnx).string() + " --config " + (dir / "c.json").string() +
                            " --device cpu --out " + (dir / "run").string());
    EXPECT_EQ(r.code, 1) << config;
    return r.err;
  };
  const std::string arrays = R"("data": {"val_split": 0.5, "arrays": {"x": "x.npy", "y": "y.npy"}})";
  EXPECT_NE(error("cnn.onnx", "{\"model\": {\"freeze\": [\"conv\"]}, \"batch_size\": 4, " + arrays + "}")
                .find("freeze names 'conv', which begins no initializer's name"),
            std::string::npos);
  EXPECT_NE(error("cnn.onnx", "{\"model\": {\"output\": \"z\"}, \"batch_size\": 4, " + arrays + "}")
                .find("output 'z' is none of"),
            std::string::npos);
  EXPECT_NE(error("cnn.onnx", "{\"model\": {\"input\": \"image\"}, \"batch_size\": 4, " + arrays + "}")
                .find("input 'image' is none of"),
            std::string::npos);
  EXPECT_NE(error("cnn.onnx", R"({"layers": [{"type": "linear", "out": 10}]})")
                .find("'layers' describes a network; the network is"),
            std::string::npos);
  EXPECT_NE(error("fixed.onnx", "{\"batch_size\": 16, " + arrays + "}").find("has a fixed batch of 4, not the batch_size 16"),
            std::string::npos);
  EXPECT_NE(error("cnn.onnx", R"({"batch_size": 4, "data": {"val_split": 0.5, "arrays": {"x": "flat.npy", "y": "y.npy"}}})")
                .find("flat.npy: holds f32[8,3]; the samples must be [N, 3, 8, 8]"),
            std::string::npos);
  EXPECT_NE(error("cnn.onnx", R"({"batch_size": 4, "data": {"arrays": {"x": "x.npy", "y": "y.npy"}}})")
                .find("nothing to evaluate on"),
            std::string::npos);
  io::write_npy((dir / "y7.npy").string(), HostTensor{"y", {DType::i32, {8}}, bytes_of(std::vector<int32_t>{1, 2, 12, 0, 1, 2, 3, 4})});
  EXPECT_NE(error("cnn.onnx", R"({"batch_size": 4, "data": {"val_split": 0.5, "arrays": {"x": "x.npy", "y": "y7.npy"}}})")
                .find("y7.npy: label 12 at 2 is not a class id in [0, 10) nor -100"),
            std::string::npos);
  io::write_npy((dir / "yf.npy").string(), HostTensor{"y", {DType::f32, {8}}, bytes_of(random_floats(8, 7))});
  EXPECT_NE(error("cnn.onnx", R"({"batch_size": 4, "data": {"val_split": 0.5, "arrays": {"x": "x.npy", "y": "yf.npy"}}})")
                .find("yf.npy: holds f32; labels and token ids are integers"),
            std::string::npos);
  io::write_npy((dir / "y5.npy").string(), HostTensor{"y", {DType::i32, {5}}, bytes_of(std::vector<int32_t>(5, 1))});
  EXPECT_NE(error("cnn.onnx", R"({"batch_size": 4, "data": {"val_split": 0.5, "arrays": {"x": "x.npy", "y": "y5.npy"}}})")
                .find("y5.npy: holds 5 labels but"),
            std::string::npos);
  const CliResult json_with_config = run("train " + (dir / "c.json").string() + " --config " + (dir / "c.json").string());
  EXPECT_NE(json_with_config.err.find("a training config goes with an ONNX file"), std::string::npos)
      << json_with_config.err;
}

}  // namespace
}  // namespace seam::testing
