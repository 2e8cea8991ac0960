// End to end: small models learn synthetic tasks to near-perfect held-out accuracy.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>

#include "data/idx.h"
#include "seam/seam.h"
#include "train/trainer.h"

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

namespace {

namespace fs = std::filesystem;

// metrics.csv as rows of fields, header left out.
std::vector<std::vector<std::string>> csv_rows(const fs::path& p) {
  std::ifstream f(p);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  std::getline(f, line);
  while (std::getline(f, line)) {
    std::vector<std::string> row;
    std::stringstream ls(line);
    for (std::string cell; std::getline(ls, cell, ',');) row.push_back(cell);
    rows.push_back(row);
  }
  return rows;
}

// The trainer on 256 learnable 28x28 images (class c brightens row band c): 8 steps an
// epoch, two epochs, a cosine schedule so that every step has its own learning rate.
class Resume : public ::testing::Test {
 protected:
  fs::path dir, data, model;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("seam_train_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    data = dir / "data";
    fs::create_directories(data);
    std::mt19937 rng(3);
    for (auto [prefix, n] : {std::pair<const char*, int>{"train", 256}, {"t10k", 64}}) {
      std::vector<uint8_t> img(static_cast<size_t>(n) * 784), lab(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        int c = i % 10;
        lab[static_cast<size_t>(i)] = static_cast<uint8_t>(c);
        for (int p = 0; p < 784; ++p)
          img[static_cast<size_t>(i) * 784 + static_cast<size_t>(p)] = static_cast<uint8_t>(rng() % 80 + (p / 84 == c ? 150 : 0));
      }
      data::write_idx_gz((data / (std::string(prefix) + "-images-idx3-ubyte.gz")).string(), {n, 28, 28}, img);
      data::write_idx_gz((data / (std::string(prefix) + "-labels-idx1-ubyte.gz")).string(), {n}, lab);
    }
    model = dir / "model.json";
    std::ofstream(model) << R"({"name": "tiny", "input": {"shape": [784]},
      "layers": [{"op": "linear", "out": 16}, {"op": "relu"}, {"op": "linear", "out": 10}],
      "optimizer": {"type": "adam", "lr": 0.003, "schedule": {"type": "cosine", "warmup_steps": 3}},
      "batch_size": 32, "epochs": 2, "seed": 4, "device": "cpu"})";
  }
  void TearDown() override { fs::remove_all(dir); }

  // Trains into `out`, stopping after max_steps (0: not) or resuming from its checkpoint.
  void train(const std::string& out, int64_t max_steps, bool resume) {
    seam::train::TrainOptions o;
    o.model_path = model.string();
    o.data_dir = data.string();
    o.out_dir = (dir / out).string();
    o.output = seam::train::Output::quiet;
    o.max_steps = max_steps;
    if (resume) o.resume = (dir / out / "checkpoint.safetensors").string();
    ASSERT_EQ(seam::train::run_train(o), 0);
  }

  // Each row of the stopped and resumed run against the uninterrupted one.
  void expect_rows_of_a_whole_run(const std::string& out) {
    auto whole = csv_rows(dir / "whole" / "metrics.csv"), parts = csv_rows(dir / out / "metrics.csv");
    ASSERT_EQ(whole.size(), 2u);
    ASSERT_EQ(parts.size(), 2u);
    for (size_t e = 0; e < 2; ++e) {
      SCOPED_TRACE("epoch " + std::to_string(e + 1));
      ASSERT_EQ(parts[e].size(), 14u);
      // epoch, step, lr, train loss and accuracy, val loss and accuracy, test loss and accuracy
      for (size_t c = 0; c < 9; ++c) EXPECT_EQ(parts[e][c], whole[e][c]) << "column " << c;
      EXPECT_EQ(parts[e][13], "0") << "skipped steps";
      EXPECT_EQ(parts[e][12], "") << "MFU (the GPU only)";
      const double seconds = std::stod(parts[e][9]), sps = std::stod(parts[e][10]);
      EXPECT_EQ(std::stod(parts[e][11]), sps) << "tokens/s: one label a sample";
      EXPECT_GT(seconds, 0);
      EXPECT_GT(sps, 0);
      // The rate covers the whole epoch's 256 samples, before and after the stop.
      EXPECT_NEAR(sps * seconds, 256, 256 * 1e-4);
    }
  }
};

}  // namespace

TEST_F(Resume, RowOfAnEpochStoppedAtItsEndShowsTheWholeEpoch) {
  train("whole", 0, false);
  train("parts", 8, false);  // the last step of epoch 1: its row is left to the resumed run
  EXPECT_TRUE(csv_rows(dir / "parts" / "metrics.csv").empty());
  train("parts", 0, true);
  expect_rows_of_a_whole_run("parts");
}

TEST_F(Resume, RowOfAnEpochStoppedMidwayShowsTheWholeEpoch) {
  train("whole", 0, false);
  train("parts", 5, false);
  train("parts", 0, true);
  expect_rows_of_a_whole_run("parts");
}

TEST_F(Resume, RowsWrittenAfterTheCheckpointAreDroppedAndNoTemporaryIsLeft) {
  train("whole", 0, false);
  train("parts", 12, false);  // into epoch 2: the checkpoint has finished epoch 1
  // A row for epoch 2 that the checkpoint does not cover (a run stopped between the two).
  const fs::path csv = dir / "parts" / "metrics.csv";
  ASSERT_EQ(csv_rows(csv).size(), 1u);
  std::ofstream(csv, std::ios::app) << "2,16,0.001,9,0,,9,0,1,1\n";
  train("parts", 0, true);
  expect_rows_of_a_whole_run("parts");
  for (auto& e : fs::directory_iterator(dir / "parts"))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}
