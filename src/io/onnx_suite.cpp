// The ONNX backend node tests through seam (`seam onnx-suite`, src/io/onnx_suite.h): each
// test folder's model.onnx imported, its test_data_set_0 inputs run through an evaluation
// program, the outputs compared with the test's own at the suite's tolerance
// (|out - ref| <= 1e-7 + 1e-3 |ref|, NaN only where NaN), and a table per op.
#include "io/onnx_suite.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "common/half.h"
#include "io/onnx.h"
#include "io/onnx_import.h"

namespace seam::onnx {

namespace {

using detail::value_at;

namespace fs = std::filesystem;

enum class Outcome { pass, fail, refused, unsupported };
const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::pass: return "pass";
    case Outcome::fail: return "fail";
    case Outcome::refused: return "refused";
    default: return "unsupported";
  }
}

struct Result {
  std::string test, op;
  Outcome outcome = Outcome::fail;
  std::string why;
  bool bound = false;  // its inputs were bound as constants
};


// "" when out matches ref at the suite's tolerance, else the first mismatch.
std::string compare(const std::vector<std::byte>& out, const TensorType& ot, const HostTensor& ref) {
  if (numel(ot.shape) != numel(ref.type.shape) || ot.shape != ref.type.shape)
    return "shape " + shape_str(ot.shape) + ", expected " + shape_str(ref.type.shape);
  const size_t n = static_cast<size_t>(numel(ot.shape));
  for (size_t i = 0; i < n; ++i) {
    const double a = value_at(out, ot.dtype, i), b = value_at(ref.data, ref.type.dtype, i);
    const bool ok = std::isnan(b) ? std::isnan(a) : (a == b || std::abs(a - b) <= 1e-7 + 1e-3 * std::abs(b));
    if (!ok) {
      std::ostringstream s;
      s << "element " << i << " is " << a << ", expected " << b;
      return s.str();
    }
  }
  return "";
}

std::vector<fs::path> files(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> r;
  for (int k = 0;; ++k) {
    fs::path p = dir / (prefix + "_" + std::to_string(k) + ".pb");
    if (!fs::exists(p)) break;
    r.push_back(p);
  }
  return r;
}

// The test's op: its node's type, or the test's own group for a graph of several nodes
// (the "_expanded" forms of functions).
std::string op_of(const ::onnx::ModelProto& m, const std::string& test) {
  if (m.graph().node_size() == 0) return "(no nodes)";
  if (test.ends_with("_expanded")) return "(expanded functions)";
  return m.graph().node(0).op_type();
}

// The op types (and domains) of the graph no importer covers, "" if none.
std::string missing_ops(const ::onnx::ModelProto& m) {
  std::set<std::string> missing;
  for (const auto& n : m.graph().node()) {
    if (!n.domain().empty() && n.domain() != "ai.onnx") missing.insert(n.domain() + "." + n.op_type());
    else if (!detail::op_importers().count(n.op_type())) missing.insert(n.op_type());
  }
  std::string r;
  for (const auto& op : missing) r += (r.empty() ? "" : ", ") + op;
  return r;
}

// A test tensor in the dtype seam keeps `want` in: bfloat16 comes as UINT16 bit patterns
// (numpy has no bfloat16), which read_tensor_file keeps as i32.
HostTensor as_dtype(HostTensor t, DType want) {
  if (want != DType::bf16 || t.type.dtype != DType::i32) return t;
  HostTensor r{t.name, {DType::bf16, t.type.shape}, {}};
  for (size_t i = 0; i < static_cast<size_t>(numel(t.type.shape)); ++i) {
    const auto bits = static_cast<uint16_t>(value_at(t.data, DType::i32, i));
    r.data.push_back(static_cast<std::byte>(bits & 0xff));
    r.data.push_back(static_cast<std::byte>(bits >> 8));
  }
  return r;
}

