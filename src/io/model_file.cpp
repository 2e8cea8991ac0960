// Model files: parsing, checking, and building the graph.
#include "io/model_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/strings.h"
#include "ops/registry.h"
#include "passes/fuse.h"
#include "passes/precision.h"
#include "seam/nn.h"
#include "seam/ops.h"

namespace seam::io {

using json = nlohmann::ordered_json;

namespace {

const std::vector<std::string> kTopKeys = {"name", "input", "classes", "layers", "nodes", "model", "output", "loss",
                                            "optimizer", "batch_size", "epochs", "seed", "device", "precision", "master_weights", "layout",
                                            "deterministic", "recompute", "output_chunks", "memory_budget_gib", "data", "description"};
// Layers that create their own parameters, with the settings each accepts.
const std::map<std::string, std::vector<std::string>> kLayers = {
    {"linear", {"out", "bias", "tie"}},
    {"conv2d", {"out", "kernel", "stride", "padding", "dilation", "groups", "bias"}},
    {"batch_norm", {"momentum", "eps"}},
    {"layer_norm", {"eps"}},
    {"embedding", {"num", "dim"}},
    {"position_embedding", {"num"}},
};
const std::vector<std::string> kNodeKeys = {"op", "name", "inputs", "input", "precision"};

[[noreturn]] void unknown(const std::string& where, const std::string& what, const std::string& name,
                          const std::vector<std::string>& known) {
  std::string near = nearest_names(name, known);
  fail(where, ": unknown ", what, " '", name, "'", near.empty() ? "" : "; did you mean " + near + "?");
}

void check_keys(const json& obj, const std::vector<std::string>& allowed, const std::string& where) {
  for (auto& [k, v] : obj.items())
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) unknown(where, "key", k, allowed);
}

// An integer setting (or list of them) must be written as integers: the JSON library
// would truncate 1.5 to 1, turn -1 into 2^64 - 1 for an unsigned one, and convert 1e55
// with undefined behaviour.
template <class T>
void expect_integers(const json& v, const std::string& key, const std::string& where) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const bool fits = std::is_unsigned_v<T> ? v.is_number_unsigned() : v.is_number_integer();
    if (!fits)
      fail(where, ": '", key, "' must be ", std::is_unsigned_v<T> ? "a non-negative integer" : "an integer", ", got ",
           v.dump());
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    if (!v.is_array()) fail(where, ": '", key, "' must be a list of integers, got ", v.dump());
    for (const json& e : v)
      if (!e.is_number_integer()) fail(where, ": '", key, "' must be a list of integers, got ", v.dump());
  }
}

template <class T>
T get(const json& obj, const std::string& key, T def, const std::string& where) {
  if (!obj.contains(key)) return def;
  const json& v = obj.at(key);
  expect_integers<T>(v, key, where);
  try {
    return v.get<T>();
  } catch (const json::exception&) {
    fail(where, ": '", key, "' has the wrong type (", v.dump(), ")");
  }
}

// Line and column of a byte offset, for JSON syntax errors.
std::string line_col(const std::string& text, size_t byte) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') ++line, col = 1;
    else ++col;
  }
  return std::to_string(line) + ":" + std::to_string(col);
}

Schedule parse_schedule(const json& s, const std::string& where) {
  check_keys(s, {"type", "warmup_steps", "step_size", "gamma", "total_steps", "min_lr"}, where);
  Schedule r;
  std::string type = get<std::string>(s, "type", "constant", where);
  if (type == "constant") r.kind = Schedule::Kind::constant;
  else if (type == "step") r.kind = Schedule::Kind::step;
  else if (type == "cosine") r.kind = Schedule::Kind::cosine;
  else unknown(where, "schedule type", type, {"constant", "step", "cosine"});
  r.warmup_steps = get<int64_t>(s, "warmup_steps", 0, where);
  r.step_size = get<int64_t>(s, "step_size", 1, where);
  r.gamma = get<double>(s, "gamma", 0.1, where);
  r.total_steps = get<int64_t>(s, "total_steps", 0, where);
  r.min_lr = get<double>(s, "min_lr", 0.0, where);
  return r;
}

