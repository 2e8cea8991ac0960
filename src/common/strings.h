// Small string helpers for error messages.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace seam {

size_t edit_distance(std::string_view a, std::string_view b);
// The candidates closest to `name` (at most `max`, each once, and only plausibly close
// ones), formatted for a message: "'stride', 'padding'"; empty if none is close.
std::string nearest_names(std::string_view name, const std::vector<std::string>& candidates,
                          size_t max = 3);

}  // namespace seam
