// The numerics suite on the CPU: every op family's output and gradients within its
// precision's bounds (numerics_bounds.h) against float64, bounds tight enough that a
// broken op fails them, and `seam numerics` printing the table and writing the CSV.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "bench/numerics.h"
#include "cli_fixture.h"
#include "numerics_bounds.h"
#include "common/half.h"
#include "seam/seam.h"

namespace fs = std::filesystem;

namespace seam::testing {
namespace {

using bench::NumericsRow;
using bench::NumericsTensor;

const std::vector<Precision> kAll{Precision::f32, Precision::tf32, Precision::bf16, Precision::f16};

TEST(Numerics, TheMeasureIsRelativeWithAFloorOfTheTensorsScale) {
  const std::vector<double> ref{3, -4, 0, 0};  // rms 2.5: floor 2.5e-3
  const std::vector<double> got{3.003, -4, 0, 0.0025};
  const bench::RelError e = bench::relative_error(got, ref);
  EXPECT_NEAR(e.max, 0.0025 / 0.0025, 1e-9);  // the zero element: its error over the floor
  EXPECT_NEAR(e.mean, (0.003 / 3.0025 + 1.0) / 4, 1e-9);
  EXPECT_EQ(bench::relative_error(ref, ref).max, 0.0);
  EXPECT_TRUE(std::isinf(bench::relative_error(std::vector<double>{NAN, -4, 0, 0}, ref).max));
  EXPECT_THROW(bench::relative_error(got, std::vector<double>{1}), Error);
}

TEST(Numerics, EveryCaseAtEveryPrecisionIsWithinItsBounds) {
  const std::vector<NumericsRow> rows = bench::run_numerics(Device::cpu, kAll);
  std::set<std::pair<std::string, Precision>> seen;
  for (const NumericsRow& r : rows) {
    seen.insert({r.op, r.precision});
    EXPECT_GT(r.elements, 0) << r.op;
    EXPECT_TRUE(within(r)) << describe(r);
  }
  for (const std::string& op : bench::numerics_ops())
    for (Precision p : kAll) EXPECT_TRUE(seen.count({op, p})) << op << " at " << precision_name(p) << " has no row";
  // Each family the suite is meant to cover, and a gradient for every float operand.
  for (const char* op : {"relu", "leaky_relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu", "exp", "log", "sqrt",
                         "pow", "scale", "neg", "abs", "erf", "add", "sub", "mul", "div", "maximum", "minimum", "matmul_nn",
                         "matmul_tn", "matmul_nt", "matmul_tt", "matmul_batched", "linear", "linear_relu",
                         "linear_gelu_tanh", "sum", "mean", "softmax", "log_softmax", "cross_entropy", "mse",
                         "layer_norm", "batch_norm", "conv2d_3x3", "conv2d_stride2", "conv2d_1x1", "max_pool2d",
                         "avg_pool2d", "global_avg_pool", "embedding", "dropout"})
    EXPECT_TRUE(seen.count({op, Precision::f32})) << op;
  std::set<std::string> conv_rows;
  for (const NumericsRow& r : rows)
    if (r.op == "conv2d_3x3" && r.precision == Precision::bf16) conv_rows.insert(r.what);
  EXPECT_EQ(conv_rows, (std::set<std::string>{"output", "gradient of x", "gradient of w", "gradient of bias"}));
}

// A 16-bit policy is measurably worse than f32 and f16 better than bf16: the 16-bit rows
// do go through 16-bit storage (the suite would otherwise pass while measuring nothing).
TEST(Numerics, SixteenBitRowsShowTheirRounding) {
  for (const char* op : {"relu", "matmul_nn", "softmax", "layer_norm", "conv2d_3x3", "sum"}) {
    SCOPED_TRACE(op);
    auto mean_of = [&](Precision p) {
      const auto t = bench::numerics_case(op, Device::cpu, p);
      return bench::numerics_row(op, p, t.at(0)).mean_rel;
    };
    const double f32 = mean_of(Precision::f32), bf16 = mean_of(Precision::bf16), f16 = mean_of(Precision::f16);
    EXPECT_GT(bf16, 1e-4);
    EXPECT_GT(bf16, 3 * f16);  // 8 against 11 mantissa bits
    EXPECT_GT(f16, 10 * f32);
  }
}

// Rows computed from deliberately broken results fail the bounds the suite passes.
NumericsRow perturbed(const std::string& op, Precision p, size_t tensor,
                      const std::function<void(std::vector<double>&)>& f) {
  auto t = bench::numerics_case(op, Device::cpu, p);
  NumericsTensor& x = t.at(tensor);
  EXPECT_TRUE(within(bench::numerics_row(op, p, x))) << op << " fails before it is broken";
  f(x.got);
  return bench::numerics_row(op, p, x);
}

TEST(Numerics, ABrokenOpFailsItsBounds) {
  // An f32 plan that stores a value in bf16 (a cast left behind): f32's bounds catch it.
  for (const char* op : {"relu", "matmul_nn", "layer_norm"}) {
    for (size_t tensor : {size_t{0}, size_t{1}}) {
      const NumericsRow r = perturbed(op, Precision::f32, tensor, [](std::vector<double>& v) {
        for (double& e : v) e = bf16_to_float(float_to_bf16(static_cast<float>(e)));
      });
      EXPECT_FALSE(within(r)) << describe(r);
    }
  }
  // (An f16 plan that stores bf16 is within f16's bounds, which must hold batch norm's
  // dx; SixteenBitRowsShowTheirRounding catches it by comparing the two policies.)
  // An indexing mistake (each element takes its neighbour's value) at every precision.
  for (Precision p : kAll) {
    const NumericsRow r = perturbed("conv2d_stride2", p, 1, [](std::vector<double>& v) {
      std::rotate(v.begin(), v.begin() + 1, v.end());
    });
    EXPECT_FALSE(within(r)) << describe(r);
  }
  // A derivative with a wrong constant: 1e-4 off shows at f32, 1% at f16, 10% at bf16.
  for (auto [p, factor] : {std::pair{Precision::f32, 1 + 1e-4}, std::pair{Precision::f16, 1.01},
                           std::pair{Precision::bf16, 1.1}}) {
    const NumericsRow r = perturbed("gelu", p, 1, [f = factor](std::vector<double>& v) {
      for (double& e : v) e *= f;
    });
    EXPECT_FALSE(within(r)) << describe(r);
  }
}

TEST(Numerics, FiltersSelectCasesAndFamiliesAndNameTheMistake) {
  EXPECT_EQ(bench::select_numerics_ops({"relu"}), (std::vector<std::string>{"relu"}));
  const auto conv = bench::select_numerics_ops({"conv2d", "relu"});
  EXPECT_EQ(conv, (std::vector<std::string>{"relu", "conv2d_3x3", "conv2d_stride2", "conv2d_1x1"}));
  EXPECT_TRUE(bench::selects_numerics_op("matmul"));
  EXPECT_FALSE(bench::selects_numerics_op("matm"));
  try {
    bench::select_numerics_ops({"rleu"});
    ADD_FAILURE() << "no error for an unknown case";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'rleu'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("did you mean 'relu'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(bench::numerics_case("nope", Device::cpu, Precision::f32), Error);
}

using seam::testing::CliResult;
using seam::testing::slurp;
using NumericsCli = seam::testing::CliTest;

TEST_F(NumericsCli, PrintsTheTableAndWritesTheCsv) {
  const fs::path csv = dir / "numerics.csv";
  CliResult r = run("numerics --device cpu --op relu,matmul --precision f32 --precision bf16 --csv " + csv.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("numerics on cpu against float64"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bf16 mean"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" f16 mean"), std::string::npos) << "only the precisions asked for\n" << r.out;
  EXPECT_NE(r.out.find("matmul_tn"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gradient of b"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("conv2d"), std::string::npos) << r.out;
  const std::string text = slurp(csv);
  EXPECT_EQ(text.rfind("op,precision,what,elements,max_rel,mean_rel\n", 0), 0u) << text;
  EXPECT_NE(text.find("\nrelu,f32,output,2257,0,0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nmatmul_batched,bf16,gradient of a,2376,"), std::string::npos) << text;
  // 1 relu + 6 matmul cases; relu has 2 tensors, each matmul 3; two precisions; a header.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1 + 2 * (2 + 6 * 3)) << text;

  CliResult all = run("numerics --device cpu --op softmax");
  ASSERT_EQ(all.code, 0) << all.err;
  for (const char* p : {" f32 max", " tf32 max", " bf16 max", " f16 max"})
    EXPECT_NE(all.out.find(p), std::string::npos) << all.out;

  CliResult list = run("numerics --list");
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_NE(list.out.find("conv2d_stride2\n"), std::string::npos) << list.out;
}

TEST_F(NumericsCli, UsageErrorsExitWithTwoAndNameTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"numerics --op rleu", "--op must be a case or a family of cases (see --list), got 'rleu'; did you mean 'relu'?"},
      {"numerics --precision fp16", "--precision must be one of f32, tf32, bf16, f16, got 'fp16'"},
      {"numerics --precision f32,half", "--precision must be one of f32, tf32, bf16, f16, got 'half'"},
      {"numerics --device gpu", "--device must be one of cpu, cuda, auto, got 'gpu'"},
      {"numerics --opp relu", "unknown flag '--opp' for 'seam numerics'; did you mean '--op'?"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args);
    CliResult r = run(args);
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err.rfind("seam: error: " + message, 0), 0u) << r.err;
    EXPECT_NE(r.err.find("see 'seam numerics --help'"), std::string::npos) << r.err;
  }
  CliResult r = run("numerics --device cpu --op relu --csv " + (dir / "no" / "such" / "dir.csv").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("dir.csv: cannot write the CSV"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace seam::testing