OptimizerConfig parse_optimizer(const json& o, const std::string& where, bool* total_from_run) {
  check_keys(o, {"type", "lr", "momentum", "dampening", "nesterov", "betas", "eps", "weight_decay", "clip_norm", "schedule"},
             where);
  OptimizerConfig c;
  std::string type = get<std::string>(o, "type", "adam", where);
  if (type == "sgd") c = OptimizerConfig::sgd(0.01);
  else if (type == "adam") c = OptimizerConfig::adam(1e-3);
  else if (type == "adamw") c = OptimizerConfig::adamw(1e-3);
  else unknown(where, "optimizer type", type, {"sgd", "adam", "adamw"});
  c.lr = get<double>(o, "lr", c.lr, where);
  c.momentum = get<double>(o, "momentum", c.momentum, where);
  c.dampening = get<double>(o, "dampening", c.dampening, where);
  c.nesterov = get<bool>(o, "nesterov", c.nesterov, where);
  auto betas = get<std::vector<double>>(o, "betas", {c.beta1, c.beta2}, where);
  if (betas.size() != 2) fail(where, ": 'betas' needs two numbers");
  c.beta1 = betas[0], c.beta2 = betas[1];
  c.eps = get<double>(o, "eps", c.eps, where);
  c.weight_decay = get<double>(o, "weight_decay", c.weight_decay, where);
  c.clip_norm = get<double>(o, "clip_norm", c.clip_norm, where);
  if (o.contains("schedule")) c.schedule = parse_schedule(o["schedule"], where + ".schedule");
  *total_from_run = c.schedule.kind == Schedule::Kind::cosine && c.schedule.total_steps == 0;
  if (*total_from_run) c.schedule.total_steps = 1;  // set from the run length later
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  return c;
}

// A JSON value as an op attribute of the schema's type. A single int fills a window
// attribute's two entries ("kernel": 3 means [3, 3]); for any other list it is the one
// entry ("axes": 1 means [1]).
AttrValue to_attr(const json& v, const AttrValue& like, const std::string& where, const std::string& key) {
  auto bad = [&] { fail(where, ": '", key, "' must be a ", attr_type_name(like), ", got ", v.dump()); };
  switch (like.index()) {
    case 0:
      if (!v.is_number_integer() && !v.is_boolean()) bad();
      return v.is_boolean() ? int64_t{v.get<bool>()} : v.get<int64_t>();
    case 1:
      if (!v.is_number()) bad();
      return v.get<double>();
    case 2: {
      if (v.is_number_integer()) {
        const bool window = key == "kernel" || key == "stride" || key == "padding" || key == "dilation";
        return std::vector<int64_t>(window ? 2 : 1, v.get<int64_t>());
      }
      if (!v.is_array()) bad();
      std::vector<int64_t> r;
      for (auto& e : v) {
        if (!e.is_number_integer()) bad();
        r.push_back(e.get<int64_t>());
      }
      return r;
    }
    default:
      if (!v.is_string()) bad();
      return v.get<std::string>();
  }
}

std::vector<std::string> forward_ops() {
  std::vector<std::string> r;
  for (int i = 0; i < kNumOps; ++i) {
    if (!is_gradient_op(static_cast<Op>(i))) r.push_back(op_name(static_cast<Op>(i)));
  }
  for (auto& [k, v] : kLayers)
    if (std::find(r.begin(), r.end(), k) == r.end()) r.push_back(k);
  return r;
}

// "model": {"type": "gpt", ...}: nn::GptConfig's settings, checked.
nn::GptConfig parse_gpt(const json& m, const std::string& where) {
  if (!m.is_object()) fail(where, ": must be an object, e.g. {\"type\": \"gpt\", \"n_layer\": 6, ...}");
  const std::string type = get<std::string>(m, "type", "", where);
  if (type != "gpt") unknown(where, "model type", type, {"gpt", "onnx"});
  check_keys(m, {"type", "n_layer", "n_head", "n_embd", "vocab", "padded_vocab", "block_size", "dropout", "tie_weights", "ln_eps"},
             where);
  nn::GptConfig c;
  c.n_layer = get<int64_t>(m, "n_layer", c.n_layer, where);
  c.n_head = get<int64_t>(m, "n_head", c.n_head, where);
  c.n_embd = get<int64_t>(m, "n_embd", c.n_embd, where);
  c.vocab = get<int64_t>(m, "vocab", c.vocab, where);
  c.padded_vocab = get<int64_t>(m, "padded_vocab", 0, where);
  c.block_size = get<int64_t>(m, "block_size", c.block_size, where);
  c.dropout = get<double>(m, "dropout", c.dropout, where);
  c.tie_weights = get<bool>(m, "tie_weights", c.tie_weights, where);
  c.ln_eps = get<double>(m, "ln_eps", c.ln_eps, where);
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  return c;
}

