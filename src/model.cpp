// Model: storage of parameters, gradients, optimizer moments and running statistics;
// compile() runs the pipeline graph -> mode -> autodiff -> lower -> plan -> executable.
#include "seam/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "autodiff/autodiff.h"
#include "backend/backend.h"
#include "backend/cpu/parallel.h"
#include "common/half.h"
#include "common/philox.h"
#include "dist/comm.h"
#include "ops/registry.h"
#include "passes/fuse.h"
#include "ops/layout.h"
#include "passes/layout.h"
#include "passes/precision.h"
#include "passes/passes.h"
#include "model_core.h"
#include "plan/lower.h"

namespace seam {

const char* device_name(Device d) { return d == Device::cuda ? "cuda" : "cpu"; }

namespace {
constexpr Precision kPrecisions[] = {Precision::f32, Precision::tf32, Precision::bf16, Precision::f16};
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::f32: return "f32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
    case Precision::f16: return "f16";
  }
  SEAM_ASSERT(false);
}

std::optional<DType> low_dtype(Precision p) {
  if (p == Precision::bf16) return DType::bf16;
  if (p == Precision::f16) return DType::f16;
  return std::nullopt;
}

std::optional<Precision> parse_precision(std::string_view name) {
  for (Precision p : kPrecisions)
    if (name == precision_name(p)) return p;
  return std::nullopt;
}

const char* layout_policy_name(LayoutPolicy p) {
  switch (p) {
    case LayoutPolicy::automatic: return "auto";
    case LayoutPolicy::nchw: return "nchw";
    case LayoutPolicy::nhwc: return "nhwc";
  }
  return "?";
}

std::optional<LayoutPolicy> parse_layout_policy(std::string_view name) {
  for (LayoutPolicy p : {LayoutPolicy::automatic, LayoutPolicy::nchw, LayoutPolicy::nhwc})
    if (name == layout_policy_name(p)) return p;
  return std::nullopt;
}

const char* epilogue_policy_name(EpiloguePolicy p) {
  switch (p) {
    case EpiloguePolicy::fastest: return "fastest";
    case EpiloguePolicy::fused: return "fused";
    case EpiloguePolicy::split: return "split";
    case EpiloguePolicy::split_t: return "split_t";
  }
  return "?";
}

constexpr EpiloguePolicy kEpiloguePolicies[] = {EpiloguePolicy::fastest, EpiloguePolicy::fused,
                                                EpiloguePolicy::split, EpiloguePolicy::split_t};

std::optional<EpiloguePolicy> parse_epilogue_policy(std::string_view name) {
  for (EpiloguePolicy p : kEpiloguePolicies)
    if (name == epilogue_policy_name(p)) return p;
  return std::nullopt;
}

std::vector<std::string> epilogue_policy_names() {
  std::vector<std::string> names;
  for (EpiloguePolicy p : kEpiloguePolicies) names.emplace_back(epilogue_policy_name(p));
  return names;
}

std::vector<std::string> layout_policy_names() {
  std::vector<std::string> names;
  for (LayoutPolicy p : {LayoutPolicy::automatic, LayoutPolicy::nchw, LayoutPolicy::nhwc})
    names.emplace_back(layout_policy_name(p));
  return names;
}

std::vector<std::string> precision_names() {
  std::vector<std::string> names;
  for (Precision p : kPrecisions) names.emplace_back(precision_name(p));
  return names;
}

Device default_device() { return cuda_available() ? Device::cuda : Device::cpu; }

namespace {

constexpr int kOptSlots = 2;  // the most any optimizer keeps per parameter
// The most chunks a memory budget splits the output layer into: each doubling halves the
// logits and adds passes over the weight's gradient (f32, read and written once more).
constexpr int kBudgetChunks = 4;
constexpr size_t kCounterBytes = 64;  // Regions::counters, whatever the backend keeps there

// Host values of an initializer; element j of tensor `index` is drawn from Philox with
// counter (j/4, index, domain tag), so each tensor is independent of every other. Each
// value depends on j alone, so the cores share the work (a normal draw's log, sqrt and
// cos made GPT-2 124M's 124M values 5 s of one core, paid by every Model built).
std::vector<double> init_values(const Init& init, int64_t n, uint64_t seed, uint32_t index) {
  std::vector<double> v(static_cast<size_t>(n));
  auto uniform = [&](int64_t j) {
    uint64_t block = static_cast<uint64_t>(j) >> 2;
    Philox4 r = philox4x32({{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), index, 0x1A17u}},
                           static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    return (static_cast<double>(r.v[j & 3]) + 0.5) / 4294967296.0;  // (0, 1)
  };
  auto fill = [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      switch (init.kind) {
        case Init::Kind::zeros: v[static_cast<size_t>(j)] = 0; break;
        case Init::Kind::ones: v[static_cast<size_t>(j)] = 1; break;
        case Init::Kind::constant: v[static_cast<size_t>(j)] = init.a; break;
        case Init::Kind::uniform: v[static_cast<size_t>(j)] = init.a + (init.b - init.a) * uniform(j); break;
        case Init::Kind::normal: {
          // Box-Muller on the pair (2j, 2j+1) of the stream.
          double u1 = uniform(2 * j), u2 = uniform(2 * j + 1);
          v[static_cast<size_t>(j)] = init.a + init.b * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
          break;
        }
      }
    }
  };
  cpu::parallel_for(n, int64_t{1} << 16, fill);
  return v;
}

