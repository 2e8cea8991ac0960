// Convolutions through cuDNN's graph API (conv_engine.h).
#include "backend/cuda/conv_engine.h"

#include <cudnn_frontend.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cudnn_util.h"
#include "common/file.h"

namespace seam::cuda {

namespace fe = cudnn_frontend;

namespace {

constexpr int64_t kX = 1, kW = 2, kY = 3, kB = 4, kR = 5, kScale = 6, kShift = 7, kZ = 8;  // tensor uids by role
constexpr size_t kMaxTrialWorkspace = size_t{1} << 30;
constexpr const char* kPassName[] = {"forward", "data gradient", "filter gradient"};

fe::DataType_t fe_type(DType t) {
  switch (t) {
    case DType::bf16: return fe::DataType_t::BFLOAT16;
    case DType::f16: return fe::DataType_t::HALF;
    default: return fe::DataType_t::FLOAT;
  }
}

std::vector<int64_t> dims(const int64_t (&d)[4]) { return {d[0], d[1], d[2], d[3]}; }

// Strides of logical [N, C, H, W] dims stored NCHW, or channels-last (NHWC; KRSC for a
// filter, the same formula).
std::vector<int64_t> strides(const int64_t (&d)[4], bool nhwc) {
  if (nhwc) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

std::shared_ptr<fe::graph::Graph> make_graph(const EngineConv& c) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_type(c.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, const int64_t (&d)[4], int64_t uid) {
    return g->tensor(
        fe::graph::Tensor_attributes().set_name(name).set_dim(dims(d)).set_stride(strides(d, c.nhwc)).set_uid(uid));
  };
  auto pointwise = [&](std::shared_ptr<fe::graph::Tensor_attributes> in, fe::PointwiseMode_t mode,
                       std::shared_ptr<fe::graph::Tensor_attributes> other = nullptr) {
    auto attrs = fe::graph::Pointwise_attributes().set_mode(mode).set_compute_data_type(fe::DataType_t::FLOAT);
    return other ? g->pointwise(in, other, attrs) : g->pointwise(in, attrs);
  };
  const int64_t per_channel[4] = {1, c.y[1], 1, 1};
  const std::vector<int64_t> pad{c.pad[0], c.pad[1]}, stride{c.stride[0], c.stride[1]}, dil{c.dil[0], c.dil[1]};
  std::shared_ptr<fe::graph::Tensor_attributes> out;
  int64_t out_uid = kY;
  const int64_t(*out_dims)[4] = &c.y;
  switch (c.pass) {
    case 0: {
      out = g->conv_fprop(tensor("x", c.x, kX), tensor("w", c.w, kW),
                          fe::graph::Conv_fprop_attributes().set_padding(pad).set_stride(stride).set_dilation(dil));
      if (c.bias) out = pointwise(out, fe::PointwiseMode_t::ADD, tensor("b", per_channel, kB));
      if (c.affine) {
        auto scale = tensor("scale", per_channel, kScale), shift = tensor("shift", per_channel, kShift);
        scale->set_data_type(fe::DataType_t::FLOAT);
        shift->set_data_type(fe::DataType_t::FLOAT);
        out = pointwise(pointwise(out, fe::PointwiseMode_t::MUL, scale), fe::PointwiseMode_t::ADD, shift);
      }
      if (c.residual) out = pointwise(out, fe::PointwiseMode_t::ADD, tensor("z", c.y, kZ));
      if (c.relu) out = pointwise(out, fe::PointwiseMode_t::RELU_FWD);
      break;
    }
    case 1:
      out = g->conv_dgrad(tensor("dy", c.y, kY), tensor("w", c.w, kW),
                          fe::graph::Conv_dgrad_attributes().set_padding(pad).set_stride(stride).set_dilation(dil));
      if (c.relu || c.residual)  // a dgrad infers no dims of its own for what follows
        out->set_dim(dims(c.x)).set_stride(strides(c.x, c.nhwc));
      // RELU_BWD: IN_0 the gradient, IN_1 the value whose sign masks it.
      if (c.relu) out = pointwise(out, fe::PointwiseMode_t::RELU_BWD, tensor("r", c.x, kR));
      if (c.residual) out = pointwise(out, fe::PointwiseMode_t::ADD, tensor("z", c.x, kZ));
      out_uid = kX;
      out_dims = &c.x;
      break;
    default:
      out = g->conv_wgrad(tensor("dy", c.y, kY), tensor("x", c.x, kX),
                          fe::graph::Conv_wgrad_attributes().set_padding(pad).set_stride(stride).set_dilation(dil));
      out_uid = kW;
      out_dims = &c.w;
      break;
  }
  out->set_output(true)
      .set_dim(dims(*out_dims))
      .set_stride(strides(*out_dims, c.nhwc))
      .set_uid(out_uid)
      .set_data_type(fe_type(c.out_dtype));
  return g;
}

// An engine configuration as cuDNN rebuilds it: global engine id and knob choices.
struct EngineChoice {
  int64_t engine = -1;
  std::vector<std::pair<int64_t, int64_t>> knobs;  // (KnobType_t, value), sorted
  float ms = -1;  // as timed when chosen