Result run_one(const fs::path& dir, Device device) {
  Result r;
  r.test = dir.filename().string();
  const fs::path model_path = dir / "model.onnx";
  ::onnx::ModelProto m;
  {
    std::ifstream in(model_path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!m.ParseFromString(bytes)) {
      r.op = "(unreadable)";
      r.why = "model.onnx does not parse";
      return r;
    }
  }
  r.op = op_of(m, r.test);
  if (const std::string missing = missing_ops(m); !missing.empty()) {
    r.outcome = Outcome::unsupported;
    r.why = "no import for " + missing;
    return r;
  }
  const fs::path data = dir / "test_data_set_0";
  const auto ins = files(data, "input"), outs = files(data, "output");
  std::vector<std::string> input_names;  // the graph's inputs that are not initializers
  {
    std::set<std::string> inits;
    for (const auto& t : m.graph().initializer()) inits.insert(t.name());
    for (const auto& v : m.graph().input())
      if (!inits.count(v.name())) input_names.push_back(v.name());
  }
  OnnxImport imp;
  OnnxOptions options;
  try {
    try {
      imp = import_onnx(model_path.string(), options);
    } catch (const Error& e) {
      // An operand seam needs constant (a shape, axes, an exponent) fed as an input, or an
      // empty one (seam's values have no empty dims): the test's values bound as constants.
      const std::string what = e.what();
      if ((what.find("must be a constant") == std::string::npos && what.find("must be constants") == std::string::npos &&
           what.find("non-positive dimension") == std::string::npos) ||
          ins.size() != input_names.size())
        throw;
      for (size_t i = 0; i < ins.size(); ++i) options.values[input_names[i]] = read_tensor_file(ins[i].string());
      imp = import_onnx(model_path.string(), options);
      r.bound = true;
    }
  } catch (const std::exception& e) {
    r.why = e.what();
    r.outcome = Outcome::refused;
    return r;
  }
  try {
    if (outs.size() != imp.outputs.size())
      fail(outs.size(), " output files for ", imp.outputs.size(), " graph outputs");
    Model model(imp.graph, {.seed = 0, .device = device});
    load_initial(model, imp);
    std::vector<ValueId> want;
    for (const std::string& name : imp.outputs) want.push_back(*imp.graph.find(name));
    Program p = model.compile({.mode = Mode::eval, .outputs = want});
    if (!r.bound) {
      if (ins.size() != imp.inputs.size()) fail(ins.size(), " input files for ", imp.inputs.size(), " graph inputs");
      for (size_t i = 0; i < ins.size(); ++i) {
        // An input the program never reads (CastLike's second operand gives only its type)
        // is not fed: its data cannot change a result, and some tests' data does not match
        // its declared shape.
        if (!p.plan().input(imp.inputs[i])) continue;
        const TensorType& need = imp.graph.value(*imp.graph.find(imp.inputs[i])).type;
        const HostTensor t = as_dtype(read_tensor_file(ins[i].string()), need.dtype);
        if (t.type.dtype != need.dtype || t.type.shape != need.shape)
          fail("input ", i, " is ", t.type.str(), ", the graph takes ", need.str());
        p.set_input(imp.inputs[i], t.data);
      }
    }
    p.run();
    for (size_t i = 0; i < outs.size(); ++i) {
      const Binding* b = p.plan().output(imp.outputs[i]);
      const HostTensor ref = as_dtype(read_tensor_file(outs[i].string()), b->ref.type.dtype);
      const std::string diff = compare(p.read(imp.outputs[i]), b->ref.type, ref);
      if (!diff.empty()) {
        r.why = "output " + std::to_string(i) + " ('" + imp.output_names[i] + "'): " + diff;
        return r;
      }
    }
    r.outcome = Outcome::pass;
  } catch (const std::exception& e) {
    r.why = e.what();
  }
  return r;
}

}  // namespace

int run_onnx_suite(const SuiteOptions& o) {
  std::vector<fs::path> dirs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(o.dir, ec))
    if (e.is_directory() && fs::exists(e.path() / "model.onnx") &&
        (o.filter.empty() || e.path().filename().string().find(o.filter) != std::string::npos))
      dirs.push_back(e.path());
  if (ec) fail(o.dir, ": cannot list the folder (", ec.message(), ")");
  if (dirs.empty()) fail(o.dir, ": no test folders (with a model.onnx) there");
  std::sort(dirs.begin(), dirs.end());
  std::vector<Result> results;
  for (const fs::path& d : dirs) {
    results.push_back(run_one(d, o.device));
    const Result& r = results.back();
    if (o.verbose || (r.outcome != Outcome::pass && r.outcome != Outcome::unsupported && o.show_failures))
      std::printf("%-10s %s: %s\n", outcome_name(r.outcome), r.test.c_str(), r.why.c_str());
  }
  // Per op: pass / fail / refused / unsupported.
  std::map<std::string, std::array<int, 4>> by_op;
  std::array<int, 4> total{};
  int bound = 0;
  for (const Result& r : results) {
    bound += r.bound && r.outcome == Outcome::pass;
    ++by_op[r.op][static_cast<size_t>(r.outcome)];
    ++total[static_cast<size_t>(r.outcome)];
  }
  const int supported = total[0] + total[1] + total[2];
  std::ostringstream md;
  md << "| op | tests | pass | fail | refused | unsupported |\n|---|---|---|---|---|---|\n";
  for (const auto& [op, c] : by_op)
    md << "| " << op << " | " << c[0] + c[1] + c[2] + c[3] << " | " << c[0] << " | " << c[1] << " | " << c[2] << " | "
       << c[3] << " |\n";
  char line[256];
  std::snprintf(line, sizeof line,
                "| **all** | %zu | %d | %d | %d | %d |\n\nOf the %d tests of supported ops, %d pass (%.1f%%; %d of "
                "them with their inputs bound as constants, where seam needs an operand constant); %d tests are of "
                "ops seam does not import.\n",
                results.size(), total[0], total[1], total[2], total[3], supported, total[0],
                supported ? 100.0 * total[0] / supported : 0.0, bound, total[3]);
  md << line;
  std::printf("%s", md.str().c_str());
  if (!o.markdown.empty()) {
    std::ofstream out(o.markdown);
    out << md.str();
    if (!out) fail(o.markdown, ": cannot write the table");
  }
  if (o.min_pass_percent > 0 && (supported == 0 || 100.0 * total[0] / supported < o.min_pass_percent)) {
    std::printf("below the %.1f%% asked for\n", o.min_pass_percent);
    return 1;
  }
  return 0;
}

}  // namespace seam::onnx
