// ClockWatch on NVML (backend/clocks.h), loaded at run time so that seam neither links the
// driver's management library nor fails to start without it. The device is found by its
// PCI bus id: NVML's indices need not be CUDA's (CUDA_VISIBLE_DEVICES).
#include "backend/clocks.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend/backend.h"

namespace seam {

std::string ClockReport::str() const {
  char b[256];
  std::snprintf(b, sizeof b,
                "the GPU in the timed steps: SM clock %.0f MHz (%.0f-%.0f), %.0f W (%.0f at most); held down "
                "by the power cap in %.0f%% of %d samples, by heat or hardware slowdown in %.0f%%",
                sm_mhz_mean, sm_mhz_min, sm_mhz_max, watts_mean, watts_max, 100 * power_capped, samples,
                100 * thermal);
  return b;
}

namespace {

using NvmlDevice = struct nvmlDevice_st*;
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;
// nvml.h's clock event reasons.
constexpr unsigned long long kSwPowerCap = 0x4, kHwSlowdown = 0x8, kSwThermal = 0x20, kHwThermal = 0x40,
                             kHwPowerBrake = 0x80;

struct Nvml {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_bus_id)(const char*, NvmlDevice*) = nullptr;
  int (*clock)(NvmlDevice, int, unsigned*) = nullptr;
  int (*power)(NvmlDevice, unsigned*) = nullptr;  // milliwatts
  int (*reasons)(NvmlDevice, unsigned long long*) = nullptr;
};

// NVML's functions (SEAM_NVML=FILE names the library), or nullopt where it or one of them
// is missing.
std::optional<Nvml> load_nvml() {
  const char* env = std::getenv("SEAM_NVML");
  void* lib = dlopen(env ? env : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return std::nullopt;
  Nvml n;
  n.lib = lib;
  auto sym = [&](auto& f, const char* name) {
    f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
    return f != nullptr;
  };
  bool ok = sym(n.init, "nvmlInit_v2") && sym(n.shutdown, "nvmlShutdown") &&
            sym(n.by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") && sym(n.clock, "nvmlDeviceGetClockInfo") &&
            sym(n.power, "nvmlDeviceGetPowerUsage");
  // The reasons' older name, from drivers before 535.
  if (ok && !sym(n.reasons, "nvmlDeviceGetCurrentClocksEventReasons"))
    ok = sym(n.reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
  if (!ok) {
    dlclose(lib);
    return std::nullopt;
  }
  return n;
}

struct Sample {
  unsigned mhz, milliwatts;
  unsigned long long reasons;
};

}  // namespace

struct ClockWatch::Impl {
  Nvml nvml;
  NvmlDevice device = nullptr;
  // The thread waits out its period on `wake`, so that stop() ends the window at once
  // rather than after the sleep that is under way.
  std::mutex mutex;
  std::condition_variable wake;
  bool done = false;            // under mutex
  std::vector<Sample> samples;  // the thread's alone until it is joined
  std::thread thread;

  void finish() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
    }
    wake.notify_one();
    if (thread.joinable()) thread.join();
  }
  ~Impl() {
    finish();
    nvml.shutdown();
    dlclose(nvml.lib);
  }
};

ClockWatch::ClockWatch(int period_ms) {
  if (const std::optional<std::string> bus = cuda_pci_bus_id()) start(*bus, period_ms);
}

ClockWatch::ClockWatch(const std::string& pci_bus_id, int period_ms) { start(pci_bus_id, period_ms); }

void ClockWatch::start(const std::string& pci_bus_id, int period_ms) {
  std::optional<Nvml> nvml = load_nvml();
  if (!nvml) return;
  if (nvml->init() != kNvmlSuccess) {
    dlclose(nvml->lib);
    return;
  }
  auto impl = std::make_unique<Impl>();
  impl->nvml = *nvml;
  if (impl->nvml.by_bus_id(pci_bus_id.c_str(), &impl->device) != kNvmlSuccess) return;  // ~Impl shuts NVML down
  impl_ = std::move(impl);
  Impl* s = impl_.get();
  // A sample first, then one a period until stopped: a window stopped before the thread
  // ran still has the one.
  s->thread = std::thread([s, period_ms] {
    std::unique_lock<std::mutex> lock(s->mutex);
    do {
      lock.unlock();
      Sample x{};
      if (s->nvml.clock(s->device, kNvmlClockSm, &x.mhz) == kNvmlSuccess &&
          s->nvml.power(s->device, &x.milliwatts) == kNvmlSuccess &&
          s->nvml.reasons(s->device, &x.reasons) == kNvmlSuccess)
        s->samples.push_back(x);
      lock.lock();
    } while (!s->wake.wait_for(lock, std::chrono::milliseconds(period_ms), [s] { return s->done; }));
  });
}

ClockWatch::~ClockWatch() = default;

std::optional<ClockReport> ClockWatch::stop() {
  if (!impl_) return std::nullopt;
  impl_->finish();
  const std::vector<Sample> xs = std::move(impl_->samples);
  impl_.reset();
  if (xs.empty()) return std::nullopt;
  ClockReport r;
  r.samples = static_cast<int>(xs.size());
  r.sm_mhz_min = r.sm_mhz_max = xs[0].mhz;
  for (const Sample& x : xs) {
    r.sm_mhz_mean += x.mhz;
    r.sm_mhz_min = std::min<double>(r.sm_mhz_min, x.mhz);
    r.sm_mhz_max = std::max<double>(r.sm_mhz_max, x.mhz);
    r.watts_mean += x.milliwatts / 1000.0;
    r.watts_max = std::max(r.watts_max, x.milliwatts / 1000.0);
    r.power_capped += (x.reasons & (kSwPowerCap | kHwPowerBrake)) != 0;
    r.thermal += (x.reasons & (kSwThermal | kHwThermal | kHwSlowdown)) != 0;
  }
  for (double* v : {&r.sm_mhz_mean, &r.watts_mean, &r.power_capped, &r.thermal}) *v /= r.samples;
  return r;
}

}  // namespace seam
