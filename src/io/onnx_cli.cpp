// `seam run` and `seam plan` on ONNX files (src/io/onnx_cli.h).
#include "io/onnx_cli.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "io/npy.h"
#include "io/onnx.h"
#include "plan/explain.h"

namespace seam::onnx {

namespace {

struct Imported {
  OnnxImport imp;
  std::vector<ValueId> outputs;
};

Imported load(const RunOptions& o) {
  Imported r{import_onnx(o.model, {.input_shapes = o.input_shapes}), {}};
  for (const std::string& name : r.imp.outputs) r.outputs.push_back(*r.imp.graph.find(name));
  return r;
}

// Output file names: the graph's output names, with characters a file name should not
// carry replaced.
std::string file_name(const std::string& name) {
  std::string s = name;
  for (char& ch : s)
    if (ch == '/' || ch == '\\' || ch == ':' || ch == ' ') ch = '_';
  return s + ".npy";
}

}  // namespace

std::pair<std::string, Shape> parse_input_shape(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    fail("--input-shape '", text, "': expected name=D1xD2x... (e.g. x=1x3x224x224)");
  Shape s;
  size_t at = eq + 1;
  while (at <= text.size()) {
    const size_t x = text.find('x', at);
    const std::string part = text.substr(at, x == std::string::npos ? std::string::npos : x - at);
    long long d = 0;
    try {
      size_t used = 0;
      d = std::stoll(part, &used);
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      fail("--input-shape '", text, "': '", part, "' is not a dimension");
    }
    if (d < 1) fail("--input-shape '", text, "': dimension ", d, " must be at least 1");
    s.push_back(d);
    if (x == std::string::npos) break;
    at = x + 1;
  }
  return {text.substr(0, eq), s};
}

int run_onnx(const RunOptions& o) {
  Imported m = load(o);
  for (const auto& [name, path] : o.inputs)
    if (std::find(m.imp.inputs.begin(), m.imp.inputs.end(), name) == m.imp.inputs.end())
      fail("--input names '", name, "', which is no input of ", o.model);
  for (const std::string& name : m.imp.inputs)
    if (!o.inputs.count(name)) fail(o.model, ": input '", name, "' needs a value: --input ", name, "=FILE.npy");
  Model model(m.imp.graph, {.seed = 0, .device = o.device, .precision = o.precision});
  load_initial(model, m.imp);
  Program p = model.compile({.mode = Mode::eval, .outputs = m.outputs});
  for (const std::string& name : m.imp.inputs) {
    const std::string& path = o.inputs.at(name);
    const HostTensor t = io::read_npy(path);
    const TensorType& want = m.imp.graph.value(*m.imp.graph.find(name)).type;
    if (t.type.dtype != want.dtype || t.type.shape != want.shape)
      fail(path, ": holds ", t.type.str(), ", input '", name, "' takes ", want.str());
    p.set_input(name, t.data);
  }
  p.run();
  std::filesystem::create_directories(o.out_dir);
  for (size_t i = 0; i < m.outputs.size(); ++i) {
    const std::string& name = m.imp.outputs[i];
    HostTensor out{name, p.plan().output(name)->ref.type, p.read(name)};
    const std::string path = (std::filesystem::path(o.out_dir) / file_name(m.imp.output_names[i])).string();
    io::write_npy(path, out);
    std::printf("%s: %s -> %s\n", m.imp.output_names[i].c_str(), out.type.str().c_str(), path.c_str());
  }
  if (o.time_runs > 0) {
    // Inference as a server runs it: the inputs stay on the device, runs back to back, the
    // time per run from the host's clock around each round (the device drained at its end).
    for (int i = 0; i < 3; ++i) p.run();
    p.check();
    std::vector<double> ms;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.time_runs; ++i) p.run();
      p.check();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
                   o.time_runs);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("time: %.4f ms per run (median of 5 rounds of %d; min %.4f, max %.4f; %s, %s)\n", ms[2], o.time_runs,
                ms.front(), ms.back(), device_name(model.device()), precision_name(o.precision));
  }
  return 0;
}

int plan_onnx(const RunOptions& o) {
  Imported m = load(o);
  Model model(m.imp.graph, {.seed = 0, .device = o.device, .precision = o.precision});
  const CompileOptions eval{.mode = Mode::eval, .outputs = m.outputs};
  // Only --measure runs the step; the plans alone need no program (src/train/trainer.cpp's
  // run_plan does the same).
  std::optional<Program> p;
  if (o.measure) p.emplace(model.compile(eval));
  const Plan fused = p ? p->plan() : model.plan(eval);
  const Plan unfused = Model(m.imp.graph, {.seed = 0}).plan({.mode = Mode::eval, .outputs = m.outputs, .fuse = false});
  std::printf("%s (ONNX, opset %lld, %s; evaluation, %s, %s)\n%s", o.model.c_str(), static_cast<long long>(m.imp.opset),
              m.imp.producer.empty() ? "no producer named" : m.imp.producer.c_str(), device_name(model.device()),
              precision_name(o.precision), fused.str().c_str());
  std::vector<double> measured;
  if (p) {
    load_initial(model, m.imp);  // measured on the file's values, not zeros
    measured = p->time_steps(20);
  }
  std::printf("\n%s", explain_plan(fused, unfused, DeviceModel{}, true, measured).c_str());
  for (const std::string& line : model.layout_choices()) std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace seam::onnx
