// Small helpers the CPU and GPU tests share.
#pragma once
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "seam/seam.h"

namespace seam::testing {

// The message of the seam::Error f throws, or "" if it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// How many steps of a plan run an op: for tests that check what a pass made.
// Steps of op with activation relu.
inline int count_with_relu(const Plan& p, Op op) {
  int n = 0;
  for (const PlanStep& s : p.steps) n += s.op == op && s.attrs.has("activation") && s.attrs.s("activation") == "relu";
  return n;
}

inline int count(const Plan& p, Op op) {
  int n = 0;
  for (auto& s : p.steps) n += s.op == op;
  return n;
}

// A classifier MLP on inputs "x" [batch, in] and labels "y" [batch]: ReLU after each
// hidden layer ("fc1", "fc2", ...), then cross-entropy; returns the loss.
inline Var mlp_loss(Graph& g, int64_t batch, int64_t in, const std::vector<int64_t>& hidden, int64_t classes) {
  Var h = g.input("x", {batch, in});
  Var y = g.input("y", {batch}, DType::i32);
  int layer = 0;
  for (int64_t w : hidden) h = relu(nn::linear(h, w, "fc" + std::to_string(++layer)));
  return cross_entropy(nn::linear(h, classes, "fc" + std::to_string(++layer)), y);
}

// Fresh random inputs: normal floats, and labels uniform in [0, classes).
inline std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}
inline std::vector<int32_t> random_labels(size_t n, int32_t classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, classes - 1);
  std::vector<int32_t> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

// The bytes of a vector of values, for set_input and write_param.
template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Values of a float dtype (f32, f64, bf16, f16) as floats, for comparisons.
inline std::vector<float> as_floats(const std::vector<std::byte>& b, DType t) {
  const std::vector<double> d = float_values(b, t);
  return std::vector<float>(d.begin(), d.end());
}

}  // namespace seam::testing