  std::string str() const {
    std::ostringstream s;
    s << "engine=" << engine << " knobs=";
    for (size_t i = 0; i < knobs.size(); ++i) s << (i ? "," : "") << knobs[i].first << ':' << knobs[i].second;
    if (knobs.empty()) s << '-';
    s << " us=" << ms * 1e3f;
    return s.str();
  }
  static std::optional<EngineChoice> parse(const std::string& text) {
    EngineChoice c;
    std::istringstream in(text);
    std::string e, k, us, rest;
    if (!(in >> e >> k >> us) || (in >> rest) || e.rfind("engine=", 0) != 0 || k.rfind("knobs=", 0) != 0 ||
        us.rfind("us=", 0) != 0)
      return std::nullopt;
    char* end = nullptr;
    c.ms = std::strtof(us.c_str() + 3, &end) * 1e-3f;
    if (*end || !(c.ms > 0)) return std::nullopt;
    c.engine = std::strtoll(e.c_str() + 7, &end, 10);
    if (*end || c.engine < 0) return std::nullopt;
    const std::string list = k.substr(6);
    if (list == "-") return c;
    std::istringstream items(list);
    std::string item;
    while (std::getline(items, item, ',')) {
      const size_t colon = item.find(':');
      if (colon == std::string::npos) return std::nullopt;
      char* e1 = nullptr;
      char* e2 = nullptr;
      const long long type = std::strtoll(item.c_str(), &e1, 10);
      const long long value = std::strtoll(item.c_str() + colon + 1, &e2, 10);
      if (e1 != item.c_str() + colon || *e2 || type < 0) return std::nullopt;
      c.knobs.emplace_back(type, value);
    }
    return c;
  }
};

// The engines chosen so far, per device, read from and saved to the cache folder.
class EngineCache {
 public:
  static EngineCache& instance() {
    static EngineCache* c = new EngineCache;  // never destroyed: prepared plans may outlive statics
    return *c;
  }
  std::optional<EngineChoice> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    Store& s = store();
    auto it = s.entries.find(key);
    if (it == s.entries.end()) return std::nullopt;
    return it->second;
  }
  void remember(const std::string& key, const EngineChoice& c) {
    std::lock_guard<std::mutex> lock(mu_);
    Store& s = store();
    s.entries[key] = c;
    if (s.path.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(s.path.parent_path(), ec);
    load(s);  // keep what another process saved meanwhile
    std::string text = s.header + '\n';
    for (auto& [k, v] : s.entries) text += k + " " + v.str() + '\n';
    try {
      write_file_atomically(s.path.string(), std::as_bytes(std::span(text)));
    } catch (const Error& e) {
      if (!warned_) std::fprintf(stderr, "seam: the cuDNN engine cache is not saved (%s)\n", e.what());
      warned_ = true;
    }
  }

 private:
  struct Store {
    std::string header;
    std::filesystem::path path;
    std::map<std::string, EngineChoice> entries;
  };
  Store& store() {
    int dev = 0;
    SEAM_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    if (!names_.count(dev)) {
      SEAM_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
      names_[dev] = cache_name_part(prop.name);
    }
    const std::string ver = std::to_string(cudnnGetVersion());
    const std::string root = cache_root();
    const std::filesystem::path path =
        root.empty() ? std::filesystem::path() : std::filesystem::path(root) / ("cudnn-conv-engines-" + names_[dev] + "-cudnn" + ver + ".txt");
    const std::string id = std::to_string(dev) + " " + path.string();
    auto it = stores_.find(id);
    if (it != stores_.end()) return it->second;
    Store s;
    s.header = "# seam cudnn conv engines v2 gpu=" + names_[dev] + " cudnn=" + ver;
    s.path = path;
    load(s);
    return stores_.emplace(id, std::move(s)).first->second;
  }
  // Lines "<key> engine=E knobs=T:V,...": a wrong header or a bad line costs a re-tune.
  static void load(Store& s) {
    if (s.path.empty()) return;
    std::ifstream in(s.path);
    std::string line;
    if (!in || !std::getline(in, line) || line != s.header) return;
    while (std::getline(in, line)) {
      const size_t at = line.rfind(" engine=");
      if (at == std::string::npos) continue;
      if (auto c = EngineChoice::parse(line.substr(at + 1))) s.entries.emplace(line.substr(0, at), *c);
    }
  }
  std::mutex mu_;
  std::map<std::string, Store> stores_;
  std::map<int, std::string> names_;
  bool warned_ = false;
};

// The heuristics' modes whose candidates the tuner times: A and FALLBACK, or the list in
// SEAM_CUDNN_HEURISTICS (comma-separated a, b, fallback), to see what another mode offers.
std::vector<fe::HeurMode_t> heuristic_modes() {
  std::vector<fe::HeurMode_t> modes;
  const char* env = std::getenv("SEAM_CUDNN_HEURISTICS");
  if (!env || !*env) return {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK};
  std::string list = env;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string m = list.substr(at, comma - at);
    if (m == "a") modes.push_back(fe::HeurMode_t::A);
    else if (m == "b") modes.push_back(fe::HeurMode_t::B);
    else if (m == "fallback") modes.push_back(fe::HeurMode_t::FALLBACK);
    else fail("SEAM_CUDNN_HEURISTICS: '", m, "' is none of a, b, fallback");
    at = comma + 1;
  }
  return modes;
}

// A graph with its plans built: from the heuristics (every candidate), or the cached one.
struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  std::string error;
};

