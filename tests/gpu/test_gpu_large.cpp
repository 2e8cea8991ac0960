// Tensors of just over 2^31 elements: the 64-bit index paths of the elementwise,
// broadcast, reduction and generated kernels (below 2^31 they take 32-bit arithmetic).
// A CPU model of this size would take minutes, so the results are checked on the host
// against formulas evaluated per element (sums in double), on the GPU's output in full.
// About 60 GB of GPU memory; GPU only.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <thread>

#include "gpu_check.h"

using namespace seam;

namespace {

// [kRows, kCols]: 2^31 + 3317 elements, an odd row length so that nothing divides evenly.
constexpr int64_t kCols = 1027;
constexpr int64_t kRows = (int64_t{1} << 31) / kCols + 4;
constexpr int64_t kElems = kRows * kCols;
static_assert(kElems > (int64_t{1} << 31));

// A cheap value per element in [-1, 1) (a hash: random enough, 2^31 of them in seconds).
float value_at(uint64_t i) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(uint64_t{1} << 23) - 1.0);
}

std::vector<float> column_values() {
  std::vector<float> b(static_cast<size_t>(kCols));
  for (int64_t j = 0; j < kCols; ++j) b[static_cast<size_t>(j)] = 0.5f + 0.25f * value_at(uint64_t{1} << 40 | j);
  return b;
}

// Runs body(begin, end) over [0, n) in one chunk per hardware thread: the host side of
// 2^31 elements is most of this test's time.
template <class F>
void parallel_for(int64_t n, F body) {
  const int64_t k = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < k; ++t) threads.emplace_back([=] { body(n * t / k, n * (t + 1) / k); });
  for (auto& t : threads) t.join();
}

// Runs a program on x and b once.
Program run_once(Model& m, const std::vector<ValueId>& outputs, bool fuse, const std::vector<float>& x,
                 const std::vector<float>& b) {
  Program p = m.compile({.mode = Mode::eval, .outputs = outputs, .fuse = fuse});
  p.set_input("x", std::span<const float>(x));
  p.set_input("b", std::span<const float>(b));
  p.run();
  return p;
}

// Checks a full-size output element by element against f(i); reports the first misses.
template <class F>
void expect_each(const std::vector<std::byte>& bytes, F f, double tol, const char* what) {
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), kElems * 4) << what;
  const auto* got = reinterpret_cast<const float*>(bytes.data());
  std::atomic<int64_t> bad{0}, first{kElems};
  parallel_for(kElems, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const double want = f(i);
      if (!(std::abs(got[i] - want) <= tol * (1 + std::abs(want)))) {
        ++bad;
        for (int64_t f = first.load(); i < f && !first.compare_exchange_weak(f, i);) {
        }
      }
    }
  });
  if (bad > 0) ADD_FAILURE() << what << ": " << bad << " elements differ, the first at " << first << ": GPU "
                             << got[first] << ", expected " << f(first);
}

void expect_sums(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << what << "[" << i << "]";
}

}  // namespace

TEST(GpuLarge, KernelsOverMoreThan2To31Elements) {
  std::vector<float> x(static_cast<size_t>(kElems));
  parallel_for(kElems, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[static_cast<size_t>(i)] = value_at(static_cast<uint64_t>(i));
  });
  const std::vector<float> b = column_values();
  // Sums in double, for the reductions: rows by the thread that owns them, columns and
  // the total from each thread's partial sums.
  std::vector<double> col(static_cast<size_t>(kCols), 0.0), row(static_cast<size_t>(kRows), 0.0),
      col_xb(static_cast<size_t>(kCols), 0.0);
  double all = 0;
  std::mutex mu;
  parallel_for(kRows, [&](int64_t r0, int64_t r1) {
    std::vector<double> c(static_cast<size_t>(kCols), 0.0), cxb(static_cast<size_t>(kCols), 0.0);
    double t = 0;
    for (int64_t i = r0; i < r1; ++i) {
      double rs = 0;
      for (int64_t j = 0; j < kCols; ++j) {
        const float v = x[static_cast<size_t>(i * kCols + j)];
        rs += v;
        c[static_cast<size_t>(j)] += v;
        cxb[static_cast<size_t>(j)] += static_cast<double>(v * b[static_cast<size_t>(j)]);
      }
      row[static_cast<size_t>(i)] = rs;
      t += rs;
    }
    std::lock_guard<std::mutex> lock(mu);
    for (int64_t j = 0; j < kCols; ++j) col[static_cast<size_t>(j)] += c[static_cast<size_t>(j)];
    for (int64_t j = 0; j < kCols; ++j) col_xb[static_cast<size_t>(j)] += cxb[static_cast<size_t>(j)];
    all += t;
  });
  auto at = [&](int64_t i) { return static_cast<double>(x[static_cast<size_t>(i)]); };
  auto bj = [&](int64_t i) { return static_cast<double>(b[static_cast<size_t>(i % kCols)]); };

  Graph g;
  Var xv = g.input("x", {kRows, kCols});
  Var bv = g.input("b", {kCols});
  {
    // One kernel per op: the broadcast add (strided, 64-bit), the column, row and full
    // reductions, broadcast_to.
    Graph gg = g;
    Var xs = gg.var(xv.id()), bs = gg.var(bv.id());
    Var added = add(xs, bs), cols = sum(xs, {0}), rows = sum(xs, {1}), total = sum(xs);
    Var spread = broadcast_to(bs, {kRows, kCols});
    Model m(gg, {.device = Device::cuda});
    Program p = run_once(m, {added.id(), cols.id(), rows.id(), total.id(), spread.id()}, false, x, b);
    expect_each(p.read(added.name()), [&](int64_t i) { return static_cast<float>(at(i) + bj(i)); }, 0,
                "add");
    expect_each(p.read(spread.name()), bj, 0, "broadcast_to");
    expect_sums(p.read_as<float>(cols.name()), col, "column sums");
    expect_sums(p.read_as<float>(rows.name()), row, "row sums");
    expect_sums(p.read_as<float>(total.name()), {all}, "sum");
  }
  {
    // Generated kernels with 64-bit indices: an elementwise chain over a broadcast operand,
    // and a group ending in column sums.
    Graph gg = g;
    Var xs = gg.var(xv.id()), bs = gg.var(bv.id());
    Var chain = scale(tanh(add(xs, bs)), 2.0);
    Var summed = sum(mul(xs, bs), {0});
    Model m(gg, {.device = Device::cuda, .epilogue = EpiloguePolicy::fused});  // the generated kernels, untimed
    Program p = run_once(m, {chain.id(), summed.id()}, true, x, b);
    int fused = 0;
    for (auto& s : p.plan().steps) fused += s.op == Op::fused_elementwise;
    EXPECT_GE(fused, 1) << p.plan().str();
    expect_each(p.read(chain.name()), [&](int64_t i) { return 2.0 * std::tanh(static_cast<float>(at(i) + bj(i))); },
                2e-6, "2 tanh(x + b)");
    expect_sums(p.read_as<float>(summed.name()), col_xb, "column sums of x b");
  }
}