const Slot& find_slot(const std::vector<Slot>& slots, const std::string& name, const char* what) {
  for (auto& s : slots)
    if (s.name == name) return s;
  std::string known;
  for (auto& s : slots) known += (known.empty() ? "" : ", ") + s.name;
  fail("no ", what, " named '", name, "' (the model has: ", known.empty() ? "none" : known, ")");
}

}  // namespace

std::vector<std::byte> encode(const std::vector<double>& v, DType t) {
  std::vector<std::byte> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    std::byte* p = out.data() + i * dtype_size(t);
    switch (t) {
      case DType::f32: { float f = static_cast<float>(v[i]); std::memcpy(p, &f, 4); break; }
      case DType::f64: std::memcpy(p, &v[i], 8); break;
      case DType::bf16: { uint16_t h = float_to_bf16(static_cast<float>(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::f16: { uint16_t h = float_to_f16(static_cast<float>(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::i32: { auto x = static_cast<int32_t>(v[i]); std::memcpy(p, &x, 4); break; }
      case DType::u8: { auto x = static_cast<uint8_t>(v[i]); std::memcpy(p, &x, 1); break; }
    }
  }
  return out;
}

std::vector<std::byte> reordered(const TensorType& stored, std::span<const std::byte> data, DType element,
                                 bool to_user) {
  std::vector<std::byte> out(data.begin(), data.end());
  if (stored.layout == DataLayout::nhwc) reorder_nhwc(data.data(), out.data(), stored.shape, dtype_size(element), to_user);
  return out;
}

Model::Model(Graph graph, ModelOptions options) : core_(std::make_shared<Core>()) {
  // Checked on every device, so that a bad option fails where it is written.
  if (options.cuda_streams < 1 || options.cuda_streams > 16)
    fail("ModelOptions::cuda_streams must be in [1, 16], got ", options.cuda_streams);
  Core& c = *core_;
  c.graph = std::move(graph);
  c.device = options.device;
  c.reuse_gap = options.device == Device::cuda && options.cuda_streams > 1 ? 1 : 0;
  c.graph.verify();
  check_overrides(c.graph, options.precision_overrides);
  c.precision = options.precision;
  c.overrides = options.precision_overrides;
  if (!options.master_weights) {
    c.stored = low_dtype(options.precision);
    if (!c.stored)
      fail("ModelOptions::master_weights = false stores the parameters in 16 bits: it needs precision bf16 or f16, got ",
           precision_name(options.precision));
  }
  // The parameters as the compiled graphs declare them: filters channels-last under nhwc
  // (the same bytes, so the offsets stand). The layouts are chosen on the graph as compile
  // has it before its layout pass.
  const Graph declared = c.stored ? params_in(c.graph, *c.stored).graph : c.graph;
  const Graph precise = low_dtype(c.precision) || !c.overrides.empty()
                            ? apply_precision(declared, c.precision, c.overrides).graph
                            : declared;
  c.layout_regions = choose_layouts(precise, options.layout, layout_costs(c.device, options.precision));
  c.nhwc_convs = nhwc_convs(c.layout_regions);
  c.layout = make_layout(declared);
  if (!c.nhwc_convs.empty())
    for (const std::string& name : channels_last_params(precise, c.nhwc_convs))
      for (Slot& s : c.layout.params)
        if (s.name == name) s.type = {s.type.dtype, nhwc_order(s.type.shape), DataLayout::nhwc};
  c.state.seed = options.seed;
  c.comm = options.comm;
  c.bucket_bytes = options.grad_bucket_bytes;
  if (options.zero != 0 && options.zero != 1) fail("ModelOptions::zero must be 0 or 1, got ", options.zero);
  c.backend = c.device == Device::cuda
                  ? make_cuda_backend({options.precision == Precision::tf32, options.cuda_graph, options.epilogue,
                                       options.cuda_streams, options.deterministic})
                  : make_cpu_backend();
  const size_t values = c.layout.param_bytes / dtype_size(c.layout.param_dtype);
  c.zero = options.zero == 1 && c.comm;
  std::tie(c.shard_lo, c.shard_hi) =
      c.zero ? zero_shard(values, c.comm->rank(), c.comm->size()) : std::pair<size_t, size_t>{0, values};
  if (c.zero && c.device == Device::cpu && c.stored)
    fail("ZeRO-1 on the CPU shards f32 or f64 parameters; 16-bit ones (ModelOptions::master_weights false) need the "
         "GPU");
  c.init_seed = options.seed;
}

Model::~Model() = default;

const Graph& Model::graph() const { return core_->graph; }
const Layout& Model::layout() const { return core_->layout; }
std::vector<std::string> Model::layout_choices() const {
  std::vector<std::string> out;
  for (const LayoutRegion& r : core_->layout_regions) out.push_back(r.str());
  return out;
}
StepState& Model::state() { return core_->state; }
Device Model::device() const { return core_->device; }

void Model::Core::allocate() {
  if (params) return;
  // All four or none: a failed allocation leaves the model as it was, to be tried again.
  std::byte* made[4] = {};
  const size_t bytes[4] = {layout.param_bytes, layout.param_bytes, layout.state_bytes, kCounterBytes};
  try {
    for (int i = 0; i < 4; ++i) made[i] = backend->alloc(bytes[i]);
  } catch (...) {
    for (std::byte* p : made)
      if (p) backend->release(p);
    throw;
  }
  params = made[0];
  grads = made[1];
  state_buf = made[2];
  counters = made[3];
}

void Model::Core::draw(uint64_t seed) {
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const Slot& s = layout.params[i];
    // Seeded by position in the graph, not in the layout, so that the decay order
    // does not change the values.
    auto index = static_cast<uint32_t>(*graph.find(s.name));
    auto bytes = encode(init_values(s.init, s.type.numel(), seed, index), s.type.dtype);
    bytes = reordered(s.type, bytes, s.type.dtype, false);  // drawn in NCHW order, whatever the storage
    backend->upload(params + s.offset, bytes.data(), bytes.size());
  }
  for (const Slot& s : layout.states) {
    auto index = static_cast<uint32_t>(*graph.find(s.name));
    auto bytes = encode(init_values(s.init, s.type.numel(), seed, index), s.type.dtype);
    backend->upload(state_buf + s.offset, bytes.data(), bytes.size());
  }
}

// On first use (a program compiled, a tensor read or written): planning alone needs no
// buffers, and drawing GPT-2 124M's values took 12 of `seam plan`'s 15 s on two cores.
Model::Core& Model::Core::with_values() {
  if (!drawn) {
    allocate();
    draw(init_seed);
    drawn = true;
  }
  return *this;
}

void Model::reset() {
  Core& c = *core_;
  c.allocate();
  c.draw(c.state.seed);
  c.drawn = true;
  if (c.opt) c.backend->fill_zero(c.opt, c.opt_slots * c.moment_bytes());
  c.working_valid = false;
  c.state.step = 0;
  c.state.loss_scale = 0;
  c.state.scale_good = c.state.skipped_steps = c.state.skip_streak = 0;
}

size_t Model::device_bytes() const {
  const Core& c = *core_;
  size_t n = 2 * c.layout.param_bytes + c.layout.state_bytes + kCounterBytes;
  n += c.opt_slots * c.moment_bytes();
  if (c.working) n += c.layout.param_bytes / 2;
  return n;
}

std::vector<std::byte> Model::read_param(const std::string& name) const {
  const Slot& s = find_slot(core_->layout.params, name, "parameter");
  core_->with_values();
  std::vector<std::byte> out(s.type.bytes());
  core_->backend->download(out.data(), core_->params + s.offset, out.size());
  return reordered(s.type, out, s.type.dtype, true);
}

void Model::write_param(const std::string& name, std::span<const std::byte> data) {
  const Slot& s = find_slot(core_->layout.params, name, "parameter");
  if (data.size() != s.type.bytes())
    fail("parameter '", name, "' is ", s.user_type().str(), " (", s.type.bytes(), " bytes), got ", data.size(),
         " bytes");
  const auto stored = reordered(s.type, data, s.type.dtype, false);
  core_->with_values();
  core_->backend->upload(core_->params + s.offset, stored.data(), stored.size());
  core_->working_valid = false;
}

std::vector<std::byte> Model::read_state(const std::string& name) const {
  const Slot& s = find_slot(core_->layout.states, name, "state tensor");
  std::vector<std::byte> out(s.type.bytes());
  core_->with_values();
  core_->backend->download(out.data(), core_->state_buf + s.offset, out.size());
  return out;
}

void Model::write_state(const std::string& name, std::span<const std::byte> data) {
  const Slot& s = find_slot(core_->layout.states, name, "state tensor");
  if (data.size() != s.type.bytes())
    fail("state '", name, "' is ", s.type.str(), " (", s.type.bytes(), " bytes), got ", data.size(), " bytes");
  core_->with_values();
  core_->backend->upload(core_->state_buf + s.offset, data.data(), data.size());
}

namespace {
const char* const kMomentNames[kOptSlots] = {"optimizer.m/", "optimizer.v/"};

}  // namespace

std::vector<HostTensor> Model::save_tensors() const {
  const Core& c = *core_;
  std::vector<HostTensor> out;
  for (const Slot& s : c.layout.params) out.push_back({s.name, s.user_type(), read_param(s.name)});
  for (const Slot& s : c.layout.states) out.push_back({s.name, s.user_type(), read_state(s.name)});
  // Moment slot k of every parameter on the host, laid out as the parameters are; under
  // ZeRO-1 gathered from every rank's shard (a collective: every rank calls it).
  auto moments_of = [&c](int k) {
    const size_t msize = dtype_size(c.layout.moment_dtype());
    std::vector<std::byte> all(c.layout.moment_bytes());
    c.backend->download(all.data() + c.shard_lo * msize, c.opt + k * c.moment_bytes(), c.moment_bytes());
    if (c.sharded()) {
      std::vector<size_t> split = zero_split(all.size() / msize, c.comm->size());
      for (size_t& s : split) s *= msize;
      c.comm->all_gather(all.data(), split);
    }
    return all;
  };
  for (int k = 0; k < c.opt_slots; ++k) {
    const std::vector<std::byte> all = moments_of(k);
      for (const Slot& s : c.layout.params) {
        const DType md = c.layout.moment_dtype();
        const auto* at = all.data() + c.layout.moment_offset(s);
        std::vector<std::byte> stored(at, at + TensorType{md, s.type.shape}.bytes());
        HostTensor t{kMomentNames[k] + s.name, s.user_type(), reordered(s.type, stored, md, true)};
        t.type.dtype = md;
        out.push_back(std::move(t));
      }
  }
  return out;
}

void Model::load_tensors(const std::vector<HostTensor>& tensors) {
  Core& c = *core_;
  std::map<std::string, const HostTensor*> by_name;
  for (auto& t : tensors) by_name[t.name] = &t;
  auto check_type = [&](const TensorType& want, const std::string& name, bool required) -> const HostTensor* {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (required) fail("tensor '", name, "' (", want.str(), ") is missing");
      return nullptr;
    }
    const HostTensor& t = *it->second;
    if (!(t.type == want)) fail("tensor '", name, "' is ", t.type.str(), " but the model needs ", want.str());
    if (t.data.size() != want.bytes()) fail("tensor '", name, "' has ", t.data.size(), " bytes for ", want.str());
    return &t;
  };
  auto check = [&](const Slot& s, const std::string& name, bool required) {
    return check_type(s.user_type(), name, required);
  };
  auto check_moment = [&](const Slot& s, const std::string& name, bool required) {
    return check_type({c.layout.moment_dtype(), s.user_type().shape}, name, required);
  };
  // Validate everything first: a failed load must change nothing. Moments come in slots
  // (m, then v), each for every parameter or for none.
  bool present[kOptSlots] = {};
  for (const Slot& s : c.layout.params) {
    check(s, s.name, true);
    for (int k = 0; k < kOptSlots; ++k) present[k] = check_moment(s, kMomentNames[k] + s.name, false) || present[k];
  }
  for (const Slot& s : c.layout.states) check(s, s.name, true);
  int file_slots = 0;
  for (int k = 0; k < kOptSlots; ++k)
    if (present[k]) {
      if (k > file_slots) fail("tensors '", kMomentNames[k], "*' are given without '", kMomentNames[file_slots], "*'");
      file_slots = k + 1;
      for (const Slot& s : c.layout.params) check_moment(s, kMomentNames[k] + s.name, true);
    }
  // A model whose optimizer keeps fewer moments takes a checkpoint with more only where
  // the extra ones are zero (files of builds that kept two for every optimizer).
  int slots = file_slots;
  if (c.opt && file_slots > c.opt_slots) {
    for (int k = c.opt_slots; k < file_slots; ++k)
      for (const Slot& s : c.layout.params)
        for (std::byte b : by_name[kMomentNames[k] + s.name]->data)
          if (b != std::byte{0})
            fail("tensor '", kMomentNames[k], s.name, "': the checkpoint's optimizer keeps ", file_slots,
                 " moments a parameter, this model's keeps ", c.opt_slots);
    slots = c.opt_slots;
  }
  std::set<std::string> known;
  for (const Slot& s : c.layout.params) {
    known.insert(s.name);
    for (auto* m : kMomentNames) known.insert(m + s.name);
  }
  for (const Slot& s : c.layout.states) known.insert(s.name);
  for (auto& t : tensors)
    if (!known.count(t.name)) fail("tensor '", t.name, "' does not belong to this model");

  c.allocate();  // every parameter and state is written below: nothing to draw first
  for (const Slot& s : c.layout.params) {
    const auto stored = reordered(s.type, by_name[s.name]->data, s.type.dtype, false);
    c.backend->upload(c.params + s.offset, stored.data(), stored.size());
  }
  c.working_valid = false;
  for (const Slot& s : c.layout.states)
    c.backend->upload(c.state_buf + s.offset, by_name[s.name]->data.data(), s.type.bytes());
  c.drawn = true;
  if (slots > 0) {
    if (!c.opt) {
      c.opt = c.backend->alloc(slots * c.moment_bytes());
      c.opt_slots = slots;
    }
    if (c.opt_slots > slots) c.backend->fill_zero(c.opt + slots * c.moment_bytes(), (c.opt_slots - slots) * c.moment_bytes());
    // Each slot whole on the host, then this model's part of it (its ZeRO-1 shard) up.
    std::vector<std::byte> all(c.layout.moment_bytes());
    for (int k = 0; k < slots; ++k) {
      for (const Slot& s : c.layout.params) {
        const HostTensor& t = *by_name[kMomentNames[k] + s.name];
        const auto stored = reordered(s.type, t.data, c.layout.moment_dtype(), false);
        std::memcpy(all.data() + c.layout.moment_offset(s), stored.data(), stored.size());
      }
      c.backend->upload(c.opt + k * c.moment_bytes(), all.data() + c.shard_lo * dtype_size(c.layout.moment_dtype()),
                        c.moment_bytes());
    }
  }
}

Program Model::compile(const CompileOptions& o) { return Program(core_, plan(o)); }

Plan Model::plan(const CompileOptions& o) const {
  const Core& c = *core_;
  Graph g = c.graph;
  const auto nv = static_cast<ValueId>(c.graph.values().size());
  auto check_id = [&](ValueId id, const char* what) {
    if (id < 0 || id >= nv) fail("compile: ", what, " ", id, " is not a value of this model's graph");
  };
  apply_mode(g, o.mode);
  // Outputs and the loss keep their ids through the rewrites below (their maps), so the
  // checks and requests below speak of the rewritten graph.
  std::vector<ValueId> to_new;
  auto rewrite = [&](FuseResult p) {
    g = std::move(p.graph);
    if (to_new.empty()) to_new = std::move(p.map);
    else
      for (ValueId& v : to_new) v = v < 0 ? v : p.map[static_cast<size_t>(v)];
  };
  if (c.stored) rewrite(params_in(g, *c.stored));
  if (low_dtype(c.precision) || !c.overrides.empty()) rewrite(apply_precision(g, c.precision, c.overrides));
  if (!c.nhwc_convs.empty()) rewrite(apply_layout(g, c.nhwc_convs));
  for (ValueId id : g.params()) {
    const Value& v = g.value(id);
    const Slot* s = c.layout.param(v.name);
    if (!s || !(s->type == v.type))
      fail("internal error: compile declares parameter ", g.describe(id), " where the model stores ",
           s ? s->type.str() : std::string("none of that name"));
  }
  auto renumber = [&](ValueId v) { return to_new.empty() || v < 0 || v >= nv ? v : to_new[static_cast<size_t>(v)]; };
  LowerRequest req;
  req.reuse_memory = o.reuse_memory;
  req.reuse_gap = o.reuse_gap >= 0 ? o.reuse_gap : c.reuse_gap;
  for (ValueId id : o.outputs) {
    check_id(id, "output");
    req.outputs.push_back(renumber(id));
  }
  const ValueId loss = renumber(o.loss);
  std::string loss_name;
  if (o.loss >= 0) {
    check_id(o.loss, "loss");
    loss_name = g.value(loss).name;
    if (std::find(req.outputs.begin(), req.outputs.end(), loss) == req.outputs.end()) req.outputs.push_back(loss);
  }
  if (o.optimizer) {
    if (o.mode != Mode::train) fail("compile: an optimizer needs mode train");
    if (o.loss < 0) fail("compile: an optimizer needs a loss to differentiate");
    o.optimizer->validate();
    req.optimizer = o.optimizer;
    LossScaling& ls = req.optimizer->loss_scaling;
    if (ls.mode == LossScaling::Mode::automatic) {
      bool f16 = false;
      for (const Value& v : g.values()) f16 = f16 || v.type.dtype == DType::f16;
      ls.mode = f16 ? LossScaling::Mode::dynamic : LossScaling::Mode::off;
    }
  }
  if (o.optimizer || o.gradients) {
    if (o.loss < 0) fail("compile: gradients need a loss to differentiate");
    std::vector<ValueId> wrt;
    for (const Slot& s : c.layout.params) wrt.push_back(*g.find(s.name));
    // A scaled backward pass starts from the step's loss scale instead of 1.
    std::optional<ValueId> seed;
    if (req.optimizer && req.optimizer->loss_scaling.mode == LossScaling::Mode::dynamic) {
      if (!(g.value(loss).type == TensorType{DType::f32, {}}))
        fail("compile: loss scaling needs an f32 scalar loss, got ", g.describe(loss));
      seed = g.add(Op::loss_scale, {}, {{"init", req.optimizer->loss_scaling.init}}).at(0);
    }
    std::vector<ValueId> grads = autodiff(g, loss, wrt, seed);
    std::set<ValueId> pinned;
    for (size_t i = 0; i < wrt.size(); ++i) {
      ValueId gv = grads[i];
      const TensorType& t = g.value(wrt[i]).type;
      // Each gradient is written by a node of its own straight into the gradient buffer;
      // values that are views, leaves or another parameter's gradient are copied there.
      if (gv < 0) {
        gv = full(g, t.shape, 0.0, t.dtype).id();
      } else {
        const Value& v = g.value(gv);
        bool own = v.kind == ValueKind::intermediate && op_def(g.node(v.node).op).view_of < 0;
        if (!own || pinned.count(gv)) gv = copy(g.var(gv)).id();
      }
      pinned.insert(gv);
      req.grads.emplace_back(gv, i);
    }
  }
  ValueId loss_now = loss;
  std::vector<ValueId> keep = req.outputs;
  for (auto& [v, slot] : req.grads) keep.push_back(v);
  auto apply = [&](FuseResult f) {
    g = std::move(f.graph);
    for (ValueId& v : req.outputs) v = f.map[static_cast<size_t>(v)];
    for (auto& [v, slot] : req.grads) v = f.map[static_cast<size_t>(v)];
    for (ValueId& v : keep) v = f.map[static_cast<size_t>(v)];
    if (loss_now >= 0) loss_now = f.map[static_cast<size_t>(loss_now)];
  };
  if (o.fuse) {
    // Casts fold into GEMMs and reductions before elementwise groups form, which absorb
    // the casts left next to them.
    std::vector<FuseResult (*)(const Graph&, const std::vector<ValueId>&)> passes = {
        fuse_epilogues,       fold_matmul_transposes, fuse_norm_activations, fuse_conv_activations,
        sum_into_norm_grads, absorb_class_slices,    fuse_losses,           sums_into_embedding_grads,
        fold_casts,
        bias_grads_into_norm_grads,  // after fold_casts: db in the dtype gamma's gradient has
        bias_grads_into_act_grads,   // after fold_casts: db in the dtype the weight gradient's has
        bias_grads_into_data_grads,  // after the two above: only the bias gradients they left
        residual_adds_into_linears};
    if (o.fuse_elementwise) passes.push_back(fuse_elementwise);
    for (auto pass : passes) apply(pass(g, keep));
  }
  if (o.output_chunks < 1) fail("compile: output_chunks must be at least 1, got ", o.output_chunks);
  // After the fusions: the GELU to recompute is the epilogue's, its source the record.
  if (c.layout.param_dtype == DType::f32) req.working = low_dtype(c.precision);
  std::string budget_note;
  // The output layer in `k` chunks where one qualifies (chunk_output_layer); where none
  // does, a note says so rather than nothing.
  std::string unchunked;
  auto chunk_into = [&](int k) {
    FuseResult f = o.fuse ? chunk_output_layer(g, keep, k) : FuseResult{};
    if (f.backward > 0) {
      apply(std::move(f));
      return true;
    }
    unchunked = "output_chunks " + std::to_string(k) + ": nothing chunked (" +
                (o.fuse ? std::string("no output layer qualifies: a bias-free linear whose logits only the fused loss "
                                      "reads, in training")
                        : std::string("fusion is off: the chunks split the fused loss")) +
                ")";
    return false;
  };
  if (o.memory_budget > 0) {
    // The model's buffers once this program holds what it needs (its moments, working copies).
    const int slots = req.optimizer ? req.optimizer->state_slots() : 0;
    const size_t own = device_bytes() + static_cast<size_t>(std::max(0, slots - c.opt_slots)) * c.moment_bytes() +
                       (req.working && !c.working ? c.layout.param_bytes / 2 : 0);
    if (own >= o.memory_budget)
      fail("compile: memory budget of ", bytes_str(o.memory_budget), ": the model's own buffers (parameters, their "
           "gradients, working copies and optimizer state) take ", bytes_str(own));
    auto bytes_of = [&](const FuseResult& f) {
      LowerRequest r = req;
      for (ValueId& v : r.outputs) v = f.map[static_cast<size_t>(v)];
      for (auto& [v, slot] : r.grads) v = f.map[static_cast<size_t>(v)];
      return own + lower(f.graph, c.layout, r).arena_bytes;
    };
    // Where the step does not fit as it is: layer norm's backward from its output first (no
    // pass more, a division a value), then the output layer in more chunks (a few more
    // passes over its weight's gradient each) while they make the step smaller, then
    // recomputation.
    int from_outputs = 0;
    if (o.fuse && std::find(o.recompute.begin(), o.recompute.end(), "layer_norm") == o.recompute.end() &&
        own + lower(g, c.layout, req).arena_bytes > o.memory_budget) {
      FuseResult f = norm_grads_from_outputs(g, loss_now);
      from_outputs = f.backward;
      if (from_outputs > 0) apply(std::move(f));
    }
    int chunks = o.output_chunks;
    if (o.fuse) {
      size_t have = bytes_of(chunk_output_layer(g, keep, chunks));
      while (have > o.memory_budget && 2 * chunks <= std::max(chunks, kBudgetChunks)) {
        FuseResult f = chunk_output_layer(g, keep, 2 * chunks);
        const size_t more = f.backward > 0 ? bytes_of(f) : have;
        if (more >= have) break;  // no output layer, or its logits are not what the peak holds
        chunks *= 2;
        have = more;
      }
    }
    if (chunks > 1 && !chunk_into(chunks)) chunks = 1;
    RecomputeChoice ch = recompute_within(g, loss_now, o.recompute, o.memory_budget, bytes_of);
    const std::string extra = count_kinds(ch.added);
    budget_note = "memory budget " + bytes_str(o.memory_budget) + ": the model's buffers and the arena take " +
                  bytes_str(ch.bytes) +
                  (from_outputs > 0 ? ", " + std::to_string(from_outputs) + " layer norm gradients from their outputs"
                                    : "") +
                  (chunks > 1 ? ", the output layer in " + std::to_string(chunks) + " chunks" : "") +
                  (extra.empty() ? "" : ", recomputing " + extra + " outputs more") +
                  (unchunked.empty() ? "" : "; " + unchunked);
    apply(std::move(ch.result));
  } else {
    if (o.output_chunks > 1) chunk_into(o.output_chunks);
    if (!o.recompute.empty()) apply(recompute_activations(g, loss_now, o.recompute));
    budget_note = unchunked;
  }
  Plan plan = lower(g, c.layout, req);
  plan.budget_note = budget_note;
  plan.loss = loss_name;
  if (req.optimizer && c.comm) {
    plan_gradient_buckets(plan, c.comm->size(), c.bucket_bytes);
    plan.zero = c.zero;
  }
  return plan;
}

namespace {

// The arena's largest values, by the inputs and the steps that write them: what a
// smaller batch or a lighter layer would shrink.
std::string largest_buffers(const Plan& p, size_t n) {
  std::vector<std::pair<size_t, std::string>> v;
  for (const Binding& b : p.inputs)
    if (b.ref.region == Region::arena) v.emplace_back(b.ref.bytes(), "input '" + b.name + "' " + b.ref.type.str());
  for (const PlanStep& s : p.steps)
    for (const BufferRef& b : s.out)
      if (b.region == Region::arena) v.emplace_back(b.bytes(), "'" + s.name + "' " + b.type.str());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string text;
  for (size_t i = 0; i < std::min(n, v.size()); ++i) {
    char mib[32];
    std::snprintf(mib, sizeof mib, " (%.1f MiB)", static_cast<double>(v[i].first) / 1048576.0);
    text += (i ? ", " : "") + v[i].second + mib;
  }
  return text;
}

}  // namespace

Program::Program(std::shared_ptr<Model::Core> core, Plan plan)
    : core_(std::move(core)), plan_(std::make_unique<Plan>(std::move(plan))) {
  Model::Core& c = core_->with_values();
  const int slots = plan_->optimizer ? plan_->optimizer->state_slots() : 0;
  if (slots > 0 && !c.opt) {
    c.opt = c.backend->alloc(slots * c.moment_bytes());
    c.opt_slots = slots;
  } else if (slots > c.opt_slots) {
    // Programs already prepared hold the moments' buffer: it cannot grow under them.
    fail("compile: the optimizer keeps ", slots, " moments a parameter, but this model's state holds ",
         c.opt_slots, " (made for its first optimizer or a checkpoint): use a model of its own for it");
  }
  if (plan_->working && !c.working) c.working = c.backend->alloc(c.layout.param_bytes / 2);
  try {
    arena_ = c.backend->alloc(plan_->arena_bytes);
  } catch (const Error& e) {
    fail("cannot allocate the arena of ", plan_->arena_bytes, " bytes (the plan's peak; parameters take ",
         c.layout.param_bytes, " more); its largest buffers: ", largest_buffers(*plan_, 5), ": ", e.what());
  }
  try {
    exe_ = c.backend->prepare(*plan_, c.regions(arena_));
  } catch (...) {
    c.backend->release(arena_);
    throw;
  }
}

Program::Program(Program&& o) noexcept
    : core_(std::move(o.core_)), plan_(std::move(o.plan_)), arena_(std::exchange(o.arena_, nullptr)),
      exe_(std::move(o.exe_)) {}
Program& Program::operator=(Program&& other) noexcept {
  if (this != &other) {
    exe_.reset();
    if (arena_) core_->backend->release(arena_);
    core_ = std::move(other.core_);
    plan_ = std::move(other.plan_);
    arena_ = std::exchange(other.arena_, nullptr);
    exe_ = std::move(other.exe_);
  }
  return *this;
}

Program::~Program() {
  exe_.reset();
  if (arena_) core_->backend->release(arena_);
}

void Program::run() {
  Model::Core& c = *core_;
  if (plan_->working) c.refresh_working(*plan_->working);
  exe_->run(c.state);
  // An update that does not write the working copies leaves them behind the masters.
  if (plan_->optimizer && !plan_->working) c.working_valid = false;
}
void Program::check() { exe_->check(); }

const StepState& Program::sync_state() {
  exe_->check();
  exe_->sync_state(core_->state);
  return core_->state;
}

std::vector<double> Program::time_steps(int reps) {
  Model::Core& c = *core_;
  Backend& be = *c.backend;
  if (plan_->working) c.refresh_working(*plan_->working);
  const Regions r = c.regions(arena_);
  // Everything a replayed step may change besides intermediates: the model's buffers,
  // the backend's step counter, and the plan's inputs (in the arena on the CPU).
  std::vector<std::pair<std::byte*, size_t>> kept = {{r.params, c.layout.param_bytes},
                                                     {r.grads, c.layout.param_bytes},
                                                     {r.state, c.layout.state_bytes},
                                                     {r.counters, kCounterBytes}};
  if (r.opt) kept.emplace_back(r.opt, c.opt_slots * c.moment_bytes());
  if (r.working) kept.emplace_back(r.working, c.layout.param_bytes / 2);
  for (const Binding& b : plan_->inputs) kept.emplace_back(r.base(b.ref.region) + b.ref.offset, b.ref.bytes());
  std::vector<std::vector<std::byte>> saved;
  for (auto& [p, bytes] : kept) {
    saved.emplace_back(bytes);
    if (bytes) be.download(saved.back().data(), p, bytes);
  }
  const StepState state = c.state, synced = c.synced;
  auto restore = [&] {
    for (size_t i = 0; i < kept.size(); ++i)
      if (kept[i].second) be.upload(kept[i].first, saved[i].data(), kept[i].second);
    c.state = state;
    c.synced = synced;
  };
  std::vector<double> ms;
  try {
    ms = exe_->time_steps(reps);
  } catch (...) {  // a failed measurement leaves the model as it was too
    restore();
    throw;
  }
  restore();
  return ms;
}

TensorType Slot::user_type() const {
  return type.layout == DataLayout::nhwc ? TensorType{type.dtype, nchw_order(type.shape)} : type;
}

}  // namespace seam