Built build(cudnnHandle_t h, const EngineConv& c, const EngineChoice* cached, bool allow_runtime_compiled) {
  Built b{make_graph(c), {}};
  fe::graph::Graph& g = *b.graph;
  auto ok = [&](fe::error_t e, const char* what) {
    if (e.is_good()) return true;
    b.error = std::string(what) + ": " + e.get_message();
    return false;
  };
  if (!ok(g.validate(), "validate") || !ok(g.build_operation_graph(h), "operation graph")) return b;
  if (cached) {
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
    for (auto [type, value] : cached->knobs) knobs[static_cast<fe::KnobType_t>(type)] = value;
    if (!ok(g.create_execution_plan(cached->engine, knobs), "cached engine")) return b;
  } else if (!ok(g.create_execution_plans(heuristic_modes()), "heuristics")) {
    return b;
  }
  std::vector<fe::NumericalNote_t> barred = {fe::NumericalNote_t::NONDETERMINISTIC,
                                             fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION};
  if (c.dtype == DType::f32 && !c.tensor_math) {
    barred.push_back(fe::NumericalNote_t::TENSOR_CORE);
    barred.push_back(fe::NumericalNote_t::DOWN_CONVERT_INPUTS);
  }
  g.deselect_numeric_notes(barred);
  if (!allow_runtime_compiled) g.deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
  if (!ok(g.check_support(), "support") || !ok(g.build_plans(fe::BuildPlanPolicy_t::ALL), "build")) return b;
  return b;
}

