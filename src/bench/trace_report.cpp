#include "bench/trace_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace seam::bench {

namespace {

// A kernel's name without its parameter list and template arguments, so that calls of
// one kernel with different operands group together.
std::string short_name(const std::string& name) {
  std::string s = name;
  for (const std::string anon = "(anonymous namespace)::"; s.find(anon) != std::string::npos;)
    s.erase(s.find(anon), anon.size());
  s = s.substr(0, s.find('('));
  for (const std::string prefix : {"void ", "seam::cuda::", "seam::"})
    if (s.rfind(prefix, 0) == 0) s = s.substr(prefix.size());
  if (s.size() > 110) s = s.substr(0, 107) + "...";
  return s;
}

// The time covered by at least one of spans [i0, i1) (ordered by start).
uint64_t busy_of(const std::vector<cuda::Span>& spans, size_t i0, size_t i1) {
  uint64_t busy = 0, open_start = 0, open_end = 0;
  for (size_t i = i0; i < i1; ++i) {
    const cuda::Span& s = spans[i];
    if (s.start > open_end) {
      busy += open_end - open_start;
      open_start = s.start, open_end = s.end;
    } else {
      open_end = std::max(open_end, s.end);
    }
  }
  return busy + (open_end - open_start);
}

}  // namespace

std::string trace_report(const std::vector<cuda::Span>& spans, int steps, bool timeline) {
  std::string out;
  char line[512];
  if (spans.empty() || steps < 1) return "trace: nothing ran on the device\n";
  const double n = steps;
  const uint64_t t0 = spans.front().start;
  uint64_t t1 = 0, sum = 0;
  std::map<std::string, std::pair<double, int>> by_name;  // ns, calls
  std::set<uint32_t> streams;
  for (const cuda::Span& s : spans) {
    t1 = std::max(t1, s.end);
    sum += s.end - s.start;
    auto& [ns, calls] = by_name[short_name(s.name)];
    ns += static_cast<double>(s.end - s.start);
    ++calls;
    streams.insert(s.stream);
  }
  const double span_us = static_cast<double>(t1 - t0) / 1e3 / n;
  const double busy_us = static_cast<double>(busy_of(spans, 0, spans.size())) / 1e3 / n;
  const double sum_us = static_cast<double>(sum) / 1e3 / n;
  std::snprintf(line, sizeof line,
                "a step on the device (%d traced, back to back): %.1f us from the first start to the last end, "
                "%.1f us busy (some kernel running), %.1f us idle; the %.1f records a step sum to %.1f us "
                "(%.2fx busy: the streams' overlap)\n",
                steps, span_us, busy_us, span_us - busy_us, static_cast<double>(spans.size()) / n, sum_us,
                sum_us / std::max(busy_us, 1e-9));
  out += line;
  // A replayed graph runs its branches on streams of the driver's choosing: their count
  // says how wide the step ran, not which of seam's lanes ran what.
  std::snprintf(line, sizeof line, "  on %zu streams\n", streams.size());
  out += line;
  std::vector<std::pair<std::string, std::pair<double, int>>> names(by_name.begin(), by_name.end());
  std::sort(names.begin(), names.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
  out += "  us a step  calls a step  us a call  kernel\n";
  for (auto& [name, v] : names) {
    std::snprintf(line, sizeof line, "  %9.1f  %12.1f  %9.2f  %s\n", v.first / 1e3 / n, v.second / n,
                  v.first / 1e3 / v.second, name.c_str());
    out += line;
  }
  if (timeline) {
    // The last step: its records are the last spans.size() / steps.
    const size_t per = spans.size() / static_cast<size_t>(steps);
    const size_t i0 = spans.size() - per;
    out += "the last step's records: start and end (us from its first start), stream, kernel\n";
    for (size_t i = i0; i < spans.size(); ++i) {
      const cuda::Span& s = spans[i];
      std::snprintf(line, sizeof line, "  %8.2f %8.2f  %6.2f  s%-3u %s\n",
                    static_cast<double>(s.start - spans[i0].start) / 1e3,
                    static_cast<double>(s.end - spans[i0].start) / 1e3, static_cast<double>(s.end - s.start) / 1e3,
                    s.stream, short_name(s.name).c_str());
      out += line;
    }
  }
  return out;
}

}  // namespace seam::bench
