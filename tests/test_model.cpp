// Model and Program on the CPU: a program that outlives its model, and steps timed alone
// leaving the model bitwise as it was (model_checks.h; the GPU tests run the same).
#include "model_checks.h"

TEST(Program, OutlivesItsModel) { seam::testing::expect_a_program_outlives_its_model(seam::Device::cpu); }

TEST(Program, TimingStepsLeavesTheModelBitwiseAsItWas) {
  seam::testing::expect_timing_leaves_the_model_as_it_was(seam::Device::cpu);
  seam::testing::expect_timing_leaves_the_model_as_it_was(seam::Device::cpu, seam::Precision::bf16);
}

TEST(Program, AFailedMeasurementLeavesTheModelAsItWas) {
  // Batch norm's statistics are replayed before the embedding meets an id out of range
  // and throws: the model must come back as it was all the same.
  using namespace seam;
  Graph g;
  Var x = g.input("x", {8, 4});
  Var ids = g.input("ids", {8}, DType::i32);
  Var h = nn::batch_norm(x, "bn");
  Var e = nn::embedding(ids, 5, 4, "emb");
  Var loss = sum(mul(h, e));
  Model m(g, {.seed = 2});
  Program p = m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::sgd(0.1)});
  const auto xs = seam::testing::random_floats(8 * 4, 3);
  std::vector<int32_t> good{0, 1, 2, 3, 4, 0, 1, 2}, bad{0, 1, 2, 3, 4, 0, 1, 9};
  p.set_input("x", std::span<const float>(xs));
  p.set_input("ids", std::span<const int32_t>(good));
  p.run();
  p.set_input("ids", std::span<const int32_t>(bad));
  const auto saved = m.save_tensors();
  EXPECT_THROW(p.time_steps(2), Error);
  seam::testing::expect_same(m.save_tensors(), saved);
}

// A plan whose arena cannot be had (1 PiB, beyond any address space) is an error that says how much it asked,
// its largest buffers by node, and what the host has; the model stays usable, here for a
// program of the branch that fits.
TEST(Program, AnArenaThatDoesNotFitNamesItsLargestBuffers) {
  using namespace seam;
  Graph g;
  Var huge = g.input("huge", {int64_t{1} << 45, 4});
  Var small = g.input("small", {4, 8});
  Var wide = nn::linear(huge, 4, "wide");
  Var fine = relu(nn::linear(small, 3, "fine"));
  Model m(g, {.seed = 1});
  try {
    Program p = m.compile({.mode = Mode::eval, .outputs = {wide.id(), fine.id()}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* part : {"cannot allocate the arena of", "its largest buffers: input 'huge' f32[35184372088832,4] "
                             "(536870912.0 MiB), 'linear' f32[35184372088832,4] (536870912.0 MiB)", "out of host memory"})
      EXPECT_NE(what.find(part), std::string::npos) << part << " in: " << what;
  }
  Program p = m.compile({.mode = Mode::eval, .outputs = {fine.id()}});
  const auto xs = seam::testing::random_floats(4 * 8, 5);
  p.set_input("small", std::span<const float>(xs));
  p.run();
  EXPECT_EQ(p.read_as<float>(fine.name()).size(), 12u);
}

// Model::plan is compile's plan without the program: the step whose arena no host could
// hold still plans (what `seam plan` prints for a model too large for the machine).
TEST(Program, APlanAloneAllocatesNothing) {
  using namespace seam;
  Graph g;
  Var huge = g.input("huge", {int64_t{1} << 45, 4});
  Var wide = nn::linear(huge, 4, "wide");
  Model m(g, {.seed = 1});
  const CompileOptions o{.mode = Mode::eval, .outputs = {wide.id()}};
  const Plan p = m.plan(o);
  EXPECT_EQ(p.steps.size(), 1u);
  EXPECT_GE(p.arena_bytes, size_t{1} << 50);
  EXPECT_NE(seam::testing::error_of([&] { m.compile(o); }).find("cannot allocate the arena of"), std::string::npos);
  Var small = g.input("small", {4, 8});
  Var loss = sum(relu(nn::linear(small, 3, "fine")));
  Model n(g, {.seed = 1});
  const CompileOptions f{.mode = Mode::train, .loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-3)};
  EXPECT_EQ(n.plan(f).str(), n.compile(f).plan().str());
}

