// The GPU's SM clock, power draw and what held its clock down, sampled from a thread of
// its own while a window of work runs: a window whose clock falls under the power or
// thermal cap is bound by the cap, not by its kernels alone, and a short trace (run at
// the full clock) then reads faster than the window. NVML, the driver's management
// library, is loaded when a watch starts; without a CUDA build, a GPU or NVML a watch
// reports nothing.
#pragma once
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
  // One line: the clock, the power and the shares held down.
  std::string str() const;
};

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
