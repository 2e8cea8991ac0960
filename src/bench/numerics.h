// `seam numerics`: how far each op family's output and gradients are from a float64
// reference at each precision policy. Every case is a small graph on fresh random values
// (fixed seeds) whose loss is sum(output * fixed random weights), or the op's own loss;
// the graph runs at the policy on the chosen device, and the same graph built in f64 runs
// on the CPU at Precision::f32 with the same values widened. docs/numerics.md describes
// the cases and the measure, and lists the CPU table.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "seam/model.h"

namespace seam::bench {

// One compared tensor of one case at one policy.
struct NumericsRow {
  std::string op;         // the case: "relu", "matmul_nt", "conv2d_stride2", ...
  Precision precision;
  std::string what;       // "output", or "gradient of <param>"
  int64_t elements = 0;
  double max_rel = 0, mean_rel = 0;  // relative_error of the tensor
};

// A compared tensor's values: what the policy computed and the float64 reference.
struct NumericsTensor {
  std::string what;
  std::vector<double> got, ref;
};

// The floor of the relative error's denominator, as a fraction of the reference's RMS:
// where the reference is near 0 (a ReLU's zeros, a difference of near-equal values) the
// error is measured against the tensor's scale, not against the element's.
constexpr double kRelFloor = 1e-3;

// Per element |got - ref| / (|ref| + kRelFloor * rms(ref)); the max and the mean over
// the tensor. A non-finite result counts as an infinite error.
struct RelError {
  double max = 0, mean = 0;
};
RelError relative_error(std::span<const double> got, std::span<const double> ref);

// The cases, in the order the suite runs them.
std::vector<std::string> numerics_ops();
// The cases a filter selects: a case's name, or a family prefix ("matmul" selects
// matmul_nn, matmul_tn, ...; "conv2d" every convolution). Empty: all. A filter that
// selects nothing is an error naming it and the nearest case names.
std::vector<std::string> select_numerics_ops(const std::vector<std::string>& filters);
// Whether a filter selects a case (the CLI checks --op with it).
bool selects_numerics_op(const std::string& filter);

// Runs one case at one policy and the reference: the output first, then the gradient of
// each parameter in the order the case creates them.
std::vector<NumericsTensor> numerics_case(const std::string& op, Device device, Precision precision);
NumericsRow numerics_row(const std::string& op, Precision precision, const NumericsTensor& t);

// Every selected case at every precision (the reference runs once per case).
std::vector<NumericsRow> run_numerics(Device device, const std::vector<Precision>& precisions,
                                      const std::vector<std::string>& ops = {});

// The rows as an aligned text table (one line per row, a header first) and as CSV
// ("op,precision,what,elements,max_rel,mean_rel").
void write_numerics_table(const std::vector<NumericsRow>& rows, std::ostream& out);
void write_numerics_csv(const std::vector<NumericsRow>& rows, std::ostream& out);

// `seam numerics`: device "auto", "cpu" or "cuda"; prints the table and writes the CSV
// when csv is not empty. Returns the exit status.
struct NumericsOptions {
  std::string device = "auto";
  std::vector<Precision> precisions;  // empty: f32, tf32, bf16, f16
  std::vector<std::string> ops;       // filters as select_numerics_ops takes them
  std::string csv;
};
int run_numerics_command(const NumericsOptions& o);

}  // namespace seam::bench
