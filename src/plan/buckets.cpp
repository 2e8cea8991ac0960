// Gradient buckets of a data-parallel training plan (Plan::buckets).
#include <algorithm>
#include <numeric>

#include "seam/error.h"
#include "seam/plan.h"

namespace seam {

size_t GradBucket::bytes() const {
  size_t n = 0;
  for (const BufferRef& p : parts) n += p.bytes();
  return n;
}

std::pair<size_t, size_t> zero_shard(size_t n, int rank, int ranks) {
  const auto r = static_cast<size_t>(rank), p = static_cast<size_t>(ranks);
  return {n * r / p, n * (r + 1) / p};
}

std::vector<size_t> zero_split(size_t n, int ranks) {
  std::vector<size_t> s;
  for (int r = 0; r <= ranks; ++r) s.push_back(n * static_cast<size_t>(r) / static_cast<size_t>(ranks));
  return s;
}

void plan_gradient_buckets(Plan& plan, int ranks, size_t bucket_bytes) {
  if (ranks < 1) fail("plan_gradient_buckets: ", ranks, " ranks");
  if (!plan.optimizer) fail("plan_gradient_buckets: the plan has no update to sum gradients for");
  plan.ranks = ranks;
  plan.buckets.clear();
  const size_t n = plan.grads.size();
  // The last step writing into each gradient (or reading it): from then on its bytes
  // are final, and the sum may change them in place.
  std::vector<int> last(n, -1);
  for (size_t i = 0; i < plan.steps.size(); ++i)
    for (const auto* list : {&plan.steps[i].out, &plan.steps[i].in})
      for (const BufferRef& o : *list)
        for (size_t g = 0; g < n; ++g)
          if (o.overlaps(plan.grads[g].ref)) last[g] = static_cast<int>(i);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return last[a] < last[b]; });
  GradBucket open;
  auto close = [&] {
    if (open.params.empty()) return;
    // Adjacent gradients travel as one part: fewer, larger transfers.
    std::sort(open.parts.begin(), open.parts.end(), [](const BufferRef& a, const BufferRef& b) { return a.offset < b.offset; });
    std::vector<BufferRef> merged;
    for (const BufferRef& p : open.parts) {
      BufferRef* m = merged.empty() ? nullptr : &merged.back();
      if (m && m->type.dtype == p.type.dtype && m->offset + m->bytes() == p.offset)
        m->type.shape = {m->type.numel() + p.type.numel()};
      else
        merged.push_back({Region::grads, p.offset, {p.type.dtype, {p.type.numel()}}});
    }
    open.parts = std::move(merged);
    plan.buckets.push_back(std::move(open));
    open = GradBucket{};
  };
  for (size_t g : order) {
    const Binding& b = plan.grads[g];
    if (!is_float(b.ref.type.dtype)) fail("plan_gradient_buckets: gradient of '", b.name, "' is ", dtype_name(b.ref.type.dtype));
    open.parts.push_back(b.ref);
    open.params.push_back(b.name);
    open.after = std::max(open.after, last[g]);
    if (open.bytes() >= bucket_bytes) close();
  }
  close();
}

}  // namespace seam
