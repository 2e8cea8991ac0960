// End to end: small models learn synthetic tasks to near-perfect held-out accuracy.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "seam/seam.h"

using namespace seam;

namespace {

struct Dataset {
  std::vector<float> x;
  std::vector<int32_t> y;
  size_t n = 0, dim = 0;
};

// Trains `loss` over `train` with the given optimizer and returns held-out accuracy of
// argmax(logits) on `test`. Shuffles with a fixed seed; drops the last partial batch.
double train_and_eval(Graph& g, Var logits, Var loss, const OptimizerConfig& opt, const Dataset& train,
                      const Dataset& test, int64_t batch, int epochs) {
  Var pred = argmax(logits);
  Model m(g, {.seed = 1});
  Program step = m.compile({.mode = Mode::train, .loss = loss.id(), .optimizer = opt});
  Program eval = m.compile({.mode = Mode::eval, .outputs = {pred.id()}});
  std::mt19937_64 rng(5);
  std::vector<size_t> order(train.n);
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<float> bx(static_cast<size_t>(batch) * train.dim);
  std::vector<int32_t> by(static_cast<size_t>(batch));
  double first_loss = -1, last_loss = 0;
  for (int e = 0; e < epochs; ++e) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t s = 0; s + static_cast<size_t>(batch) <= train.n; s += static_cast<size_t>(batch)) {
      for (size_t i = 0; i < static_cast<size_t>(batch); ++i) {
        size_t k = order[s + i];
        std::copy_n(train.x.begin() + static_cast<long>(k * train.dim), train.dim, bx.begin() + static_cast<long>(i * train.dim));
        by[i] = train.y[k];
      }
      step.set_input("x", std::span<const float>(bx));
      step.set_input("y", std::span<const int32_t>(by));
      step.run();
      last_loss = step.read_as<float>(loss.name())[0];
      if (first_loss < 0) first_loss = last_loss;
    }
  }
  EXPECT_LT(last_loss, first_loss / 4) << "the loss did not fall";
  size_t correct = 0;
  for (size_t s = 0; s + static_cast<size_t>(batch) <= test.n; s += static_cast<size_t>(batch)) {
    eval.set_input("x", std::span<const float>(test.x.data() + s * test.dim, static_cast<size_t>(batch) * test.dim));
    eval.run();
    auto p = eval.read_as<int32_t>(pred.name());
    for (size_t i = 0; i < p.size(); ++i) correct += p[i] == test.y[s + i];
  }
  return static_cast<double>(correct) / static_cast<double>(test.n / static_cast<size_t>(batch) * static_cast<size_t>(batch));
}

// Labels from a random two-layer teacher: argmax(A2 tanh(A1 x)), keeping only points
// with a clear margin between the top two classes so that a perfect score is possible.
Dataset teacher_data(size_t n, uint64_t seed) {
  const size_t dim = 8, hidden = 16, classes = 4;
  std::mt19937_64 teacher(99), rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> a1(hidden * dim), a2(classes * hidden);
  for (auto& v : a1) v = nd(teacher) / std::sqrt(static_cast<float>(dim));
  for (auto& v : a2) v = nd(teacher);
  Dataset d{{}, {}, n, dim};
  while (d.y.size() < n) {
    std::vector<float> x(dim), h(hidden, 0);
    for (auto& v : x) v = nd(rng);
    for (size_t j = 0; j < hidden; ++j) {
      for (size_t i = 0; i < dim; ++i) h[j] += a1[j * dim + i] * x[i];
      h[j] = std::tanh(h[j]);
    }
    int best = 0;
    float best_v = -1e30f, second = -1e30f;
    for (size_t c = 0; c < classes; ++c) {
      float o = 0;
      for (size_t j = 0; j < hidden; ++j) o += a2[c * hidden + j] * h[j];
      if (o > best_v) second = best_v, best_v = o, best = static_cast<int>(c);
      else second = std::max(second, o);
    }
    if (best_v - second < 0.5f) continue;
    d.x.insert(d.x.end(), x.begin(), x.end());
    d.y.push_back(best);
  }
  return d;
}

}  // namespace

TEST(Train, MlpLearnsANonlinearTeacher) {
  Dataset train = teacher_data(8192, 1), test = teacher_data(2048, 2);
  const int64_t batch = 64;
  Graph g;
  Var x = g.input("x", {batch, 8});
  Var y = g.input("y", {batch}, DType::i32);
  Var h = relu(nn::linear(x, 128, "fc1"));
  h = relu(nn::linear(h, 128, "fc2"));
  Var logits = nn::linear(h, 4, "fc3");
  Var loss = cross_entropy(logits, y);
  auto opt = OptimizerConfig::adamw(3e-3, 1e-4);
  opt.schedule = {Schedule::Kind::cosine, 50, 1, 0.1, 128 * 30, 1e-4};
  double acc = train_and_eval(g, logits, loss, opt, train, test, batch, 30);
  std::printf("MLP held-out accuracy: %.4f\n", acc);
  EXPECT_GE(acc, 0.97);
}

namespace {

// 12x12 images with one stroke (horizontal, vertical, diagonal or anti-diagonal, the
// class) of random length and position, in Gaussian noise.
Dataset stroke_data(size_t n, uint64_t seed) {
  const int side = 12;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0, 0.3f);
  std::uniform_int_distribution<int> cls(0, 3), len(4, 7), pos(0, side - 1);
  Dataset d{{}, {}, n, static_cast<size_t>(side * side)};
  for (size_t s = 0; s < n; ++s) {
    std::vector<float> img(static_cast<size_t>(side * side));
    for (auto& v : img) v = noise(rng);
    int c = cls(rng), l = len(rng);
    const int dr[4] = {0, 1, 1, 1}, dc[4] = {1, 0, 1, -1};
    int r0, c0;
    do {
      r0 = pos(rng), c0 = pos(rng);
    } while (r0 + dr[c] * (l - 1) >= side || c0 + dc[c] * (l - 1) >= side || c0 + dc[c] * (l - 1) < 0);
    for (int k = 0; k < l; ++k) img[static_cast<size_t>((r0 + dr[c] * k) * side + c0 + dc[c] * k)] += 1.5f;
    d.x.insert(d.x.end(), img.begin(), img.end());
    d.y.push_back(c);
  }
  return d;
}

}  // namespace

TEST(Train, CnnLearnsStrokeOrientation) {
  Dataset train = stroke_data(3072, 1), test = stroke_data(1024, 2);
  const int64_t batch = 32;
  Graph g;
  Var x = g.input("x", {batch, 1, 12, 12});
  Var y = g.input("y", {batch}, DType::i32);
  Var h = relu(nn::batch_norm(nn::conv2d(x, 8, 3, "conv1", {.padding = {1, 1}}), "bn1"));
  h = max_pool2d(h, {2, 2});
  h = relu(nn::conv2d(h, 16, 3, "conv2", {.padding = {1, 1}}));
  Var logits = nn::linear(global_avg_pool(h), 4, "fc");
  Var loss = cross_entropy(logits, y);
  double acc = train_and_eval(g, logits, loss, OptimizerConfig::adam(1e-2), train, test, batch, 6);
  std::printf("CNN held-out accuracy: %.4f\n", acc);
  EXPECT_GE(acc, 0.97);
}
