// `seam numerics` (src/bench/numerics.h): the cases, the two runs of each, the measure.
#include "bench/numerics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <tuple>

#include "common/half.h"
#include "common/strings.h"
#include "seam/seam.h"

namespace seam::bench {

namespace {

// One case's graph and values. Values are drawn in float from the case's own seed and
// stored in the graph's dtype, so the f32 graph (every policy) and the f64 graph (the
// reference) get the same numbers: widening float to double is exact.
class Builder {
 public:
  Builder(DType dtype, uint64_t seed) : dtype_(dtype), rng_(seed) {}

  Graph g;
  struct Floats {
    std::string name;
    std::vector<float> values;
  };
  std::vector<Floats> params, inputs;
  std::vector<std::pair<std::string, std::vector<int32_t>>> int_inputs;

  DType dtype() const { return dtype_; }

  Var param(const std::string& name, const Shape& shape, std::vector<float> values) {
    expect_size(name, shape, values.size());
    params.push_back({name, std::move(values)});
    return g.param(name, shape, Init::zeros(), true, dtype_);
  }
  Var input(const std::string& name, const Shape& shape, std::vector<float> values) {
    expect_size(name, shape, values.size());
    inputs.push_back({name, std::move(values)});
    return g.input(name, shape, dtype_);
  }
  Var ints(const std::string& name, const Shape& shape, std::vector<int32_t> values) {
    expect_size(name, shape, values.size());
    int_inputs.emplace_back(name, std::move(values));
    return g.input(name, shape, DType::i32);
  }
  Var state(const std::string& name, const Shape& shape, Init init) { return g.state(name, shape, init, dtype_); }

  std::vector<float> normal(const Shape& s, double stddev = 1, double mean = 0) {
    std::normal_distribution<float> d(static_cast<float>(mean), static_cast<float>(stddev));
    return draw(s, [&] { return d(rng_); });
  }
  std::vector<float> uniform(const Shape& s, double lo, double hi) {
    std::uniform_real_distribution<float> d(static_cast<float>(lo), static_cast<float>(hi));
    return draw(s, [&] { return d(rng_); });
  }
  // A random sign times U(lo, hi): denominators and gaps kept away from 0.
  std::vector<float> away_from_zero(const Shape& s, double lo, double hi) {
    std::uniform_real_distribution<float> d(static_cast<float>(lo), static_cast<float>(hi));
    return draw(s, [&] { return (rng_() & 1 ? 1.0f : -1.0f) * d(rng_); });
  }
  std::vector<int32_t> labels(const Shape& s, int32_t classes) {
    std::uniform_int_distribution<int32_t> d(0, classes - 1);
    std::vector<int32_t> v(static_cast<size_t>(numel(s)));
    for (auto& e : v) e = d(rng_);
    return v;
  }

