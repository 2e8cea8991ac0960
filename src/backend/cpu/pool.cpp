// CPU kernels of the pool family (being written).
#include "backend/cpu/cpu.h"

namespace seam::cpu {

void register_pool(KernelTable&) {}

}  // namespace seam::cpu