json parse_json(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    std::string msg = e.what();
    auto cut = msg.find("parse error");
    fail(source, ":", line_col(text, e.byte == 0 ? 0 : e.byte - 1), ": malformed JSON: ",
         cut == std::string::npos ? msg : msg.substr(cut));
  } catch (const json::out_of_range& e) {
    // A number beyond double's range: the message quotes the literal, which places it.
    const std::string msg = e.what();
    const size_t open = msg.find('\''), close = msg.rfind('\'');
    const std::string literal = open < close ? msg.substr(open + 1, close - open - 1) : "";
    const size_t at = literal.empty() ? std::string::npos : text.find(literal);
    fail(source, at == std::string::npos ? "" : ":" + line_col(text, at), ": malformed JSON: the number ",
         literal.empty() ? msg : literal, " is out of range");
  }
}

// A file a model file names, against the model file's folder; written back absolute, so
// that the copy a checkpoint keeps finds it from anywhere.
void resolve_path(json& obj, const char* key, const std::filesystem::path& base) {
  if (!obj.is_object() || !obj.contains(key) || !obj[key].is_string()) return;
  const std::filesystem::path p(obj[key].get<std::string>());
  if (p.empty() || p.is_absolute()) return;
  obj[key] = std::filesystem::absolute(base / p).lexically_normal().string();
}

NetworkImporter g_onnx_importer = nullptr;

ImportedNetwork import_network(const ModelSpec& s, const Shape& sample, int64_t batch) {
  if (!g_onnx_importer) fail(s.source, ": model: this seam was built without the ONNX importer (SEAM_ONNX)");
  return g_onnx_importer(*s.onnx, sample, batch, s.source + ": model");
}

// "model": {"type": "onnx", ...}: the file, which input and output, what stays frozen.
OnnxNetwork parse_onnx_network(const json& m, const std::string& where) {
  check_keys(m, {"type", "file", "input", "output", "freeze"}, where);
  OnnxNetwork n;
  n.file = get<std::string>(m, "file", "", where);
  if (n.file.empty()) fail(where, ": 'file' names the ONNX file, e.g. \"file\": \"resnet18.onnx\"");
  n.input = get<std::string>(m, "input", "", where);
  n.output = get<std::string>(m, "output", "", where);
  n.freeze = get<std::vector<std::string>>(m, "freeze", {}, where);
  return n;
}