 private:
  template <class F>
  std::vector<float> draw(const Shape& s, F next) {
    std::vector<float> v(static_cast<size_t>(numel(s)));
    for (auto& e : v) e = next();
    return v;
  }
  static void expect_size(const std::string& name, const Shape& shape, size_t n) {
    if (static_cast<int64_t>(n) != numel(shape))
      fail("numerics: ", n, " values for '", name, "' of shape ", shape_str(shape));
  }
  DType dtype_;
  std::mt19937_64 rng_;
};

struct Case {
  std::string name;
  std::function<Var(Builder&)> build;
  bool own_loss = false;  // the output is the scalar loss itself (cross_entropy, mse)
};

// The ops that compute in f32 at every policy (softmax, losses, norms, sums) read their
// operand here as the policy stores an activation: through an exact scale by 1, which is
// a 16-bit op under bf16 and f16 (parameters count as 16-bit), as the GEMM before them
// would be in a network. Reading an f32 parameter straight, they would compute in f32 at
// every policy and their 16-bit rows would measure nothing 16-bit.
Var stored(Var x) { return scale(x, 1.0); }

const Shape kEw{37, 61};  // 2257 elements: odd, so no vector width or tile divides it

using Gen = std::function<std::vector<float>(Builder&, const Shape&)>;

Gen normal_gen(double stddev) {
  return [=](Builder& b, const Shape& s) { return b.normal(s, stddev); };
}
Gen uniform_gen(double lo, double hi) {
  return [=](Builder& b, const Shape& s) { return b.uniform(s, lo, hi); };
}

Case unary(const std::string& name, std::function<Var(Var)> f, Gen gen) {
  return {name, [=](Builder& b) { return f(b.param("x", kEw, gen(b, kEw))); }};
}

Case binary(const std::string& name, std::function<Var(Var, Var)> f, Gen ga, Gen gb, Shape shape_b = kEw) {
  return {name, [=](Builder& b) {
            Var x = b.param("a", kEw, ga(b, kEw));
            Var y = b.param("b", shape_b, gb(b, shape_b));
            return f(x, y);
          }};
}

// b = a plus a gap of 0.1 to 1 either way: a 16-bit rounding (at most 2^-8 relative,
// 0.016 at |a| = 4) never reorders the pair, so the gradient goes to the same operand as
// in the reference. A flipped pair moves a whole gradient element, which measures how
// close the inputs were, not the op.
Case min_max(const std::string& name, std::function<Var(Var, Var)> f) {
  return {name, [=](Builder& b) {
            std::vector<float> a = b.normal(kEw), gap = b.away_from_zero(kEw, 0.1, 1.0);
            std::vector<float> c(a.size());
            for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] + gap[i];
            Var x = b.param("a", kEw, std::move(a));
            return f(x, b.param("b", kEw, std::move(c)));
          }};
}

// a [..] x b [..] with each operand's layout; values N(0, 1).
Case matmul_case(const std::string& name, Shape sa, Shape sb, bool ta, bool tb) {
  return {name, [=](Builder& b) {
            Var x = b.param("a", sa, b.normal(sa));
            Var y = b.param("b", sb, b.normal(sb));
            return matmul(x, y, ta, tb);
          }};
}

// x [48, 67] w [40, 67] b [40], weights as PyTorch initializes them; act after it. With
// clear_of_zero, each row of x is redrawn until no pre-activation lies within 0.02 of 0
// (about ten times what 16-bit operands move it by): the policy's ReLU mask is then the
// reference's. One flipped mask element moves a whole row of dx by w * dy, which
// measures how close the sum came to 0, not the GEMM.
Case linear_case(const std::string& name, std::function<Var(Var)> act, bool clear_of_zero = false) {
  return {name, [=](Builder& b) {
            constexpr int64_t rows = 48, in = 67, out = 40;
            const double k = 1 / std::sqrt(static_cast<double>(in));
            std::vector<float> w = b.uniform({out, in}, -k, k), bias = b.uniform({out}, -k, k), x;
            for (int64_t r = 0; r < rows; ++r) {
              for (int tries = 0;; ++tries) {
                if (tries == 1000) fail("numerics case '", name, "': no row of x keeps its pre-activations clear of 0");
                std::vector<float> row = b.normal({in});
                bool clear = true;
                for (int64_t j = 0; j < out && clear_of_zero && clear; ++j) {
                  double y = bias[static_cast<size_t>(j)];
                  for (int64_t i = 0; i < in; ++i)
                    y += static_cast<double>(row[static_cast<size_t>(i)]) * w[static_cast<size_t>(j * in + i)];
                  clear = std::abs(y) >= 0.02;
                }
                if (!clear) continue;
                x.insert(x.end(), row.begin(), row.end());
                break;
              }
            }
            Var xv = b.param("x", {rows, in}, std::move(x));
            Var wv = b.param("w", {out, in}, std::move(w));
            Var y = linear(xv, wv, b.param("bias", {out}, std::move(bias)));
            return act ? act(y) : y;
          }};
}

Case conv_case(const std::string& name, Shape x_shape, int64_t out, int64_t kernel, Conv2dOptions o, bool bias) {
  return {name, [=](Builder& b) {
            const int64_t in = x_shape[1];
            const double k = 1 / std::sqrt(static_cast<double>(in * kernel * kernel));
            Var x = b.param("x", x_shape, b.normal(x_shape));
            const Shape ws{out, in, kernel, kernel};
            Var w = b.param("w", ws, b.uniform(ws, -k, k));
            std::optional<Var> bv;
            if (bias) bv = b.param("bias", {out}, b.uniform({out}, -k, k));
            return conv2d(x, w, bv, o);
          }};
}

std::vector<Case> make_cases() {
  const Gen act = normal_gen(2.0);  // activations: into the saturating ranges too
  const Gen n1 = normal_gen(1.0);
  const Gen positive = uniform_gen(0.1, 4.0);
  std::vector<Case> c{
      unary("relu", [](Var x) { return relu(x); }, n1),
      unary("leaky_relu", [](Var x) { return leaky_relu(x, 0.1); }, n1),
      unary("sigmoid", [](Var x) { return sigmoid(x); }, act),
      unary("tanh", [](Var x) { return tanh(x); }, act),
      unary("gelu", [](Var x) { return gelu(x); }, act),
      unary("gelu_tanh", [](Var x) { return gelu(x, true); }, act),
      unary("silu", [](Var x) { return silu(x); }, act),
      unary("exp", [](Var x) { return exp(x); }, n1),
      unary("log", [](Var x) { return log(x); }, positive),
      unary("sqrt", [](Var x) { return sqrt(x); }, positive),
      unary("pow", [](Var x) { return pow(x, 2.5); }, positive),
      unary("scale", [](Var x) { return scale(x, 1.7); }, n1),
      unary("neg", [](Var x) { return neg(x); }, n1),
      unary("abs", [](Var x) { return seam::abs(x); }, n1),
      unary("erf", [](Var x) { return seam::erf(x); }, act),
      binary("add", [](Var a, Var b) { return add(a, b); }, n1, n1),
      binary("add_broadcast", [](Var a, Var b) { return add(a, b); }, n1, n1, {kEw[1]}),
      binary("sub", [](Var a, Var b) { return sub(a, b); }, n1, n1),
      binary("mul", [](Var a, Var b) { return mul(a, b); }, n1, n1),
      binary("div", [](Var a, Var b) { return div(a, b); }, n1,
             [](Builder& b, const Shape& s) { return b.away_from_zero(s, 0.5, 2.0); }),
      min_max("maximum", [](Var a, Var b) { return maximum(a, b); }),
      min_max("minimum", [](Var a, Var b) { return minimum(a, b); }),
      matmul_case("matmul_nn", {48, 67}, {67, 40}, false, false),
      matmul_case("matmul_tn", {67, 48}, {67, 40}, true, false),
      matmul_case("matmul_nt", {48, 67}, {40, 67}, false, true),
      matmul_case("matmul_tt", {67, 48}, {40, 67}, true, true),
      matmul_case("matmul_batched", {3, 24, 33}, {3, 33, 20}, false, false),
      matmul_case("matmul_folded", {3, 16, 67}, {67, 40}, false, false),
      linear_case("linear", nullptr),
      linear_case("linear_relu", [](Var y) { return relu(y); }, true),
      linear_case("linear_gelu_tanh", [](Var y) { return gelu(y, true); }),
      {"sum", [](Builder& b) { return sum(stored(b.param("x", kEw, b.normal(kEw))), {1}); }},
      {"sum_all", [](Builder& b) { return sum(stored(b.param("x", kEw, b.normal(kEw)))); }},
      {"mean", [](Builder& b) { return mean(stored(b.param("x", kEw, b.normal(kEw))), {0}); }},
      {"mean_all", [](Builder& b) { return mean(stored(b.param("x", kEw, b.normal(kEw)))); }},
      {"softmax", [](Builder& b) { return softmax(stored(b.param("x", kEw, b.normal(kEw, 2.0)))); }},
      {"log_softmax", [](Builder& b) { return log_softmax(stored(b.param("x", kEw, b.normal(kEw, 2.0)))); }},
      {"cross_entropy",
       [](Builder& b) {
         Var logits = b.param("logits", {64, 37}, b.normal({64, 37}, 2.0));
         return cross_entropy(stored(logits), b.ints("labels", {64}, b.labels({64}, 37)));
       },
       true},
      {"mse",
       [](Builder& b) {
         Var p = b.param("prediction", kEw, b.normal(kEw));
         Var t = b.param("target", kEw, b.normal(kEw));
         return mse(stored(p), stored(t));
       },
       true},
      {"layer_norm",
       [](Builder& b) {
         Var x = b.param("x", {48, 67}, b.normal({48, 67}, 2.0, 1.0));  // an offset for the mean to remove
         Var gamma = b.param("gamma", {67}, b.uniform({67}, 0.5, 1.5));
         Var beta = b.param("beta", {67}, b.normal({67}, 0.5));
         return layer_norm(stored(x), gamma, beta);
       }},
      {"batch_norm",
       [](Builder& b) {
         const Shape s{8, 6, 9, 9};
         Var x = b.param("x", s, b.normal(s, 2.0, 1.0));
         Var gamma = b.param("gamma", {6}, b.uniform({6}, 0.5, 1.5));
         Var beta = b.param("beta", {6}, b.normal({6}, 0.5));
         Var rm = b.state("running_mean", {6}, Init::zeros());
         Var rv = b.state("running_var", {6}, Init::ones());
         return batch_norm(stored(x), gamma, beta, rm, rv);
       }},
      conv_case("conv2d_3x3", {4, 5, 11, 11}, 6, 3, {.padding = {1, 1}}, true),
      conv_case("conv2d_stride2", {4, 5, 13, 13}, 6, 3, {.stride = {2, 2}, .padding = {1, 1}}, true),
      conv_case("conv2d_1x1", {4, 5, 11, 11}, 7, 1, {}, false),
      // 2x2 windows whose maximum leads the rest by at least 0.5, for the reason min_max
      // gives: a tie flipped by rounding would move the gradient to another element.
      {"max_pool2d",
       [](Builder& b) {
         const Shape s{4, 5, 12, 12};
         std::vector<float> v = b.normal(s);
         for (size_t plane = 0; plane < 20; ++plane)
           for (size_t i = 0; i < 12; i += 2)
             for (size_t j = 0; j < 12; j += 2) {
               float* best = nullptr;
               for (size_t di = 0; di < 2; ++di)
                 for (size_t dj = 0; dj < 2; ++dj) {
                   float* e = &v[plane * 144 + (i + di) * 12 + j + dj];
                   if (!best || *e > *best) best = e;
                 }
               *best += 0.5f;
             }
         return max_pool2d(b.param("x", s, std::move(v)), {2, 2});
       }},
      {"avg_pool2d",
       [](Builder& b) {
         return avg_pool2d(b.param("x", {4, 5, 13, 13}, b.normal({4, 5, 13, 13})), {3, 3}, {2, 2}, {1, 1});
       }},
      {"global_avg_pool",
       [](Builder& b) { return global_avg_pool(b.param("x", {4, 6, 11, 11}, b.normal({4, 6, 11, 11}))); }},
      // 315 ids over 50 rows: each row is hit about 6 times, so its gradient is a sum.
      {"embedding",
       [](Builder& b) {
         Var w = b.param("weight", {50, 24}, b.normal({50, 24}));
         return embedding(b.ints("ids", {7, 45}, b.labels({7, 45}, 50)), w);
       }},
      // Causal attention over 37 positions (no tile divides it), 3 heads of 32.
      {"attention",
       [](Builder& b) {
         const Shape s{2, 3, 37, 32};
         return attention(b.param("q", s, b.normal(s)), b.param("k", s, b.normal(s)), b.param("v", s, b.normal(s)),
                          true);
       }},
      // The mask is a function of (seed, step, node position, element), and both graphs
      // are built alike under one seed: the reference drops the same elements.
      unary("dropout", [](Var x) { return dropout(x, 0.25); }, n1),
  };
  return c;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = make_cases();
  return c;
}

const Case& find_case(const std::string& op) {
  for (const Case& c : cases())
    if (c.name == op) return c;
  std::string near = nearest_names(op, numerics_ops());
  fail("numerics: no case named '", op, "'", near.empty() ? "" : "; did you mean " + near + "?");
}

// A seed per case from its name (FNV-1a): adding or reordering cases changes no values.
uint64_t seed_of(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

std::vector<std::byte> bytes_in(const std::vector<float>& v, DType t) {
  std::vector<std::byte> b(v.size() * dtype_size(t));
  if (t == DType::f32) {
    std::memcpy(b.data(), v.data(), b.size());
  } else {
    SEAM_ASSERT(t == DType::f64);
    for (size_t i = 0; i < v.size(); ++i) {
      const double d = v[i];
      std::memcpy(b.data() + 8 * i, &d, 8);
    }
  }
  return b;
}

struct Run {
  std::vector<std::string> what;
  std::vector<std::vector<double>> values;
};

// One case built in `dtype`, compiled with gradients at `precision` on `device`, run once.
Run run_case(const Case& c, DType dtype, Device device, Precision precision) {
  try {
    Builder b(dtype, seed_of(c.name));
    const Var out = c.build(b);
    Var loss = out;
    if (!c.own_loss) {
      // Weights in [0.5, 1.5): every output element matters and none cancels another.
      Var w = b.input("numerics.weights", out.shape(), b.uniform(out.shape(), 0.5, 1.5));
      loss = sum(mul(out, w));
    }
    Model m(b.g, {.seed = 5, .device = device, .precision = precision});
    CompileOptions co{.loss = loss.id(), .gradients = true};
    if (!c.own_loss) co.outputs = {out.id()};
    Program p = m.compile(co);
    for (const auto& v : b.params) m.write_param(v.name, bytes_in(v.values, dtype));
    for (const auto& v : b.inputs) p.set_input(v.name, bytes_in(v.values, dtype));
    for (const auto& [name, ids] : b.int_inputs) p.set_input(name, std::span<const int32_t>(ids));
    p.run();
    Run r;
    r.what.push_back("output");
    r.values.push_back(float_values(p.read(out.name()), out.dtype()));
    for (const auto& v : b.params) {
      r.what.push_back("gradient of " + v.name);
      r.values.push_back(float_values(p.read_grad(v.name), dtype));
    }
    return r;
  } catch (const Error& e) {
    fail("numerics case '", c.name, "' (", dtype_name(dtype), " graph at ", precision_name(precision), " on ",
         device_name(device), "): ", e.what());
  }
}

std::vector<NumericsTensor> pair_up(const std::string& op, Run got, Run ref) {
  if (got.what != ref.what)
    fail("numerics case '", op, "': the policy's run and the reference compared different tensors");
  std::vector<NumericsTensor> t;
  for (size_t i = 0; i < got.what.size(); ++i) {
    if (got.values[i].size() != ref.values[i].size())
      fail("numerics case '", op, "', ", got.what[i], ": ", got.values[i].size(), " values against the reference's ",
           ref.values[i].size());
    t.push_back({got.what[i], std::move(got.values[i]), std::move(ref.values[i])});
  }
  return t;
}

Run reference(const Case& c) { return run_case(c, DType::f64, Device::cpu, Precision::f32); }

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

}  // namespace

RelError relative_error(std::span<const double> got, std::span<const double> ref) {
  if (got.size() != ref.size())
    fail("relative_error: ", got.size(), " values against ", ref.size(), " reference values");
  if (ref.empty()) return {};
  double squares = 0;
  for (double r : ref) squares += r * r;
  // An all-zero reference has no scale: any difference from it is then infinitely wrong.
  const double floor = std::max(kRelFloor * std::sqrt(squares / static_cast<double>(ref.size())),
                                std::numeric_limits<double>::min());
  RelError e;
  double total = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::abs(got[i] - ref[i]);
    const double rel = std::isfinite(got[i]) ? d / (std::abs(ref[i]) + floor) : INFINITY;
    e.max = std::max(e.max, rel);
    total += rel;
  }
  e.mean = total / static_cast<double>(ref.size());
  return e;
}

