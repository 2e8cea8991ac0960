// CUPTI's activity API, loaded with dlopen so that seam neither links nor needs libcupti
// unless a trace is asked for. The record structs come from the toolkit's headers; a
// newer CUPTI appends fields to them and keeps the ones read here in place.
#include "backend/cuda/trace.h"

#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "backend/cuda/check.h"
#include "backend/cuda/dynlib.h"
#include "seam/error.h"

namespace seam::cuda {

namespace {

struct Cupti {
  void* lib = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

const Cupti& cupti() {
  static const Cupti c = [] {
    std::vector<std::string> tried;
    if (const char* e = std::getenv("SEAM_CUPTI"); e && *e) tried.push_back(e);
    for (const char* name : {"libcupti.so", "libcupti.so.13", "libcupti.so.12"}) tried.push_back(name);
    std::vector<std::string> roots;
    if (const char* h = std::getenv("CUDA_HOME"); h && *h) roots.push_back(h);
    roots.push_back("/usr/local/cuda");
    for (const std::string& r : roots)
      for (const char* sub : {"/lib64/", "/lib/", "/extras/CUPTI/lib64/", "/targets/x86_64-linux/lib/"})
        tried.push_back(r + sub + "libcupti.so");
    Cupti c;
    c.lib = open_first(tried, "tracing needs CUPTI (libcupti.so)", "SEAM_CUPTI");
    auto sym = [&](auto& f, const char* name) { load_symbol(c.lib, f, name, "CUPTI"); };
    sym(c.enable, "cuptiActivityEnable");
    sym(c.disable, "cuptiActivityDisable");
    sym(c.register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(c.flush_all, "cuptiActivityFlushAll");
    sym(c.next_record, "cuptiActivityGetNextRecord");
    sym(c.result_string, "cuptiGetResultString");
    return c;
  }();
  return c;
}

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = "?";
  cupti().result_string(r, &s);
  fail("CUPTI: ", what, ": ", s);
}

std::string demangled(const char* name) {
  if (!name) return "?";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

// What the buffer callbacks collect: CUPTI calls them from its own thread.
std::mutex collected_mutex;
std::vector<Span> collected;
constexpr size_t kBufferBytes = size_t{8} << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<Span> got;
  CUpti_Activity* rec = nullptr;
  while (cupti().next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        got.push_back({demangled(k->name), k->streamId, k->start, k->end});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        got.push_back({"[memset]", m->streamId, m->start, m->end});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        got.push_back({"[memcpy]", m->streamId, m->start, m->end});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
  std::lock_guard lock(collected_mutex);
  collected.insert(collected.end(), got.begin(), got.end());
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                         CUPTI_ACTIVITY_KIND_MEMCPY};

}  // namespace

std::vector<Span> trace_device(const std::function<void()>& work) {
  const Cupti& c = cupti();
  SEAM_CUDA_CHECK(cudaDeviceSynchronize());  // only what `work` queues
  {
    std::lock_guard lock(collected_mutex);
    collected.clear();
  }
  check(c.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  for (CUpti_ActivityKind k : kKinds) check(c.enable(k), "cuptiActivityEnable");
  struct Off {  // tracing stops however `work` ends
    const Cupti& c;
    ~Off() {
      for (CUpti_ActivityKind k : kKinds) c.disable(k);
    }
  };
  {
    Off off{c};
    work();
    SEAM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  check(c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::vector<Span> out;
  {
    std::lock_guard lock(collected_mutex);
    out.swap(collected);
  }
  std::sort(out.begin(), out.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  return out;
}

}  // namespace seam::cuda
