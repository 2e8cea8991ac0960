// Loops of the CPU kernels spread over the machine's cores. OpenBLAS already runs GEMMs
// on every core; this is for the work around them (batch norm, pooling, im2col), which
// ran on one core while the others waited.
#pragma once
#include <cstdint>
#include <functional>

namespace seam::cpu {

// Runs f(begin, end) over [0, n) cut into contiguous chunks of at least min_chunk, one
// per core, on a process-wide pool (the caller takes the first chunk); returns when all
// are done. Each index's work must not depend on the chunk it falls in, so results are
// the same for any number of cores. A call made while another is running (from another
// thread, or from inside f) runs on its caller alone, as does any call in a forked child.
// The pool has SEAM_CPU_THREADS threads if that is set, else one per core the process may
// run on.
void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& f);

}  // namespace seam::cpu
