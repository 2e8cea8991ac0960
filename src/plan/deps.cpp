// The order a plan's steps truly need: which earlier steps each one must follow.
#include <algorithm>
#include <cstdint>

#include "seam/plan.h"

namespace seam {

namespace {

// The steps' buffers by address (the plan outlives the call): no copy of their types.
using Refs = std::vector<const BufferRef*>;

bool any_overlap(const Refs& a, const Refs& b) {
  for (const BufferRef* x : a)
    for (const BufferRef* y : b)
      if (x->overlaps(*y)) return true;
  return false;
}

}  // namespace

std::vector<std::vector<int>> step_dependencies(const Plan& plan) {
  const size_t n = plan.steps.size();
  std::vector<Refs> reads(n), writes(n);
  for (size_t i = 0; i < n; ++i) {
    const PlanStep& s = plan.steps[i];
    for (const BufferRef& b : s.in) {
      reads[i].push_back(&b);
      // Inputs in the state region are updated in place (running statistics, metrics).
      if (b.region == Region::state) writes[i].push_back(&b);
    }
    for (const BufferRef& b : s.out) writes[i].push_back(&b);
  }
  std::vector<std::vector<int>> deps(n);
  for (size_t j = 0; j < n; ++j)
    for (size_t i = 0; i < j; ++i)
      if (any_overlap(writes[i], reads[j]) || any_overlap(writes[i], writes[j]) || any_overlap(reads[i], writes[j]))
        deps[j].push_back(static_cast<int>(i));
  return deps;
}

LaneSchedule schedule_lanes(const std::vector<std::vector<int>>& deps, int lanes) {
  const size_t n = deps.size();
  const size_t words = (n + 63) / 64;
  // ancestors[j]: every step j follows, directly or through others.
  std::vector<std::vector<uint64_t>> ancestors(n, std::vector<uint64_t>(words, 0));
  auto is_ancestor = [&](int a, size_t j) {
    return (ancestors[j][static_cast<size_t>(a) / 64] >> (static_cast<size_t>(a) % 64) & 1) != 0;
  };
  LaneSchedule s;
  s.lane.assign(n, 0);
  s.waits.assign(n, {});
  std::vector<int> last(static_cast<size_t>(std::max(lanes, 1)), -1);  // -1: the start, before every step
  for (size_t j = 0; j < n; ++j) {
    for (int d : deps[j]) {
      ancestors[j][static_cast<size_t>(d) / 64] |= uint64_t{1} << (static_cast<size_t>(d) % 64);
      for (size_t w = 0; w < words; ++w) ancestors[j][w] |= ancestors[static_cast<size_t>(d)][w];
    }
    // A lane whose last step j follows anyway adds no false order: take the one that
    // ran last among those (a chain stays on its lane); else the lane idle longest.
    int pick = -1;
    for (int l = 0; l < static_cast<int>(last.size()); ++l) {
      const int at = last[static_cast<size_t>(l)];
      const bool harmless = at < 0 || is_ancestor(at, j);
      if (harmless && (pick < 0 || at > last[static_cast<size_t>(pick)])) pick = l;
    }
    if (pick < 0) {
      pick = 0;
      for (int l = 1; l < static_cast<int>(last.size()); ++l)
        if (last[static_cast<size_t>(l)] < last[static_cast<size_t>(pick)]) pick = l;
    }
    s.lane[j] = pick;
    // On each other lane, the latest step j depends on (stream order covers the rest).
    std::vector<int> latest(last.size(), -1);
    for (int d : deps[j]) {
      const int l = s.lane[static_cast<size_t>(d)];
      if (l != pick) latest[static_cast<size_t>(l)] = std::max(latest[static_cast<size_t>(l)], d);
    }
    for (int d : latest)
      if (d >= 0) s.waits[j].push_back(d);
    last[static_cast<size_t>(pick)] = static_cast<int>(j);
    s.lanes_used = std::max(s.lanes_used, pick + 1);
  }
  return s;
}

}  // namespace seam