std::vector<std::string> numerics_ops() {
  std::vector<std::string> names;
  for (const Case& c : cases()) names.push_back(c.name);
  return names;
}

namespace {
bool selects(const std::string& filter, const std::string& op) {
  return op == filter || op.rfind(filter + "_", 0) == 0;
}
}  // namespace

bool selects_numerics_op(const std::string& filter) {
  return std::any_of(cases().begin(), cases().end(), [&](const Case& c) { return selects(filter, c.name); });
}

std::vector<std::string> select_numerics_ops(const std::vector<std::string>& filters) {
  if (filters.empty()) return numerics_ops();
  std::vector<std::string> chosen;
  for (const std::string& f : filters) {
    bool any = false;
    for (const Case& c : cases()) {
      if (!selects(f, c.name)) continue;
      any = true;
      if (std::find(chosen.begin(), chosen.end(), c.name) == chosen.end()) chosen.push_back(c.name);
    }
    if (!any) {
      std::string near = nearest_names(f, numerics_ops());
      fail("no numerics case is named '", f, "' or starts with '", f, "_'",
           near.empty() ? "" : "; did you mean " + near + "?");
    }
  }
  // The suite's order, whatever the filters' order.
  std::vector<std::string> ordered;
  for (const std::string& n : numerics_ops())
    if (std::find(chosen.begin(), chosen.end(), n) != chosen.end()) ordered.push_back(n);
  return ordered;
}