// Milliseconds per run of plan i inside a CUDA graph, or -1 if it fails to run or to be
// captured (then it could not run in the step's graph either).
float time_plan(cudnnHandle_t h, fe::graph::Graph& g, std::unordered_map<int64_t, void*>& pack, void* ws, int64_t i,
                cudaStream_t stream) {
  try {
    return time_in_graph([&](cudaStream_t) { return g.execute_plan_at_index(h, pack, ws, i).is_good(); }, stream);
  } catch (const Error&) {
    (void)cudaGetLastError();
    return -1.0f;
  }
}

struct Prepared {
  std::shared_ptr<fe::graph::Graph> graph;
  std::unordered_map<int64_t, void*> pack;
};

}  // namespace

bool engine_conv_enabled() {
  const char* v = std::getenv("SEAM_CUDNN_CONV");
  return !(v && std::string(v) == "classic");
}

std::optional<Launch> prepare_engine_conv(const StepArgs& a, const EngineConv& c, const EngineBuffers& buf,
                                          std::string* why, float* ms) {
  cudnnHandle_t h = cudnn_of(a.ctx);
  cudaStream_t stream = a.ctx.stream;
  SEAM_CUDNN_CHECK(cudnnSetStream(h, stream));
  auto shared = std::make_shared<Prepared>();
  shared->pack = {{kX, buf.x}, {kW, buf.w}, {kY, buf.y}};
  if (c.bias) shared->pack[kB] = buf.b;
  if (c.relu && c.pass == 1) shared->pack[kR] = buf.r;
  if (c.affine) {
    shared->pack[kScale] = buf.scale;
    shared->pack[kShift] = buf.shift;
  }
  if (c.residual) shared->pack[kZ] = buf.z;
  EngineCache& cache = EngineCache::instance();
  // Deterministic: the first engine that runs in the heuristics' order, never a timed pick.
  const bool fixed = a.ctx.deterministic;
  const std::optional<EngineChoice> cached = fixed ? std::nullopt : cache.find(c.key);

  int64_t index = -1, candidates = 0;
  float best_ms = -1, first_ms = -1;
  std::string how;
  const bool fused = c.affine || c.residual || c.relu;
  if (cached) {
    // A cached engine is run once on the step's buffers before it is trusted: one rebuilt
    // from its id and knobs has built and then failed to execute (a W5 weight gradient on
    // the H200, "transformInput ... CUDNN_STATUS_EXECUTION_FAILED"); then it is tuned anew.
    Built b = build(h, c, &*cached, !fused);
    int64_t ws = 0;
    if (b.error.empty() && b.graph->get_workspace_size_plan_at_index(0, ws).is_good()) {
      a.ctx.need_workspace(static_cast<size_t>(ws));
      SEAM_CUDA_CHECK(cudaStreamSynchronize(stream));  // the step's inputs were written on this stream
      if (time_plan(h, *b.graph, shared->pack, ws ? a.ctx.workspace() : nullptr, 0, stream) >= 0) {
        shared->graph = b.graph;
        index = 0;
        best_ms = cached->ms;
        how = "cached";
      }
    }
  }
  if (index < 0) {
    // Precompiled engines first: runtime-compiled ones build for seconds and are rarely
    // faster for a plain convolution; they are the fallback where nothing else runs. Not
    // for a fused epilogue, whose caller has kernels of its own for it: compiling a fused
    // graph at run time took seconds a shape, every time a process prepares it. But for
    // the data gradient with z: cuDNN 9.14 precompiles none, and its runtime-compiled
    // ones beat the plain data gradient alone (docs/architecture/fusion.md).
    Built b = build(h, c, nullptr, false);
    if (!b.error.empty() && (!fused || (c.pass == 1 && c.residual))) b = build(h, c, nullptr, true);
    if (!b.error.empty()) {
      *why = b.error;
      return std::nullopt;
    }
    fe::graph::Graph& g = *b.graph;
    candidates = g.get_execution_plan_count();
    int64_t most = 0;
    std::vector<int64_t> built;
    for (int64_t i = 0; i < candidates; ++i) {
      int64_t ws = 0;
      if (!g.get_workspace_size_plan_at_index(i, ws).is_good() || ws > static_cast<int64_t>(kMaxTrialWorkspace))
        continue;
      built.push_back(i);
      most = std::max(most, ws);
    }
    void* trial_ws = nullptr;
    if (most > 0) SEAM_CUDA_CHECK(cudaMalloc(&trial_ws, static_cast<size_t>(most)));
    SEAM_CUDA_CHECK(cudaStreamSynchronize(stream));  // the step's inputs were written on this stream
    for (int64_t i : built) {
      const float ms = time_plan(h, g, shared->pack, trial_ws, i, stream);
      if (i == built.front()) first_ms = ms;
      if (ms >= 0 && (best_ms < 0 || ms < best_ms)) {
        best_ms = ms;
        index = i;
        if (fixed) break;
      }
    }
    SEAM_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (trial_ws) SEAM_CUDA_CHECK(cudaFree(trial_ws));
    if (index < 0) {
      *why = "none of " + std::to_string(candidates) + " engine configurations ran";
      return std::nullopt;
    }
    EngineChoice choice;
    choice.ms = best_ms;
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
    if (!fixed && g.get_engine_and_knobs_at_index(index, choice.engine, knobs).is_good()) {
      for (auto [type, value] : knobs) choice.knobs.emplace_back(static_cast<int64_t>(type), value);
      std::sort(choice.knobs.begin(), choice.knobs.end());
      cache.remember(c.key, choice);
    }
    int64_t ws = 0;
    (void)g.get_workspace_size_plan_at_index(index, ws);  // a timed plan is a built one
    a.ctx.need_workspace(static_cast<size_t>(ws));
    shared->graph = b.graph;
    char line[160];
    if (fixed)
      std::snprintf(line, sizeof line, "%.1f us in a graph, the first that runs of %lld built (deterministic)",
                    best_ms * 1e3, static_cast<long long>(built.size()));
    else
      std::snprintf(line, sizeof line, "%.1f us in a graph, fastest of %lld built (heuristics' first %.1f us)",
                    best_ms * 1e3, static_cast<long long>(built.size()), first_ms * 1e3);
    how = line;
  }
  std::string name;
  (void)shared->graph->get_plan_name_at_index(index, name);
  int64_t ws_bytes = 0;
  (void)shared->graph->get_workspace_size_plan_at_index(index, ws_bytes);
  a.ctx.choices.emplace_back(a.index, std::string(op_name(a.step.op)) + (c.nhwc ? " nhwc" : " nchw") +
                                          ": cuDNN graph API " + name + (c.bias ? " with the bias" : "") +
                                          (c.affine ? " with the batch norm" : "") +
                                          (c.residual ? " with the residual" : "") + (c.relu ? " with relu" : "") +
                                          ", " + how +
                                          ", workspace " + std::to_string(ws_bytes) + " bytes");
  if (ms) *ms = best_ms;
  Context* ctx = &a.ctx;
  const std::string what = std::string(op_name(a.step.op)) + " '" + a.step.name + "' (" + kPassName[c.pass] + ")";
  return Launch([shared, h, ctx, index, ws_bytes, what](cudaStream_t st) {
    SEAM_CUDNN_CHECK(cudnnSetStream(h, st));
    fe::error_t e =
        shared->graph->execute_plan_at_index(h, shared->pack, ws_bytes ? ctx->workspace() : nullptr, index);
    if (e.is_bad()) fail(what, ": cuDNN graph execution failed: ", e.get_message());
  });
}

}  // namespace seam::cuda
