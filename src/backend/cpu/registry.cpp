// The CPU kernel table, filled by each family and checked against the op table.
#include "backend/cpu/cpu.h"
#include "ops/registry.h"

namespace seam::cpu {

namespace {
KernelTable build() {
  KernelTable t(static_cast<size_t>(kNumOps), nullptr);
  register_elementwise(t);
  register_matmul(t);
  register_reduce(t);
  register_shape(t);
  register_softmax(t);
  register_loss(t);
  register_norm(t);
  register_attention(t);
  register_conv(t);
  register_pool(t);
  register_misc(t);
  return t;
}
}  // namespace

Kernel kernel_for(Op op) {
  static const KernelTable table = build();
  Kernel k = table.at(static_cast<size_t>(op));
  if (!k && op_def(op).view_of < 0) fail("internal error: the CPU backend has no kernel for ", op_name(op));
  return k;
}

}  // namespace seam::cpu
