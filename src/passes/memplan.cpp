// Greedy-by-size placement of buffer lifetimes in one arena.
#include "passes/memplan.h"

#include <algorithm>
#include <numeric>

namespace seam {

MemPlan plan_memory(const std::vector<Lifetime>& life, size_t align) {
  MemPlan p;
  const size_t n = life.size();
  p.offsets.assign(n, 0);
  auto aligned = [&](size_t b) { return (std::max<size_t>(b, 1) + align - 1) / align * align; };
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (life[a].bytes != life[b].bytes) return life[a].bytes > life[b].bytes;
    return life[a].first < life[b].first;
  });

  struct Placed {
    size_t begin, end;
    int first, last;
  };
  std::vector<Placed> placed;
  std::vector<std::pair<size_t, size_t>> busy;
  for (size_t idx : order) {
    const Lifetime& l = life[idx];
    size_t size = aligned(l.bytes);
    p.naive += size;
    busy.clear();
    for (auto& q : placed)
      if (q.first <= l.last && l.first <= q.last) busy.emplace_back(q.begin, q.end);
    std::sort(busy.begin(), busy.end());
    // Lowest gap that fits, scanning the occupied ranges in address order.
    size_t offset = 0;
    for (auto& [b, e] : busy) {
      if (b >= offset + size) break;
      offset = std::max(offset, e);
    }
    p.offsets[idx] = offset;
    placed.push_back({offset, offset + size, l.first, l.last});
    p.peak = std::max(p.peak, offset + size);
  }
  // Bytes live at each step; the busiest step bounds every placement from below.
  std::vector<std::pair<int, long long>> events;
  for (auto& l : life) {
    events.emplace_back(l.first, static_cast<long long>(aligned(l.bytes)));
    events.emplace_back(l.last + 1, -static_cast<long long>(aligned(l.bytes)));
  }
  std::sort(events.begin(), events.end());
  long long live = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    live += events[i].second;
    if (i + 1 == events.size() || events[i + 1].first != events[i].first)
      p.lower_bound = std::max(p.lower_bound, static_cast<size_t>(live));
  }
  return p;
}

}  // namespace seam
