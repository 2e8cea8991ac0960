// The progress bar.
#include "train/progress.h"

#include <unistd.h>

#include <cstdio>

namespace seam::train {

std::string format_duration(double seconds) {
  auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                               static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

ProgressBar::ProgressBar(std::string label, int64_t total, int64_t per_step, bool enabled)
    : label_(std::move(label)), total_(total), per_step_(per_step), enabled_(enabled && isatty(STDERR_FILENO)) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

void ProgressBar::update(int64_t done, const std::string& status) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (start_done_ < 0) start_done_ = done - 1, start_ = now;  // rate from the first step on
  if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double steps = static_cast<double>(done - start_done_);
  double rate = elapsed > 0 ? steps * static_cast<double>(per_step_) / elapsed : 0;
  double eta = steps > 0 ? elapsed / steps * static_cast<double>(total_ - done) : 0;
  const int width = 24;
  int fill = total_ > 0 ? static_cast<int>(width * done / total_) : 0;
  std::string bar(static_cast<size_t>(fill), '=');
  if (fill < width) bar += '>', bar.append(static_cast<size_t>(width - fill - 1), ' ');
  std::fprintf(stderr, "\r%s [%s] %lld/%lld  %.0f samples/s  ETA %s  %s\033[K", label_.c_str(), bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total_), rate, format_duration(eta).c_str(),
               status.c_str());
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (!enabled_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

}  // namespace seam::train