// A model's buffers are made, and its parameters drawn, on first use: a model whose
// parameters no host could hold still plans, and fails only where it compiles. The values
// first drawn come from the seed the model was made with, whatever state().seed says by
// then (reset() draws from that one), the same as a model read at once.
TEST(Model, ParametersAreDrawnOnFirstUseFromTheModelsSeed) {
  using namespace seam;
  Graph big;
  Var x = big.input("x", {2, int64_t{1} << 23});
  Var y = nn::linear(x, int64_t{1} << 23, "huge");  // 2^46 weights: 256 TiB of f32
  Model m(big, {.seed = 1});
  const CompileOptions o{.mode = Mode::eval, .outputs = {y.id()}};
  EXPECT_EQ(m.plan(o).steps.size(), 1u);
  EXPECT_NE(seam::testing::error_of([&] { m.compile(o); }).find("out of host memory"), std::string::npos);
  EXPECT_NE(seam::testing::error_of([&] { m.read_param("huge.weight"); }).find("out of host memory"), std::string::npos);

  Graph g;
  Var in = g.input("in", {4, 8});
  nn::linear(in, 3, "fc");
  Model eager(g, {.seed = 7});
  const std::vector<std::byte> first = eager.read_param("fc.weight");
  Model lazy(g, {.seed = 7});
  lazy.state().seed = 8;
  EXPECT_EQ(lazy.read_param("fc.weight"), first);
  lazy.reset();
  EXPECT_NE(lazy.read_param("fc.weight"), first);
  Model loaded(g, {.seed = 9});
  loaded.load_tensors(eager.save_tensors());
  EXPECT_EQ(loaded.read_param("fc.weight"), first);
}

// What read() returns is output_type(): a value the precision pass stored in bf16 reads
// as the graph's f32. Memory of a GPU goes in and out only of a program on one: on the
// CPU each way is an error that says so.
TEST(Program, OutputsReadInTheGraphsTypeAndDeviceIoNeedsAGpu) {
  using namespace seam;
  Graph g;
  Var x = g.input("x", {4, 8});
  Var y = nn::linear(x, 3, "fc");
  Model m(g, {.seed = 1, .precision = Precision::bf16});
  Program p = m.compile({.mode = Mode::eval, .outputs = {y.id()}});
  ASSERT_EQ(p.plan().output(y.name())->ref.type.dtype, DType::bf16);
  EXPECT_EQ(p.output_type(y.name()), (TensorType{DType::f32, {4, 3}}));
  const auto xs = seam::testing::random_floats(4 * 8, 7);
  p.set_input("x", std::span<const float>(xs));
  p.run();
  EXPECT_EQ(p.read(y.name()).size(), 4u * 3 * sizeof(float));
  EXPECT_EQ(p.input_stream(), nullptr);
  EXPECT_EQ(p.device_index(), -1);
  auto expect_error = [](auto&& f, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error([&] { p.set_input_device("x", xs.data(), xs.size() * sizeof(float), nullptr); }, "runs on the CPU");
  expect_error([&] { p.set_input_device("x", xs.data(), 4, nullptr); }, "input 'x' is f32[4,8] (128 bytes), got 4");
  expect_error([&] { (void)p.read_device(y.name()); }, "runs on the CPU");
  expect_error([&] { (void)p.read_device("nope"); }, "no output named 'nope'");
}

// read_as and grad_as copy bytes: the element type must be the value's (uint16_t for the
// bits of a bf16 value), or the read is an error naming the value and its dtype, never
// bf16 pairs read back as floats.
TEST(Program, ReadAsTakesOnlyTheElementTypeOfTheValue) {
  using namespace seam;
  Graph g;
  Var x = g.input("x", {4, 2});
  Var w = g.param("w", {4, 2}, Init::uniform(-1, 1));
  Var half = cast(mul(x, w), DType::bf16);
  Var loss = sum(cast(half, DType::f32));
  Model m(g, {.seed = 1});
  Program p = m.compile({.loss = loss.id(), .gradients = true, .outputs = {half.id()}});
  std::vector<float> xs{1, 2, 3, 4, 5, 6, 7, 8};
  p.set_input("x", std::span<const float>(xs));
  p.run();
  const std::string e = seam::testing::error_of([&] { p.read_as<float>(half.name()); });
  EXPECT_NE(e.find("output '" + half.name() + "' holds bf16 values"), std::string::npos) << e;
  const std::vector<uint16_t> bits = p.read_as<uint16_t>(half.name());
  const std::vector<std::byte> bytes = p.read(half.name());
  ASSERT_EQ(bits.size() * 2, bytes.size());
  EXPECT_EQ(std::memcmp(bits.data(), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(p.read_as<float>(loss.name()).size(), 1u);
  EXPECT_EQ(p.grad_as<float>("w").size(), 8u);
  const std::string eg = seam::testing::error_of([&] { p.grad_as<double>("w"); });
  EXPECT_NE(eg.find("the gradient of 'w' holds f32 values"), std::string::npos) << eg;
  const std::string en = seam::testing::error_of([&] { p.grad_as<float>("x"); });
  EXPECT_NE(en.find("computes no gradient for 'x'"), std::string::npos) << en;
}
