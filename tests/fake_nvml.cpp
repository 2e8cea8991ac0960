// A stand-in for NVML (libnvidia-ml) with the functions ClockWatch loads, for tests on
// machines without a GPU: one device, at bus id "0000:42:00.0", whose k-th reading gives
// an SM clock of 1500, 1700, 1900, 1500, ... MHz, a power of 600 + k % 3 * 50 W, and the
// software power cap as its clock-event reason on even readings.
#include <atomic>

namespace {
std::atomic<int> readings{0};
int device_tag = 0;
}  // namespace

extern "C" {
struct nvmlDevice_st;
int nvmlInit_v2() { return 0; }
int nvmlShutdown() { return 0; }
int nvmlDeviceGetHandleByPciBusId_v2(const char* bus, nvmlDevice_st** device) {
  const char want[] = "0000:42:00.0";
  for (int i = 0; i < static_cast<int>(sizeof want); ++i)
    if (bus[i] != want[i]) return 6;  // NVML_ERROR_NOT_FOUND
  *device = reinterpret_cast<nvmlDevice_st*>(&device_tag);
  return 0;
}
int nvmlDeviceGetClockInfo(nvmlDevice_st*, int type, unsigned* mhz) {
  if (type != 1) return 2;  // NVML_ERROR_INVALID_ARGUMENT: only the SM clock is read
  *mhz = 1500 + readings.load() % 3 * 200;
  return 0;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_st*, unsigned* milliwatts) {
  *milliwatts = 600000 + readings.load() % 3 * 50000;
  return 0;
}
int nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_st*, unsigned long long* reasons) {
  *reasons = readings.fetch_add(1) % 2 == 0 ? 0x4 : 0x0;
  return 0;
}
}
