// The summary of a device trace (seam bench --trace) on spans whose busy time, idle time
// and overlap are known by construction; the GPU clock report of the timed steps, and
// the bench CSV's columns that carry it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "backend/backend.h"
#include "backend/clocks.h"
#include "bench/bench.h"
#include "bench/trace_report.h"

namespace seam {
namespace {

using cuda::Span;

TEST(TraceReport, BusyIdleAndOverlapOfTwoSteps) {
  // Each step (1000 ns apart): a kernel [0, 100), one overlapping it on another stream
  // [50, 250), then after 150 ns idle one [400, 500). Busy 350 a step, records sum to 400.
  std::vector<Span> spans;
  for (uint64_t base : {1000u, 2000u}) {
    spans.push_back({"void seam::cuda::(anonymous namespace)::fill_rows<unsigned int>(char*, unsigned int)", 7,
                     base, base + 100});
    spans.push_back({"sm90_gemm", 9, base + 50, base + 250});
    spans.push_back({"[memset]", 7, base + 400, base + 500});
  }
  const std::string r = bench::trace_report(spans, 2, true);
  // Two steps from 1000 to 2500: 0.75 us a step, 0.35 us busy, 0.40 us idle (the gaps
  // inside a step and between them), 0.40 us of records: 1.14x busy.
  EXPECT_NE(r.find("0.8 us from the first start"), std::string::npos) << r;
  EXPECT_NE(r.find("0.3 us busy"), std::string::npos) << r;
  EXPECT_NE(r.find("0.4 us idle"), std::string::npos) << r;
  EXPECT_NE(r.find("1.14x busy"), std::string::npos) << r;
  EXPECT_NE(r.find("on 2 streams"), std::string::npos) << r;
  // Names lose their namespaces and parameters; the last step's timeline has its 3 records.
  EXPECT_NE(r.find("fill_rows<unsigned int>\n"), std::string::npos) << r;
  EXPECT_EQ(r.find("anonymous"), std::string::npos) << r;
  const size_t timeline = r.find("the last step's records");
  ASSERT_NE(timeline, std::string::npos) << r;
  EXPECT_EQ(std::count(r.begin() + static_cast<std::ptrdiff_t>(timeline), r.end(), '\n'), 4) << r;
}

TEST(TraceReport, NothingTracedSaysSo) {
  EXPECT_NE(bench::trace_report({}, 3, true).find("nothing ran"), std::string::npos);
}

TEST(ClockReport, SaysTheClockThePowerAndWhatHeldItDown) {
  ClockReport r;
  r.samples = 40;
  r.sm_mhz_mean = 1754.6, r.sm_mhz_min = 1605, r.sm_mhz_max = 1980;
  r.watts_mean = 688.2, r.watts_max = 702.4;
  r.power_capped = 0.875, r.thermal = 0;
  EXPECT_EQ(r.str(),
            "the GPU in the timed steps: SM clock 1755 MHz (1605-1980), 688 W (702 at most); held down by the power "
            "cap in 88% of 40 samples, by heat or hardware slowdown in 0%");
}

// The bench CSV carries the window's clock where it was read (a GPU with NVML) and leaves
// its three columns empty where it was not; the variant names the options off their
// defaults and the rate counts every rank's batch.
TEST(BenchCsv, CarriesTheWindowsClockWhereItWasRead) {
  bench::BenchResult read{"W6", "cuda", "bf16", true, 16, 28.25, 28.2, 28.3, 1352.5, 468.8, 1353.9, -1, 378};
  read.memory_mib = 8628.5, read.device_mib = 8744;
  ClockReport c;
  c.samples = 40, c.sm_mhz_mean = 1754.5, c.watts_mean = 688.25, c.power_capped = 0.875;
  read.clocks = c;
  bench::BenchResult unread = read;
  unread.name = "W1", unread.device = "cpu", unread.clocks.reset(), unread.device_mib = -1;
  bench::BenchOptions o;
  o.streams = 1;
  std::ostringstream out;
  bench::write_csv(out, {read, unread}, o, 2);
  std::istringstream lines(out.str());
  std::string header, first, second, extra;
  ASSERT_TRUE(std::getline(lines, header) && std::getline(lines, first) && std::getline(lines, second));
  EXPECT_FALSE(std::getline(lines, extra)) << out.str();
  EXPECT_TRUE(header.ends_with(",device_memory_mib,sm_mhz,watts,power_capped")) << header;
  EXPECT_TRUE(first.starts_with("seam,W6,graph+streams1+ranks2,cuda,28.25,28.2,28.3,")) << first;
  EXPECT_NE(first.find(",1132.74,378,1352.5,"), std::string::npos) << first;  // 32 rows in 28.25 ms
  EXPECT_TRUE(first.ends_with(",bf16,8628.5,8744,1754.5,688.25,0.875")) << first;
  EXPECT_TRUE(second.starts_with("seam,W1,graph+streams1+ranks2,cpu,")) << second;
  EXPECT_TRUE(second.ends_with(",8628.5,-1,,,")) << second;
}

// Without a GPU a watch reads nothing and says so by reporting nothing (the GPU suite's
// GpuClocks reads a real one).
TEST(ClockWatch, WithoutAGpuReportsNothing) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present: GpuClocks.AWindowOfWorkReportsItsClockAndPower reads it";
  ClockWatch w(5);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(w.stop().has_value());
}

// The watch's reading and summing, and its NVML handling, on NVML's stand-in
// (tests/fake_nvml.cpp): the k-th sample reads 1500 + 200 (k % 3) MHz, 600 + 50 (k % 3) W
// and the power cap on even k. A bus id the library does not know gives no report.
TEST(ClockWatch, SumsWhatNvmlReads) {
  ASSERT_EQ(setenv("SEAM_NVML", SEAM_FAKE_NVML, 1), 0);
  ClockWatch w("0000:42:00.0", 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  const std::optional<ClockReport> r = w.stop();
  ClockWatch elsewhere("0000:07:00.0", 1);
  const std::optional<ClockReport> none = elsewhere.stop();
  unsetenv("SEAM_NVML");
  ASSERT_TRUE(r.has_value());
  ASSERT_GE(r->samples, 6);
  double mhz = 0, watts = 0, capped = 0;
  for (int k = 0; k < r->samples; ++k) {
    mhz += 1500 + 200 * (k % 3);
    watts += 600 + 50 * (k % 3);
    capped += k % 2 == 0;
  }
  EXPECT_EQ(r->sm_mhz_min, 1500);
  EXPECT_EQ(r->sm_mhz_max, 1900);
  EXPECT_NEAR(r->sm_mhz_mean, mhz / r->samples, 1e-9);
  EXPECT_NEAR(r->watts_mean, watts / r->samples, 1e-9);
  EXPECT_EQ(r->watts_max, 700);
  EXPECT_NEAR(r->power_capped, capped / r->samples, 1e-12);
  EXPECT_EQ(r->thermal, 0);
  EXPECT_FALSE(none.has_value());
}

// stop() ends the window when asked, not when the sampler's period runs out: a watch of
// one sample a minute stops at once, with the one sample it takes on starting (taken
// even where stop() comes first).
TEST(ClockWatch, StopsWithoutWaitingOutItsPeriod) {
  ASSERT_EQ(setenv("SEAM_NVML", SEAM_FAKE_NVML, 1), 0);
  const auto t0 = std::chrono::steady_clock::now();
  ClockWatch w("0000:42:00.0", 60000);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::optional<ClockReport> r = w.stop();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsetenv("SEAM_NVML");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->samples, 1);
  EXPECT_LT(seconds, 30.0);
}

}  // namespace
}  // namespace seam