ModelSpec spec_of(json root, const std::string& source, const std::filesystem::path& base) {
  ModelSpec s;
  s.source = source;
  if (!root.is_object()) fail(source, ": a model file is a JSON object");
  if (root.contains("model")) resolve_path(root["model"], "file", base);
  if (root.contains("data") && root["data"].is_object() && root["data"].contains("arrays"))
    for (const char* k : {"x", "y", "test_x", "test_y"}) resolve_path(root["data"]["arrays"], k, base);
  s.json = std::move(root);
  const json& j = s.json;
  check_keys(j, kTopKeys, source);
  s.name = get<std::string>(j, "name", "model", source);
  const int sources = j.contains("layers") + j.contains("nodes") + j.contains("model");
  if (sources != 1)
    fail(source, ": give exactly one of 'layers' (a sequence), 'nodes' (a graph) or 'model' (a built-in or imported "
         "network)");
  if (j.contains("output") && j.contains("model"))
    fail(source, ": 'output' names a node of 'layers' or 'nodes'; a 'model' has its own");
  const bool onnx = j.contains("model") && j["model"].is_object() && j["model"].contains("type") &&
                    j["model"]["type"] == "onnx";
  if (onnx) {
    // The sample shape, dtype and classes are the file's; "input": {"shape"} binds the
    // sample dims it leaves symbolic.
    s.onnx = parse_onnx_network(j["model"], source + ": model");
    Shape bind;
    if (j.contains("input")) {
      check_keys(j["input"], {"shape"}, source + ": input");
      bind = get<std::vector<int64_t>>(j["input"], "shape", {}, source + ": input");
    }
    const ImportedNetwork n = import_network(s, bind, get<int64_t>(j, "batch_size", 128, source));
    const TensorType& x = n.graph.value(n.x).type;
    s.input_shape.assign(x.shape.begin() + 1, x.shape.end());
    s.input_dtype = x.dtype;
    if (x.dtype != DType::f32 && x.dtype != DType::i32)
      fail(source, ": model: the ONNX input takes ", x.str(), "; seam trains on float samples or integer token ids");
    s.classes = n.graph.value(n.logits).type.shape.back();
  } else if (j.contains("model")) {
    s.gpt = parse_gpt(j["model"], source + ": model");
    s.input_shape = {s.gpt->block_size};
    s.input_dtype = DType::i32;
  } else {
    if (!j.contains("input")) fail(source, ": 'input' is missing (e.g. \"input\": {\"shape\": [1, 28, 28]})");
    const json& layers = j.contains("layers") ? j["layers"] : j["nodes"];
    if (!layers.is_array() || layers.empty())
      fail(source, ": '", j.contains("layers") ? "layers" : "nodes", "' must be a non-empty list");
  }
  if (j.contains("input") && !s.onnx) {
    const json& in = j["input"];
    check_keys(in, {"shape", "dtype"}, source + ": input");
    s.input_shape = get<std::vector<int64_t>>(in, "shape", s.input_shape, source + ": input");
    if (s.input_shape.empty()) fail(source, ": input.shape must list the sample dims, e.g. [784] or [1, 28, 28]");
    for (int64_t d : s.input_shape)
      if (d <= 0) fail(source, ": input.shape ", shape_str(s.input_shape), " has a non-positive dim");
    const std::string dt = get<std::string>(in, "dtype", s.gpt ? "i32" : "f32", source + ": input");
    if (dt == "f32") s.input_dtype = DType::f32;
    else if (dt == "i32") s.input_dtype = DType::i32;
    else unknown(source + ": input", "dtype", dt, {"f32", "i32"});
    if (s.gpt && (s.input_dtype != DType::i32 || s.input_shape.size() != 1 || s.input_shape[0] > s.gpt->block_size))
      fail(source, ": a gpt's input is i32 [T] token ids with T <= block_size ", s.gpt->block_size, ", got ",
           dtype_name(s.input_dtype), shape_str(s.input_shape));
  }
  s.classes = get<int64_t>(j, "classes", s.gpt ? s.gpt->vocab : s.onnx ? s.classes : 10, source);
  if (s.gpt && s.classes != s.gpt->vocab)
    fail(source, ": classes = ", s.classes, " but the gpt's vocab is ", s.gpt->vocab, " (leave classes out)");
  s.batch_size = get<int64_t>(j, "batch_size", 128, source);
  s.epochs = get<int64_t>(j, "epochs", 10, source);
  s.seed = get<uint64_t>(j, "seed", 0, source);
  s.device = get<std::string>(j, "device", "auto", source);
  if (s.device != "auto" && s.device != "cpu" && s.device != "cuda") unknown(source, "device", s.device, {"auto", "cpu", "cuda"});
  const std::string precision = get<std::string>(j, "precision", "f32", source);
  if (auto p = parse_precision(precision)) s.precision = *p;
  else unknown(source, "precision", precision, precision_names());
  s.master_weights = get<bool>(j, "master_weights", true, source);
  s.deterministic = get<bool>(j, "deterministic", false, source);
  const std::string layout = get<std::string>(j, "layout", "auto", source);
  if (auto l = parse_layout_policy(layout)) s.layout = *l;
  else unknown(source, "layout", layout, layout_policy_names());
  if (j.contains("recompute")) {
    const json& r = j["recompute"];
    if (!r.is_array()) fail(source, ": recompute must be a list of activations, e.g. [\"gelu\"]");
    for (const json& a : r) {
      if (!a.is_string()) fail(source, ": recompute lists activations by name, got ", a.dump());
      const std::string name = a.get<std::string>();
      const auto known = recompute_names();
      if (std::find(known.begin(), known.end(), name) == known.end()) unknown(source, "recompute activation", name, known);
      s.recompute.push_back(name);
    }
  }
  if (j.contains("output_chunks")) {
    const json& c = j["output_chunks"];
    if (!c.is_number_integer() || c.get<int64_t>() < 1 || c.get<int64_t>() > 1024)
      fail(source, ": output_chunks must be a whole number from 1 to 1024 (the output layer's row chunks), got ", c.dump());
    s.output_chunks = static_cast<int>(c.get<int64_t>());
  }
  if (j.contains("memory_budget_gib")) {
    const json& b = j["memory_budget_gib"];
    if (!b.is_number() || !(b.get<double>() > 0) || b.get<double>() > 1e6)
      fail(source, ": memory_budget_gib must be a positive number of GiB (2^30 bytes), e.g. 7.5, got ", b.dump());
    s.memory_budget = static_cast<size_t>(b.get<double>() * 1073741824.0);
  }
  if (s.batch_size < 1) fail(source, ": batch_size must be >= 1");
  if (s.epochs < 1) fail(source, ": epochs must be >= 1");
  if (j.contains("loss")) {
    const json& l = j["loss"];
    check_keys(l, {"op", "label_smoothing"}, source + ": loss");
    std::string op = get<std::string>(l, "op", "cross_entropy", source + ": loss");
    if (op != "cross_entropy") unknown(source + ": loss", "loss", op, {"cross_entropy"});
    s.label_smoothing = get<double>(l, "label_smoothing", 0.0, source + ": loss");
  }
  s.optimizer = j.contains("optimizer") ? parse_optimizer(j["optimizer"], source + ": optimizer", &s.cosine_total_from_run)
                                        : OptimizerConfig::adam(1e-3);
  if (j.contains("data")) {
    check_keys(j["data"], {"val_split", "augment", "tokens", "arrays"}, source + ": data");
    s.tokens_dir = get<std::string>(j["data"], "tokens", "", source + ": data");
    if (j["data"].contains("arrays")) {
      const json& a = j["data"]["arrays"];
      const std::string where = source + ": data.arrays";
      if (!a.is_object()) fail(where, ": must be an object, e.g. {\"x\": \"x.npy\", \"y\": \"y.npy\"}");
      check_keys(a, {"x", "y", "test_x", "test_y"}, where);
      ArrayFiles f{get<std::string>(a, "x", "", where), get<std::string>(a, "y", "", where),
                   get<std::string>(a, "test_x", "", where), get<std::string>(a, "test_y", "", where)};
      if (f.x.empty() || f.y.empty()) fail(where, ": 'x' and 'y' name the training samples' and labels' .npy files");
      if (f.test_x.empty() != f.test_y.empty()) fail(where, ": give both test_x and test_y, or neither");
      if (!s.tokens_dir.empty()) fail(source, ": data: give 'tokens' or 'arrays', not both");
      s.arrays = f;
    }
    s.val_split = get<double>(j["data"], "val_split", 0.0, source + ": data");
    if (s.val_split < 0 || s.val_split >= 1) fail(source, ": data.val_split must be in [0, 1)");
    if (j["data"].contains("augment")) {
      const json& a = j["data"]["augment"];
      const std::string where = source + ": data.augment";
      if (!a.is_object()) fail(where, ": must be an object, e.g. {\"crop_padding\": 2, \"horizontal_flip\": true}");
      check_keys(a, {"crop_padding", "horizontal_flip"}, where);
      s.crop_padding = get<int64_t>(a, "crop_padding", 0, where);
      s.horizontal_flip = get<bool>(a, "horizontal_flip", false, where);
      if (s.crop_padding < 0) fail(where, ": crop_padding must be >= 0, got ", s.crop_padding);
      if (s.input_shape.size() != 3)
        fail(where, ": augmentation crops and flips images; input.shape ", shape_str(s.input_shape),
             " is not [channels, height, width]");
    }
  }
  // Every layer and shape checked now, not at training time, at the batch the file trains
  // with (a shape written for it is then checked as it will run).
  const BuiltGraph b = build_graph(s, s.batch_size);
  const Shape& y = b.graph.value(b.y).type.shape;
  s.label_shape.assign(y.begin() + 1, y.end());
  return s;
}

