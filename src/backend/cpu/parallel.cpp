// The CPU kernels' thread pool (src/backend/cpu/parallel.h).
#include "backend/cpu/parallel.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace seam::cpu {

namespace {

// Set on a thread while it runs a chunk: a parallel_for it calls then runs on it alone
// (re-locking the pool's mutex from its owner would be undefined behaviour).
thread_local bool in_chunk = false;
// After fork() the child has the pool's state but none of its threads.
bool forked = false;

// SEAM_CPU_THREADS if set (tests run side by side with 1), else the cores this process may
// run on (its affinity mask, which containers and taskset narrow).
int thread_count() {
  if (const char* env = std::getenv("SEAM_CPU_THREADS")) {
    int n = 0;
    const auto [p, ec] = std::from_chars(env, env + std::strlen(env), n);
    if (ec == std::errc() && *p == '\0' && n >= 1) return std::min(n, 256);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

class Pool {
 public:
  // Never destroyed: a loop still running on another thread at exit must not meet a
  // destroyed pool; the workers end with the process.
  static Pool& get() {
    static Pool* pool = new Pool;
    return *pool;
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

 private:
  Pool() {
    for (int i = 1; i < thread_count(); ++i) workers_.emplace_back([this, i] { work(i); });
    for (std::thread& t : workers_) t.detach();
    pthread_atfork(nullptr, nullptr, [] { forked = true; });
  }

  void run_part(int part) {
    const int64_t begin = n_ * part / parts_, end = n_ * (part + 1) / parts_;
    in_chunk = true;
    try {
      if (begin < end) (*job_)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lk(m_);
      if (!error_) error_ = std::current_exception();
    }
    in_chunk = false;
  }

  void work(int part) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(m_);
        start_.wait(lk, [&] { return generation_ != seen; });
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
  std::exception_ptr error_;
};

}  // namespace

void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& f) {
  if (n <= 0) return;
  if (in_chunk || forked) return f(0, n);
  Pool& pool = Pool::get();
  const int parts = static_cast<int>(std::min<int64_t>(pool.threads(), n / std::max<int64_t>(min_chunk, 1)));
  if (parts <= 1 || !pool.run(n, parts, f)) f(0, n);
}

}  // namespace seam::cpu
