// seam sample: text from a language model's checkpoint.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "seam/model.h"
#include "train/trainer.h"

namespace seam::train {

namespace {

// The next token from one position's logits: the most likely at temperature 0, else a
// draw from softmax(logits / temperature), over the top_k most likely when top_k > 0.
int32_t draw(const float* logits, int64_t vocab, double temperature, int64_t top_k, std::mt19937_64& rng) {
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto more_likely = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (temperature == 0) return *std::min_element(order.begin(), order.end(), more_likely);
  const int64_t k = top_k > 0 ? std::min(top_k, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), more_likely);
  order.resize(static_cast<size_t>(k));
  std::vector<double> w(order.size());
  const double top = logits[order[0]];
  for (size_t i = 0; i < order.size(); ++i) w[i] = std::exp((logits[order[i]] - top) / temperature);
  std::discrete_distribution<size_t> pick(w.begin(), w.end());
  return order[pick(rng)];
}

}  // namespace

int run_sample(const SampleOptions& o) {
  auto [spec, tensors] = read_checkpoint_model(o.checkpoint, o.model_path);
  // Left-aligned context with padding after it is right only for a causal model.
  if (!spec.gpt) fail(spec.source, ": seam sample draws from a causal language model (\"model\": {\"type\": \"gpt\"})");
  if (!(o.temperature >= 0)) fail("--temperature must be >= 0, got ", o.temperature);
  const int64_t T = spec.input_shape[0], V = spec.classes;
  io::BuiltGraph bg = io::build_graph(spec, 1);
  Model model(bg.graph, {.seed = spec.seed, .device = resolve_device(o.device), .precision = spec.precision,
                         .precision_overrides = bg.overrides, .master_weights = spec.master_weights, .layout = spec.layout});
  try {
    model.load_tensors(tensors);
  } catch (const Error& e) {
    fail(o.checkpoint, " does not fit ", spec.source, ": ", e.what());
  }
  Program p = model.compile({.mode = Mode::eval, .outputs = {bg.logits}});
  const std::string logits_name = bg.graph.value(bg.logits).name;

  std::vector<int32_t> seq;
  for (unsigned char c : o.prompt.empty() ? std::string("\n") : o.prompt) {
    if (c >= V) fail("the prompt's byte ", int{c}, " is beyond the model's vocabulary of ", V);
    seq.push_back(c);
  }
  // The tokens are bytes (the prompt's, as `seam tokenize` makes them), whatever the
  // vocabulary's width: an id past 255, which byte data never trains toward, shows as <id>.
  auto show = [&](int32_t t) {
    if (t < 256) std::fputc(t, stdout);
    else std::printf("<%d>", t);
  };
  for (int32_t t : seq) show(t);
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> x(static_cast<size_t>(T)), y(static_cast<size_t>(T), -100);
  for (int64_t n = 0; n < o.tokens; ++n) {
    // The last T tokens, left-aligned: causal attention keeps the padding after them out.
    const int64_t len = std::min<int64_t>(T, static_cast<int64_t>(seq.size()));
    std::fill(x.begin(), x.end(), 0);
    std::copy(seq.end() - len, seq.end(), x.begin());
    p.set_input("x", std::as_bytes(std::span(x)));
    p.set_input("y", std::as_bytes(std::span(y)));
    p.run();
    const std::vector<float> logits = p.read_as<float>(logits_name);
    if (static_cast<int64_t>(logits.size()) != T * V)
      fail("internal error: logits of ", logits.size(), " floats, not [", T, ", ", V, "]");
    const int32_t next = draw(logits.data() + (len - 1) * V, V, o.temperature, o.top_k, rng);
    seq.push_back(next);
    show(next);
    std::fflush(stdout);
  }
  std::printf("\n");
  return 0;
}

}  // namespace seam::train
