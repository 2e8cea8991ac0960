// The numerics suite on the GPU: every op family at every precision (tf32 included, which
// only the GPU has) within its bounds against float64 (numerics_bounds.h), and at 16 bits
// no worse than the CPU plan at the same policy, whose rounding emulation is the oracle of
// the GPU's 16-bit tests.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "bench/numerics.h"
#include "numerics_bounds.h"

namespace seam::testing {
namespace {

using bench::NumericsRow;

TEST(GpuNumerics, EveryCaseAtEveryPrecisionIsWithinItsBoundsAndTheCpusAt16Bits) {
  const std::vector<Precision> all{Precision::f32, Precision::tf32, Precision::bf16, Precision::f16};
  const std::vector<NumericsRow> gpu = bench::run_numerics(Device::cuda, all);
  const std::vector<NumericsRow> cpu = bench::run_numerics(Device::cpu, {Precision::bf16, Precision::f16});
  std::map<std::tuple<std::string, Precision, std::string>, double> cpu_mean;
  for (const NumericsRow& r : cpu) cpu_mean[{r.op, r.precision, r.what}] = r.mean_rel;
  std::set<std::pair<std::string, Precision>> seen;
  for (const NumericsRow& r : gpu) {
    seen.insert({r.op, r.precision});
    EXPECT_GT(r.elements, 0) << r.op;
    EXPECT_TRUE(within(r, Device::cuda)) << describe(r, Device::cuda);
    if (r.precision != Precision::bf16 && r.precision != Precision::f16) continue;
    // The same values rounded the same way: the GPU's mean error may differ from the
    // CPU's by summation order (measured: within 1.5x on every row), not by a factor.
    const auto it = cpu_mean.find({r.op, r.precision, r.what});
    ASSERT_NE(it, cpu_mean.end()) << r.op << " " << r.what << " has no CPU row";
    EXPECT_LE(r.mean_rel, 3 * it->second + 1e-6) << describe(r, Device::cuda) << "; the CPU's mean " << it->second;
  }
  for (const std::string& op : bench::numerics_ops())
    for (Precision p : all) EXPECT_TRUE(seen.count({op, p})) << op << " at " << precision_name(p) << " has no row";
}

}  // namespace
}  // namespace seam::testing