std::vector<NumericsTensor> numerics_case(const std::string& op, Device device, Precision precision) {
  const Case& c = find_case(op);
  return pair_up(op, run_case(c, DType::f32, device, precision), reference(c));
}

NumericsRow numerics_row(const std::string& op, Precision precision, const NumericsTensor& t) {
  const RelError e = relative_error(t.got, t.ref);
  return {op, precision, t.what, static_cast<int64_t>(t.ref.size()), e.max, e.mean};
}

std::vector<NumericsRow> run_numerics(Device device, const std::vector<Precision>& precisions,
                                      const std::vector<std::string>& ops) {
  std::vector<NumericsRow> rows;
  for (const std::string& op : select_numerics_ops(ops)) {
    const Case& c = find_case(op);
    const Run ref = reference(c);
    for (Precision p : precisions)
      for (const NumericsTensor& t : pair_up(op, run_case(c, DType::f32, device, p), ref))
        rows.push_back(numerics_row(op, p, t));
  }
  return rows;
}

// One line per (op, tensor), the precisions side by side: a row's numbers are easier to
// compare across policies than down a long list.
void write_numerics_table(const std::vector<NumericsRow>& rows, std::ostream& out) {
  std::vector<Precision> precisions;
  std::vector<std::pair<std::string, std::string>> keys;  // (op, what), first-seen order
  std::map<std::pair<std::string, std::string>, int64_t> elements;
  std::map<std::tuple<std::string, std::string, Precision>, const NumericsRow*> cell;
  size_t op_w = 2, what_w = 4;
  for (const NumericsRow& r : rows) {
    if (std::find(precisions.begin(), precisions.end(), r.precision) == precisions.end())
      precisions.push_back(r.precision);
    auto key = std::make_pair(r.op, r.what);
    if (!elements.count(key)) keys.push_back(key);
    elements[key] = r.elements;
    cell[{r.op, r.what, r.precision}] = &r;
    op_w = std::max(op_w, r.op.size());
    what_w = std::max(what_w, r.what.size());
  }
  auto pad = [](std::string s, size_t w, bool right = false) {
    const std::string fill(w > s.size() ? w - s.size() : 0, ' ');
    return right ? fill + s : s + fill;
  };
  std::string head = pad("op", op_w) + "  " + pad("what", what_w) + "  " + pad("elements", 8, true);
  for (Precision p : precisions) {
    const std::string n = precision_name(p);
    head += "  " + pad(n + " max", 9, true) + "  " + pad(n + " mean", 9, true);
  }
  out << head << "\n" << std::string(head.size(), '-') << "\n";
  for (const auto& key : keys) {
    std::string line = pad(key.first, op_w) + "  " + pad(key.second, what_w) + "  " +
                       pad(std::to_string(elements[key]), 8, true);
    for (Precision p : precisions) {
      auto it = cell.find({key.first, key.second, p});
      const bool has = it != cell.end();
      line += "  " + pad(has ? sci(it->second->max_rel) : "-", 9, true) + "  " +
              pad(has ? sci(it->second->mean_rel) : "-", 9, true);
    }
    out << line << "\n";
  }
}