std::string read_text(const std::string& path, const char* what) {
  std::ifstream f(path);
  if (!f) fail(path, ": cannot open ", what);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

ModelSpec parse_model_json(const std::string& text, const std::string& source) {
  return spec_of(parse_json(text, source), source, std::filesystem::current_path());
}

ModelSpec parse_model_file(const std::string& path) {
  const std::string text = read_text(path, "model file");
  return spec_of(parse_json(text, path), path, std::filesystem::absolute(path).parent_path());
}

ModelSpec parse_onnx_training(const std::string& onnx_path, const std::string& config_path) {
  const std::string source = config_path.empty() ? onnx_path : config_path;
  json j = config_path.empty() ? json::object() : parse_json(read_text(config_path, "training config"), config_path);
  if (!j.is_object()) fail(source, ": a training config is a JSON object");
  for (const char* k : {"layers", "nodes", "output"})
    if (j.contains(k)) fail(source, ": '", k, "' describes a network; the network is ", onnx_path);
  json m = j.contains("model") ? j["model"] : json::object();
  if (!m.is_object()) fail(source, ": 'model' is an object of the import's settings (input, output, freeze)");
  if (m.contains("file") || (m.contains("type") && m["type"] != "onnx"))
    fail(source, ": model: the network is ", onnx_path, ", named on the command line; give only input, output, freeze");
  m["type"] = "onnx";
  m["file"] = std::filesystem::absolute(onnx_path).lexically_normal().string();
  j["model"] = m;
  if (!j.contains("name")) j["name"] = std::filesystem::path(onnx_path).stem().string();
  const auto base = config_path.empty() ? std::filesystem::current_path()
                                        : std::filesystem::absolute(config_path).parent_path();
  return spec_of(std::move(j), source, base);
}

ModelSpec load_model_spec(const std::string& path, const std::string& config_path) {
  if (path.ends_with(".onnx")) return parse_onnx_training(path, config_path);
  if (!config_path.empty())
    fail("--config ", config_path, ": a training config goes with an ONNX file; ", path,
         " is a model file, which holds its own settings");
  return parse_model_file(path);
}

void set_onnx_importer(NetworkImporter f) { g_onnx_importer = f; }

void load_initial(Model& model, const BuiltGraph& b) {
  for (const HostTensor& h : b.initial) {
    if (model.layout().param(h.name)) model.write_param(h.name, h.data);
    else model.write_state(h.name, h.data);
  }
}

namespace {

// The layers or nodes of the file on x; returns the output (the last, or "output").
Var network(const ModelSpec& s, Var x, BuiltGraph& b) {
  Graph& g = b.graph;
  const bool sequential = s.json.contains("layers");
  const json& layers = sequential ? s.json["layers"] : s.json["nodes"];
  std::map<std::string, Var> named{{"x", x}};
  Var prev = x;
  size_t sized = g.values().size();  // values before this are known to have a byte size
  static const std::vector<std::string> known_ops = forward_ops();
  for (size_t i = 0; i < layers.size(); ++i) {
    const json& L = layers[i];
    std::string where = s.source + ": layer " + std::to_string(i);
    if (!L.is_object() || !L.contains("op") || !L["op"].is_string()) fail(where, ": needs \"op\": \"<name>\"");
    std::string op = L["op"].get<std::string>();
    std::string name = get<std::string>(L, "name", "", where);
    if (!name.empty()) where += " ('" + name + "')";
    where += " " + op;
    if (name.empty()) name = op + std::to_string(i);
    if (named.count(name)) fail(where, ": the name '", name, "' is used twice");
    // Every key is checked before the operands, so a misspelt "inputs" is named as such.
    auto layer = kLayers.find(op);
    std::optional<Op> parsed;
    std::vector<std::string> allowed = kNodeKeys;
    if (layer != kLayers.end()) {
      allowed.insert(allowed.end(), layer->second.begin(), layer->second.end());
    } else {
      parsed = parse_op(op);
      if (!parsed || is_gradient_op(*parsed)) unknown(where.substr(0, where.rfind(' ')), "op", op, known_ops);
      for (auto& a : op_def(*parsed).attrs) allowed.push_back(a.name);
    }
    // Attributes the compiler owns: a value written here would be overwritten silently.
    if (L.contains("training"))
      fail(where, ": 'training' is set by the mode a program is compiled in (train or eval), not by the model file");
    if ((parsed == Op::dropout || parsed == Op::attention || parsed == Op::attention_qkv) && L.contains("stream"))
      fail(where, ": 'stream' (which random stream the mask draws from) is the node's place in the file, not a key");
    check_keys(L, allowed, where);
    // Operands: explicit "inputs" (or "input", the one-operand form), else the previous layer.
    if (L.contains("input") && L.contains("inputs")) fail(where, ": give \"input\" (one name) or \"inputs\" (a list), not both");
    auto operand = [&](const json& r, bool one) {
      if (!r.is_string()) fail(where, one ? ": 'input' must be a node name" : ": 'inputs' must be a list of node names");
      auto it = named.find(r.get<std::string>());
      if (it == named.end()) {
        std::vector<std::string> names;
        for (auto& [k, v] : named) names.push_back(k);
        unknown(where, "input", r.get<std::string>(), names);
      }
      return it->second;
    };
    std::vector<Var> ins;
    if (L.contains("input")) {
      ins.push_back(operand(L["input"], true));
    } else if (L.contains("inputs")) {
      for (auto& r : L["inputs"]) ins.push_back(operand(r, false));
    } else if (!sequential && i > 0) {
      fail(where, ": a node of a 'nodes' graph needs \"inputs\" (or \"input\" for one)");
    } else {
      ins.push_back(prev);
    }
    if (ins.empty()) fail(where, ": needs at least one input");
    // A layer's own precision (e.g. the last linear layer in f32 in a bf16 model).
    std::optional<Precision> layer_precision;
    if (L.contains("precision")) {
      const std::string p = get<std::string>(L, "precision", "", where);
      layer_precision = parse_precision(p);
      if (!layer_precision) unknown(where, "precision", p, precision_names());
    }
    Var out;
    try {
      auto scope = g.scope(name);
      if (layer != kLayers.end()) {
        if (ins.size() != 1) fail(where, ": takes one input");
        Var in = ins[0];
        if (op == "linear" && L.contains("tie")) {
          // The weight of an earlier layer ("tie": its name), e.g. an embedding's [V, C]
          // as a language model's output projection.
          const std::string tie = get<std::string>(L, "tie", "", where);
          const auto w = g.find(tie + ".weight");
          if (!w || g.value(*w).kind != ValueKind::param)
            fail(where, ": 'tie': no earlier layer '", tie, "' with a weight");
          const Var weight = g.var(*w);
          if (L.contains("out") && get<int64_t>(L, "out", 0, where) != weight.dim(0))
            fail(where, ": 'out' = ", get<int64_t>(L, "out", 0, where), " but the tied weight '", tie, ".weight' is ",
                 g.describe(*w));
          if (weight.rank() != 2 || weight.dim(1) != in.dim(-1))
            fail(where, ": the tied weight '", tie, ".weight' is ", g.describe(*w), ", this layer's input ",
                 g.describe(in.id()), " needs [out, ", in.dim(-1), "]");
          out = nn::linear_tied(in, weight, name, get<bool>(L, "bias", true, where));
        } else if (op == "linear") {
          if (!L.contains("out")) fail(where, ": 'out' (output features) is required");
          out = nn::linear(in, get<int64_t>(L, "out", 0, where), name, get<bool>(L, "bias", true, where));
        } else if (op == "conv2d") {
          if (!L.contains("out") || !L.contains("kernel")) fail(where, ": 'out' and 'kernel' are required");
          Conv2dOptions o;
          auto pair = [&](const char* k, std::vector<int64_t> def) {
            return L.contains(k) ? std::get<std::vector<int64_t>>(to_attr(L[k], def, where, k)) : def;
          };
          o.stride = pair("stride", {1, 1});
          o.padding = pair("padding", {0, 0});
          o.dilation = pair("dilation", {1, 1});
          o.groups = get<int64_t>(L, "groups", 1, where);
          auto k = pair("kernel", {1, 1});
          if (k[0] != k[1]) fail(where, ": only square kernels are supported by the conv2d layer");
          out = nn::conv2d(in, get<int64_t>(L, "out", 0, where), k[0], name, o, get<bool>(L, "bias", true, where));
        } else if (op == "batch_norm") {
          out = nn::batch_norm(in, name, get<double>(L, "momentum", 0.1, where), get<double>(L, "eps", 1e-5, where));
        } else if (op == "layer_norm") {
          out = nn::layer_norm(in, name, get<double>(L, "eps", 1e-5, where));
        } else if (op == "position_embedding") {
          if (!L.contains("num")) fail(where, ": 'num' (the positions it holds) is required");
          out = nn::position_embedding(in, get<int64_t>(L, "num", 0, where), name);
        } else {
          if (in.dtype() != DType::i32) fail(where, ": embedding ids must be i32");
          out = nn::embedding(in, get<int64_t>(L, "num", 0, where), get<int64_t>(L, "dim", 0, where), name);
        }
      } else {
        const OpDef& d = op_def(*parsed);
        Attrs attrs;
        for (auto& a : d.attrs)
          if (L.contains(a.name)) attrs.set(a.name, to_attr(L[a.name], a.def, where, a.name));
        if (*parsed == Op::dropout || *parsed == Op::attention || *parsed == Op::attention_qkv)
          attrs.set("stream", static_cast<int64_t>(i));
        std::vector<ValueId> ids;
        for (auto& v : ins) ids.push_back(v.id());
        out = g.add1(*parsed, ids, attrs);
      }
      if (layer_precision) {
        check_overrides(g, {{name, *layer_precision}});
        b.overrides.push_back({name, *layer_precision});
      }
    } catch (const Error& e) {
      std::string msg = e.what();
      if (msg.rfind(s.source, 0) == 0) throw;
      fail(where, ": ", msg);
    }
    // Sizes from "out", "num", "dim" or a reshape can multiply past 64 bits; name the layer
    // here rather than fail later in memory planning with no place to point at.
    for (; sized < g.values().size(); ++sized) {
      const Value& v = g.values()[sized];
      if (!v.type.checked_bytes()) fail(where, ": '", v.name, "' would be ", v.type.str(), ", more bytes than fit in 64 bits");
    }
    named[name] = out;
    b.layer_names.push_back(name);
    prev = out;
  }
  Var logits = prev;
  if (s.json.contains("output")) {
    std::string o = get<std::string>(s.json, "output", "", s.source);
    auto it = named.find(o);
    if (it == named.end()) {
      std::vector<std::string> names;
      for (auto& [k, v] : named) names.push_back(k);
      unknown(s.source, "output", o, names);
    }
    logits = it->second;
  }
  return logits;
}

Var gpt_logits(const ModelSpec& s, Var x) {
  try {
    return nn::gpt(x, *s.gpt);
  } catch (const Error& e) {
    fail(s.source, ": model: ", e.what());
  }
}

// Labels, loss, predictions and the training metrics on the network's output.
void finish(const ModelSpec& s, int64_t batch, Var logits, BuiltGraph& b) {
  Graph& g = b.graph;
  const Shape ls = logits.shape();
  if (ls.size() < 2 || ls[0] != batch || ls.back() != s.classes)
    fail(s.source, ": the network's output is ", logits.type().str(), " but must be [batch, ..., classes] = [", batch,
         ", ..., ", s.classes, "]");
  Var y = g.input("y", Shape(ls.begin(), ls.end() - 1), DType::i32);
  b.y = y.id();
  b.logits = logits.id();
  b.loss = cross_entropy(logits, y, -100, s.label_smoothing).id();
  b.prediction = argmax(logits).id();
  Var loss = g.var(b.loss), pred = g.var(b.prediction);
  accumulate(g.state(kTrainMetrics, {2}, Init::zeros()), {loss, count_equal(pred, y)});
}

}  // namespace

RandomBatch random_batch(const TensorType& x, const TensorType& y, int64_t classes, std::mt19937_64& rng) {
  RandomBatch b;
  std::normal_distribution<float> normal(0, 1);
  auto label = [&] { return static_cast<int32_t>(rng() % static_cast<uint64_t>(classes)); };
  if (x.dtype == DType::i32) {
    b.ids.resize(static_cast<size_t>(x.numel()));
    for (int32_t& v : b.ids) v = label();
  } else {
    b.x.resize(static_cast<size_t>(x.numel()));
    for (float& v : b.x) v = normal(rng);
  }
  b.y.resize(static_cast<size_t>(y.numel()));
  for (int32_t& v : b.y) v = label();
  return b;
}

std::vector<std::byte> RandomBatch::x_bytes() const {
  const auto bytes = ids.empty() ? std::as_bytes(std::span(x)) : std::as_bytes(std::span(ids));
  return {bytes.begin(), bytes.end()};
}

BuiltGraph build_graph(const ModelSpec& s, int64_t batch) {
  BuiltGraph b;
  if (s.onnx) {
    ImportedNetwork n = import_network(s, s.input_shape, batch);
    b.graph = std::move(n.graph);
    b.x = n.x;
    b.initial = std::move(n.initial);
    finish(s, batch, b.graph.var(n.logits), b);
    return b;
  }
  Graph& g = b.graph;
  Shape xs{batch};
  xs.insert(xs.end(), s.input_shape.begin(), s.input_shape.end());
  if (!TensorType{s.input_dtype, xs}.checked_bytes())
    fail(s.source, ": input.shape ", shape_str(s.input_shape), " at batch ", batch, " is ", shape_str(xs),
         ", more bytes than fit in 64 bits");
  Var x = g.input("x", xs, s.input_dtype);
  b.x = x.id();
  Var logits = s.gpt ? gpt_logits(s, x) : network(s, x, b);
  finish(s, batch, logits, b);
  return b;
}

}  // namespace seam::io
