// Small string helpers for error messages.
#include "common/strings.h"

#include <algorithm>

namespace seam {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string nearest_names(std::string_view name, const std::vector<std::string>& candidates,
                          size_t max) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (auto& c : candidates) {
    // Lists gathered from several sources (ops and layers of one name) repeat entries.
    if (std::any_of(scored.begin(), scored.end(), [&](auto& e) { return e.second == c; })) continue;
    size_t d = edit_distance(name, c);
    bool close = d <= std::max<size_t>(2, c.size() / 3) ||
                 (!name.empty() && c.find(name) != std::string::npos);
    if (close) scored.emplace_back(d, c);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](auto& a, auto& b) { return a.first < b.first; });
  std::string r;
  for (size_t i = 0; i < scored.size() && i < max; ++i)
    r += (i ? ", '" : "'") + scored[i].second + "'";
  return r;
}

}  // namespace seam
