// A one-line progress bar for a terminal: bar, counts, samples/s, ETA and a status text.
// Redraws at most ten times a second; prints nothing when stderr is not a terminal.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace seam::train {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, int64_t samples_per_step, bool enabled);
  void update(int64_t done, const std::string& status);
  void finish();  // clears the line

 private:
  std::string label_;
  int64_t total_, per_step_;
  bool enabled_;
  int64_t start_done_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

std::string format_duration(double seconds);  // "1:02:03" or "2:03"

}  // namespace seam::train
