// The GPU's own record of what ran: every kernel, memset and copy with its start and end
// on the device clock and its stream, as CUPTI's activity API reports them (kernels in a
// replayed CUDA Graph included, one record a node). Where `seam bench --breakdown` times
// each step alone, this is the step as it runs: which kernels overlap on the streams, and
// how long the GPU idles between them.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace seam::cuda {

struct Span {
  std::string name;  // the kernel's (demangled) name, or "[memset]", "[memcpy]"
  uint32_t stream = 0;
  uint64_t start = 0, end = 0;  // ns, the device's clock
};

// Runs `work` with tracing on and returns what the device ran meanwhile, ordered by start.
// libcupti is loaded at run time (SEAM_CUPTI names the file, else the usual names and the
// CUDA toolkit's folders); without it this throws, naming the paths tried.
std::vector<Span> trace_device(const std::function<void()>& work);

}  // namespace seam::cuda
