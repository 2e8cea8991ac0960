// The CPU kernels' thread pool (src/backend/cpu/parallel.h).
#include "backend/cpu/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace seam::cpu {

namespace {

class Pool {
 public:
  static Pool& get() {
    static Pool pool;
    return pool;
  }
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // False if the pool is busy: the caller then runs the loop itself.
  bool run(int64_t n, int parts, const std::function<void(int64_t, int64_t)>& f) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = &f;
      n_ = n;
      parts_ = parts;
      pending_ = parts - 1;
      error_ = nullptr;
      ++generation_;
    }
    start_.notify_all();
    run_part(0);
    std::unique_lock<std::mutex> lk(m_);
    finished_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
    return true;
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

 private:
  Pool() {
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned i = 1; i < hw; ++i) workers_.emplace_back([this, i] { work(static_cast<int>(i)); });
  }

  void run_part(int part) {
    const int64_t begin = n_ * part / parts_, end = n_ * (part + 1) / parts_;
    try {
      if (begin < end) (*job_)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lk(m_);
      if (!error_) error_ = std::current_exception();
    }
  }

  void work(int part) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(m_);
        start_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (part >= parts_) continue;  // this loop has fewer chunks than the pool threads
      }
      run_part(part);
      std::lock_guard<std::mutex> lk(m_);
      if (--pending_ == 0) finished_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex busy_, m_;
  std::condition_variable start_, finished_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace

void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& f) {
  if (n <= 0) return;
  Pool& pool = Pool::get();
  const int parts = static_cast<int>(std::min<int64_t>(pool.threads(), n / std::max<int64_t>(min_chunk, 1)));
  if (parts <= 1 || !pool.run(n, parts, f)) f(0, n);
}

}  // namespace seam::cpu
