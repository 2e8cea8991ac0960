// The GPU's SM clock, power draw and what held its clock down, sampled from a thread of
// its own while a window of work runs: a window whose clock falls under the power or
// thermal cap is bound by the cap, not by its kernels alone, and a short trace (run at
// the full clock) then reads faster than the window. NVML, the driver's management
// library, is loaded when a watch starts; without a CUDA build, a GPU or NVML a watch
// reports nothing.
#pragma once
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

namespace seam {

struct ClockReport {
  int samples = 0;
  double sm_mhz_mean = 0, sm_mhz_min = 0, sm_mhz_max = 0;
  double watts_mean = 0, watts_max = 0;
  // Shares of the samples in which the driver held the clock down: for power (the
  // software power cap, the hardware power brake), for heat or by the hardware's own
  // slowdown (thermal slowdowns, HW slowdown).
  double power_capped = 0, thermal = 0;
  std::string str() const {
    char b[256];
    std::snprintf(b, sizeof b,
                  "the GPU in the timed steps: SM clock %.0f MHz (%.0f-%.0f), %.0f W (%.0f at most); held down "
                  "by the power cap in %.0f%% of %d samples, by heat or hardware slowdown in %.0f%%",
                  sm_mhz_mean, sm_mhz_min, sm_mhz_max, watts_mean, watts_max, 100 * power_capped, samples,
                  100 * thermal);
    return b;
  }
};

// The current CUDA device's PCI bus id (what NVML finds it by); nullopt without a CUDA
// build or a GPU.
std::optional<std::string> cuda_pci_bus_id();

// Samples the current GPU every `period_ms` from construction until stop().
class ClockWatch {
 public:
  explicit ClockWatch(int period_ms = 20);
  // The GPU at this PCI bus id ("0000:17:00.0").
  ClockWatch(const std::string& pci_bus_id, int period_ms);
  ~ClockWatch();
  ClockWatch(const ClockWatch&) = delete;
  ClockWatch& operator=(const ClockWatch&) = delete;
  // Ends the window; nullopt where nothing could be read.
  std::optional<ClockReport> stop();

 private:
  void start(const std::string& pci_bus_id, int period_ms);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace seam
