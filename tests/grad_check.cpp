// Gradient checking against central finite differences.
#include "test_util.h"
#include "grad_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace seam::testing {

Var GradCase::param(const std::string& name, Shape shape, double lo, double hi) {
  return g.param(name, std::move(shape), Init::uniform(lo, hi), true, DType::f64);
}

Var GradCase::data(const std::string& name, Shape shape, double lo, double hi) {
  Var v = g.input(name, shape, DType::f64);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> x(static_cast<size_t>(numel(shape)));
  for (auto& e : x) e = d(rng_);
  feeds.emplace_back(name, bytes_of(x));
  return v;
}

Var GradCase::labels(const std::string& name, Shape shape, int32_t n) {
  Var v = g.input(name, shape, DType::i32);
  std::uniform_int_distribution<int32_t> d(0, n - 1);
  std::vector<int32_t> x(static_cast<size_t>(numel(shape)));
  for (auto& e : x) e = d(rng_);
  feeds.emplace_back(name, bytes_of(x));
  return v;
}

Var GradCase::state(const std::string& name, Shape shape, double value) {
  return g.state(name, std::move(shape), Init::constant(value), DType::f64);
}

size_t check_gradients(const std::function<Var(GradCase&)>& build, const GradCheckOptions& o) {
  GradCase c(7);
  Var out = build(c);
  // loss = sum(out * r): a random weight per element, so no two elements look alike.
  Var r = c.data("__weights", out.shape(), 0.5, 1.5);
  Var loss = sum(mul(out, r));
  std::vector<std::string> params;
  for (ValueId id : c.g.params()) params.push_back(c.g.value(id).name);

  Model m(c.g, {.seed = 3});
  Program p = m.compile({.mode = o.mode, .loss = loss.id(), .gradients = true});
  auto feed = [&] {
    for (auto& [name, bytes] : c.feeds) p.set_input(name, bytes);
  };
  auto eval_loss = [&] {
    feed();
    p.run();
    return p.read_as<double>(loss.name())[0];
  };
  eval_loss();
  std::map<std::string, std::vector<double>> analytic;
  for (auto& name : params) analytic[name] = p.grad_as<double>(name);

  size_t compared = 0;
  std::mt19937_64 pick(11);
  for (auto& name : params) {
    auto values = Program::cast_bytes<double>(m.read_param(name));
    std::vector<size_t> idx(values.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    if (idx.size() > o.max_elements) {
      std::shuffle(idx.begin(), idx.end(), pick);
      idx.resize(o.max_elements);
    }
    for (size_t i : idx) {
      double orig = values[i];
      double h = o.step * std::max(1.0, std::abs(orig));
      values[i] = orig + h;
      m.write_param(name, bytes_of(values));
      double up = eval_loss();
      values[i] = orig - h;
      m.write_param(name, bytes_of(values));
      double down = eval_loss();
      values[i] = orig;
      m.write_param(name, bytes_of(values));
      double fd = (up - down) / (2 * h);
      double a = analytic[name][i];
      double tol = o.atol + o.rtol * std::max(std::abs(a), std::abs(fd));
      EXPECT_LE(std::abs(a - fd), tol) << "d loss / d " << name << "[" << i << "]: autodiff " << a
                                       << ", finite difference " << fd;
      ++compared;
    }
  }
  return compared;
}

}  // namespace seam::testing