void write_numerics_csv(const std::vector<NumericsRow>& rows, std::ostream& out) {
  out << "op,precision,what,elements,max_rel,mean_rel\n";
  char buf[64];
  for (const NumericsRow& r : rows) {
    std::snprintf(buf, sizeof buf, "%.6g,%.6g", r.max_rel, r.mean_rel);
    out << r.op << "," << precision_name(r.precision) << "," << r.what << "," << r.elements << "," << buf << "\n";
  }
}

int run_numerics_command(const NumericsOptions& o) {
  const Device device = o.device == "cpu" ? Device::cpu : o.device == "cuda" ? Device::cuda : default_device();
  std::vector<Precision> precisions = o.precisions;
  if (precisions.empty()) precisions = {Precision::f32, Precision::tf32, Precision::bf16, Precision::f16};
  const std::vector<std::string> ops = select_numerics_ops(o.ops);  // before the long part: a bad name fails at once
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv);
    if (!csv) fail(o.csv, ": cannot write the CSV");
  }
  std::printf("numerics on %s against float64 on the CPU: per element |got - ref| / (|ref| + %g rms(ref))\n",
              device_name(device), kRelFloor);
  std::fflush(stdout);
  const std::vector<NumericsRow> rows = run_numerics(device, precisions, ops);
  write_numerics_table(rows, std::cout);
  if (csv.is_open()) {
    write_numerics_csv(rows, csv);
    csv.close();
    if (!csv) fail(o.csv, ": writing the CSV failed");
  }
  return 0;
}

}  // namespace seam::bench
