// seam step: one training step written out for a twin in another framework to compare
// with (src/train/trainer.h, bench/torch_twin.py).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "common/file.h"
#include "io/safetensors.h"
#include "train/trainer.h"

namespace seam::train {

namespace {

HostTensor host_tensor(const std::string& name, TensorType type, std::vector<std::byte> data) {
  return {name, std::move(type), std::move(data)};
}

template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Parameters and states by name (no optimizer moments: a twin starts its own).
std::vector<HostTensor> model_tensors(const Model& m) {
  std::vector<HostTensor> out;
  for (HostTensor& t : m.save_tensors())
    if (m.layout().param(t.name) || m.layout().state(t.name)) out.push_back(std::move(t));
  return out;
}

}  // namespace

int run_step(const StepOptions& o) {
  io::ModelSpec spec = io::parse_model_file(o.model_path);
  if (o.precision) spec.precision = *o.precision;
  if (o.layout) spec.layout = *o.layout;
  const int64_t B = o.batch.value_or(spec.batch_size);
  const int64_t steps_per_epoch = data_steps_per_epoch(spec, B);
  spec.fix_schedule_length(steps_per_epoch);
  const io::BuiltGraph bg = io::build_graph(spec, B);
  Model model(bg.graph, {.seed = spec.seed,
                         .device = resolve_device(o.device),
                         .precision = spec.precision,
                         .precision_overrides = bg.overrides,
                         .master_weights = spec.master_weights,
                         .layout = spec.layout,
                         .epilogue = o.epilogue});
  io::load_initial(model, bg);
  Program p = model.compile({.loss = bg.loss, .optimizer = spec.optimizer, .outputs = {bg.logits}, .recompute = spec.recompute, .output_chunks = spec.output_chunks, .memory_budget = spec.memory_budget});

  // Inputs drawn N(0, 1) (token ids uniform over the vocabulary), labels uniform over the
  // classes, from the data seed.
  const TensorType xt = bg.graph.value(bg.x).type, yt = bg.graph.value(bg.y).type;
  std::mt19937_64 rng(o.data_seed);
  const io::RandomBatch rb = io::random_batch(xt, yt, spec.classes, rng);
  const std::vector<std::byte> x_bytes = rb.x_bytes();
  const std::vector<int32_t>& y = rb.y;

  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) fail("cannot create the folder '", o.out_dir, "': ", ec.message());
  const std::filesystem::path dir(o.out_dir);
  const std::map<std::string, std::string> meta{{"model", spec.json.dump()}, {"precision", precision_name(spec.precision)}};
  io::write_safetensors((dir / "init.safetensors").string(), {meta, model_tensors(model)});
  io::write_safetensors((dir / "batch.safetensors").string(),
                        {meta, {host_tensor("x", xt, x_bytes), host_tensor("y", yt, bytes_of(y))}});

  p.set_input("x", std::span<const std::byte>(x_bytes));
  p.set_input("y", std::span<const int32_t>(y));
  p.run();
  const float loss = p.read_as<float>(bg.graph.value(bg.loss).name).at(0);
  std::vector<HostTensor> after = model_tensors(model);
  for (const Slot& s : model.layout().params) after.push_back(host_tensor("grad/" + s.name, s.user_type(), p.read_grad(s.name)));
  const std::string logits = bg.graph.value(bg.logits).name;
  after.push_back(host_tensor("logits", {DType::f32, bg.graph.value(bg.logits).type.shape}, p.read(logits)));
  after.push_back(host_tensor("loss", {DType::f32, {}}, bytes_of(std::vector<float>{loss})));
  io::write_safetensors((dir / "after.safetensors").string(), {meta, std::move(after)});
  // The rest of the curve: the same batch again, so that the loss falls far (the model
  // learns the batch) and a difference anywhere in the step shows in it.
  std::vector<float> losses{loss};
  for (int64_t i = 1; i < o.steps; ++i) {
    p.run();
    losses.push_back(p.read_as<float>(bg.graph.value(bg.loss).name).at(0));
  }

  const nlohmann::ordered_json info{{"model", o.model_path},
                                    {"name", spec.name},
                                    {"batch", B},
                                    {"device", device_name(model.device())},
                                    {"precision", precision_name(spec.precision)},
                                    {"layout", layout_policy_name(spec.layout)},
                                    {"epilogue", epilogue_policy_name(o.epilogue)},
                                    {"seed", spec.seed},
                                    {"data_seed", o.data_seed},
                                    {"steps_per_epoch", steps_per_epoch},
                                    {"loss", loss},
                                    {"losses", losses}};
  const std::string text = info.dump(2) + "\n";
  write_file_atomically((dir / "step.json").string(), std::as_bytes(std::span(text)));
  std::printf("%s: %lld %s step(s) on %s, batch %lld, loss %.9g", spec.name.c_str(), static_cast<long long>(o.steps),
              precision_name(spec.precision), device_name(model.device()), static_cast<long long>(B), loss);
  if (o.steps > 1) std::printf(" ... %.9g", losses.back());
  std::printf(" -> %s\n", o.out_dir.c_str());
  return 0;
}

}  // namespace seam::train
