// A program's inputs and outputs: set from host bytes or from the GPU's memory (a DLPack
// producer's), read into host bytes or into fresh device memory, in the graph's dtype and
// NCHW order whatever the precision and layout passes stored.
#include <cstring>

#include "common/half.h"
#include "model_core.h"
#include "ops/layout.h"

namespace seam {

const Binding* Program::input_binding(const std::string& name) const {
  const Binding* b = plan_->input(name);
  if (b) return b;
  const Graph& g = core_->graph;
  auto id = g.find(name);
  if (id && g.value(*id).kind == ValueKind::input) return nullptr;  // not needed by this plan
  std::string known;
  for (ValueId i : g.inputs()) known += (known.empty() ? "" : ", ") + g.value(i).name;
  fail("no input named '", name, "' (the model's inputs: ", known, ")");
}

void Program::set_input(const std::string& name, std::span<const std::byte> data) {
  const Binding* b = input_binding(name);
  if (!b) return;
  if (data.size() != b->ref.bytes())
    fail("input '", name, "' is ", b->ref.type.str(), " (", b->ref.bytes(), " bytes), got ", data.size(), " bytes");
  exe_->set_input(static_cast<size_t>(b - plan_->inputs.data()), data);
}

namespace {
std::vector<std::byte> read_ref(Backend& be, const Regions& r, const BufferRef& ref) {
  std::vector<std::byte> out(ref.bytes());
  be.download(out.data(), r.base(ref.region) + ref.offset, out.size());
  return out;
}

// What read() makes of an output: where it is stored, and the type it reads back as (a
// value the layout pass stored channels-last in the graph's NCHW order, unless the graph
// made it channels-last itself; one the precision pass stored in 16 bits in the graph's
// dtype).
struct Readout {
  const BufferRef* ref = nullptr;
  TensorType type;
  bool nhwc = false;
};

Readout readout(const Plan& plan, const Graph& g, const std::string& output) {
  const Binding* b = plan.output(output);
  if (!b) {
    std::string known;
    for (auto& o : plan.outputs) known += (known.empty() ? "" : ", ") + o.name;
    fail("no output named '", output, "' (this program's outputs: ", known, ")");
  }
  Readout r{&b->ref, b->ref.type, false};
  auto id = g.find(output);
  if (b->ref.type.layout == DataLayout::nhwc && !(id && g.value(*id).type.layout == DataLayout::nhwc)) {
    if (!id || nhwc_order(g.value(*id).type.shape) != b->ref.type.shape)
      fail("internal error: output '", output, "' is stored as ", b->ref.type.str(), ", not the channels-last order of ",
           id ? g.value(*id).type.str() : std::string("a value of the graph"));
    r.nhwc = true;
    r.type = TensorType{b->ref.type.dtype, g.value(*id).type.shape};
  }
  const DType want = id ? g.value(*id).type.dtype : b->ref.type.dtype;
  if (want != b->ref.type.dtype && is_half(b->ref.type.dtype) && is_float(want)) r.type.dtype = want;
  return r;
}

}  // namespace

TensorType Program::output_type(const std::string& output) const { return readout(*plan_, core_->graph, output).type; }

std::vector<std::byte> Program::read(const std::string& output) const { return read(output, nullptr, 0); }

std::vector<std::byte> Program::read(const std::string& output, bool (*fits)(DType), size_t element_bytes) const {
  const Readout r = readout(*plan_, core_->graph, output);
  if (fits && !fits(r.type.dtype)) elements_mismatch("output '" + output + "'", r.type.dtype, element_bytes);
  auto out = read_ref(*core_->backend, core_->regions(arena_), *r.ref);
  exe_->check();
  if (r.nhwc) {
    std::vector<std::byte> nchw(out.size());
    reorder_nhwc(out.data(), nchw.data(), r.ref->type.shape, dtype_size(r.ref->type.dtype), true);
    out = std::move(nchw);
  }
  if (r.type.dtype != r.ref->type.dtype) {
    std::vector<double> v(static_cast<size_t>(r.type.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, out.data() + 2 * i, 2);
      v[i] = half_to_float(h, r.ref->type.dtype);
    }
    return encode(v, r.type.dtype);
  }
  return out;
}

namespace {

// values[i] *= scale in f32, as the update multiplied the gradients it read.
void scale_values(std::vector<std::byte>& values, DType t, float scale) {
  const size_t w = dtype_size(t);
  SEAM_ASSERT(t == DType::f32 || is_half(t));
  for (size_t i = 0; i < values.size() / w; ++i) {
    std::byte* p = values.data() + i * w;
    if (t == DType::f32) {
      float f;
      std::memcpy(&f, p, 4);
      f *= scale;
      std::memcpy(p, &f, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, p, 2);
      h = float_to_half(half_to_float(h, t) * scale, t);
      std::memcpy(p, &h, 2);
    }
  }
}

// A stored value in fresh device memory, as the user reads it.
DeviceArray export_value(Backend& be, const std::byte* src, const TensorType& stored, const TensorType& user, bool nhwc,
                         float scale = 1.0f) {
  DeviceArray a{be.alloc_exported(user.bytes()), user, be.device_index()};
  be.copy_converted(a.data.get(), user.dtype, src, stored.dtype, user.shape, nhwc, scale);
  return a;
}

}  // namespace

DeviceArray Program::read_device(const std::string& output) const {
  const Readout r = readout(*plan_, core_->graph, output);
  Backend& be = *core_->backend;
  DeviceArray a = export_value(be, core_->regions(arena_).base(r.ref->region) + r.ref->offset, r.ref->type, r.type, r.nhwc);
  exe_->check();
  return a;
}

DeviceArray Program::read_grad_device(const std::string& param) const {
  const Binding* b = plan_->grad(param);
  if (!b) fail("this program computes no gradient for '", param, "'");
  const Slot* s = core_->layout.param(param);
  const bool nhwc = s && s->type.layout == DataLayout::nhwc;
  const TensorType user{b->ref.type.dtype, nhwc ? s->user_type().shape : b->ref.type.shape};
  DeviceArray a = export_value(*core_->backend, core_->regions(arena_).base(b->ref.region) + b->ref.offset, b->ref.type,
                               user, nhwc, exe_->grad_read_scale());
  exe_->check();
  return a;
}

void Program::set_input_device(const std::string& name, const void* data, size_t bytes,
                               std::shared_ptr<const void> owner) {
  const Binding* b = input_binding(name);
  if (!b) return;
  if (bytes != b->ref.bytes())
    fail("input '", name, "' is ", b->ref.type.str(), " (", b->ref.bytes(), " bytes), got ", bytes, " bytes");
  exe_->set_input_device(static_cast<size_t>(b - plan_->inputs.data()), data, std::move(owner));
}

void* Program::input_stream() const { return exe_->input_stream(); }
int Program::device_index() const { return core_->backend->device_index(); }

void Executable::set_input_device(size_t, const void*, std::shared_ptr<const void>) {
  fail("an input in GPU memory, but the program runs on the CPU: pass a host array");
}
std::shared_ptr<std::byte> Backend::alloc_exported(size_t) {
  fail("the program runs on the CPU: its values are read into host memory (read, read_grad)");
}
void Backend::copy_converted(std::byte*, DType, const std::byte*, DType, const Shape&, bool, float) {
  fail("the program runs on the CPU: its values are read into host memory (read, read_grad)");
}

void Program::elements_mismatch(const std::string& what, DType t, size_t element_bytes) {
  fail(what, " holds ", dtype_name(t), " values, which a ", element_bytes,
       "-byte element type does not read: read_as and grad_as copy bytes (float for f32, double for f64, int32_t "
       "for i32, uint8_t for u8, uint16_t for the bits of bf16 and f16); read() gives them in any case");
}

std::vector<std::byte> Program::read_grad(const std::string& param) const { return read_grad(param, nullptr, 0); }

std::vector<std::byte> Program::read_grad(const std::string& param, bool (*fits)(DType), size_t element_bytes) const {
  const Binding* b = plan_->grad(param);
  if (!b) fail("this program computes no gradient for '", param, "'");
  if (fits && !fits(b->ref.type.dtype))
    elements_mismatch("the gradient of '" + param + "'", b->ref.type.dtype, element_bytes);
  auto out = read_ref(*core_->backend, core_->regions(arena_), b->ref);
  exe_->check();
  if (const float scale = exe_->grad_read_scale(); scale != 1.0f) scale_values(out, b->ref.type.dtype, scale);
  const Slot* s = core_->layout.param(param);  // a channels-last filter's reads in NCHW order
  return s ? reordered(s->type, out, b->ref.type.dtype, true) : out;
}

}  // namespace seam
