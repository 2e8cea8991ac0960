// fused_elementwise on the GPU: a kernel generated for the group's program (codegen.h),
// launched over the output's elements.
#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/check.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/gemm.h"
#include "ops/shapes.h"

namespace seam::cuda {

namespace {

int current_arch() {
  int dev = 0, major = 0, minor = 0;
  SEAM_CUDA_CHECK(cudaGetDevice(&dev));
  SEAM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  SEAM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major * 10 + minor;
}

// The split variant: each op of the program by its own kernel (the unfused ops' kernels),
// temps in scratch in the dtypes EwProgram::temp_dtypes gives; `unused` frees them if the
// generated kernel is chosen. A cast to the dtype its operand has is no kernel; an op on
// operands of different dtypes (no program of the fusion pass has one) reads them cast to
// the dtype it computes in. Results whose op writes another dtype than their output's are
// cast into it last.
Variant split_variant(const StepArgs& a, const std::string& program, const Shape& shape) {
  const EwProgram& prog = EwProgram::cached(program);
  std::vector<DType> in_dtypes;
  for (auto& t : a.in) in_dtypes.push_back(t.dtype());
  const std::vector<DType> td = prog.temp_dtypes(in_dtypes);
  std::vector<void*> scratch;
  auto fresh = [&](DType t, const Shape& s) {
    const TensorType type{t, s};
    DeviceTensor d{a.ctx.scratch(std::max<size_t>(type.bytes(), 1)), type};
    scratch.push_back(d.data);
    return d;
  };
  auto convert = [&](const DeviceTensor& from, const DeviceTensor& to) {
    if (from.dtype() == to.dtype()) return prepare_as_step(a, Op::copy, Attrs{}, {from}, {to});
    return prepare_as_step(a, Op::cast, Attrs{{"dtype", std::string(dtype_name(to.dtype()))}}, {from}, {to});
  };
  std::vector<Launch> parts, last;
  auto into = [&](DType t, const DeviceTensor& out) {  // where an op writing t puts out's value
    if (out.dtype() == t) return out;
    DeviceTensor d = fresh(t, out.shape());
    last.push_back(convert(d, out));
    return d;
  };
  std::vector<DeviceTensor> temp(prog.code.size());
  for (size_t j = 0; j < prog.outputs.size(); ++j) {
    const auto t = static_cast<size_t>(prog.outputs[j]);
    if (prog.reduce[j] == EwReduce::none && !temp[t].data && a.out[j].dtype() == td[t]) temp[t] = a.out[j];
  }
  // An output that is a cast of another value to the dtype that value has (a residual
  // sum rounded before its layer norm): the value is written into the output itself,
  // rather than into scratch and copied.
  for (size_t c = 0; c < prog.code.size(); ++c) {
    const EwInstr& in = prog.code[c];
    if (in.op != Op::cast || !temp[c].data || in.args[0] >= 0) continue;
    const auto u = static_cast<size_t>(-in.args[0] - 1);
    if (!temp[u].data && td[u] == in.dtype && temp[c].dtype() == in.dtype) temp[u] = temp[c];
  }
  for (size_t c = 0; c < prog.code.size(); ++c) {
    const EwInstr& in = prog.code[c];
    std::vector<DeviceTensor> operands;
    for (int v : in.args) operands.push_back(v >= 0 ? a.in[static_cast<size_t>(v)] : temp[static_cast<size_t>(-v - 1)]);
    if (in.op == Op::cast && operands[0].dtype() == in.dtype && (!temp[c].data || temp[c].data == operands[0].data)) {
      temp[c] = operands[0];
      continue;
    }
    if (!temp[c].data) temp[c] = fresh(td[c], shape);
    if (in.op == Op::cast) {
      parts.push_back(convert(operands[0], temp[c]));
      continue;
    }
    for (DeviceTensor& o : operands)
      if (o.dtype() != td[c]) {
        DeviceTensor d = fresh(td[c], o.shape());
        parts.push_back(convert(o, d));
        o = d;
      }
    Attrs attrs;
    if (ew_draws(in.op))
      attrs = Attrs{{"p", in.p}, {"stream", static_cast<int64_t>(in.stream)}, {"training", int64_t{1}}};
    else if (*ew_attr(in.op))
      attrs.set(ew_attr(in.op), in.p);
    parts.push_back(prepare_as_step(a, in.op, attrs, operands, {temp[c]}));
  }
  for (size_t j = 0; j < prog.outputs.size(); ++j) {
    const DeviceTensor& t = temp[static_cast<size_t>(prog.outputs[j])];
    const DType wide = compute_dtype(t.dtype());
    if (summed(prog.reduce[j])) {  // sum writes its input's dtype or the one it computes in
      const DType to = a.out[j].dtype() == t.dtype() ? t.dtype() : wide;
      const Attrs reduce_attrs{{"axes", a.step.attrs.ints("axes")},
                               {"keepdims", a.step.attrs.i("keepdims")},
                               {"dtype", std::string(to == t.dtype() ? "" : dtype_name(to))}};
      parts.push_back(prepare_as_step(a, prog.reduce[j] == EwReduce::sum ? Op::sum : Op::mean, reduce_attrs, {t},
                                      {into(to, a.out[j])}));
    }
    if (prog.reduce[j] == EwReduce::ln_y)
      parts.push_back(prepare_as_step(a, Op::layer_norm, Attrs{{"eps", prog.ln_eps}},
                                      {t, a.in[static_cast<size_t>(prog.ln_gamma)], a.in[static_cast<size_t>(prog.ln_beta)]},
                                      {into(t.dtype(), a.out[j]), into(wide, a.out[j + 1]), into(wide, a.out[j + 2])}));
    if (prog.reduce[j] == EwReduce::none && t.data != a.out[j].data) last.push_back(convert(t, a.out[j]));
  }
  parts.insert(parts.end(), last.begin(), last.end());
  Context* ctx = &a.ctx;
  return {"split", in_order(parts), [ctx, scratch] {
            for (void* p : scratch) ctx->release(p);
          }};
}

// The index space (every input broadcast) and, for a program ending in reductions, its
// split into kept and reduced dims: the layout and EwArgs fields that do not depend on
// where the tensors are.
struct Walk {
  Shape shape;
  std::vector<int64_t> dims;  // non-1 dims of shape, innermost first
  EwLayout layout = EwLayout::elementwise;
  int64_t kept = 1, len = 1;
};

Walk walk_of(const std::vector<Shape>& inputs, const Attrs& attrs, EwArgs* args) {
  Walk w;
  for (const Shape& s : inputs) w.shape = *broadcast_shapes(w.shape, s);
  const Shape& os = w.shape;
  for (size_t d = os.size(); d-- > 0;)
    if (os[d] != 1) w.dims.push_back(static_cast<int64_t>(d));
  const EwProgram& prog = EwProgram::cached(attrs.s("program"));
  if (prog.normalizes()) {  // rows of the last dim
    w.layout = EwLayout::norm;
    w.len = os.empty() ? 1 : os.back();
    w.kept = os.empty() ? 1 : numel(Shape(os.begin(), os.end() - 1));
    if (args) args->kept = w.kept, args->len = w.len;
    return w;
  }
  if (!prog.reduces()) return w;
  const auto axes = reduce_axes(attrs.ints("axes"), os.size(), nullptr);
  // Kept and reduced dims, innermost first, neighbours of one kind merged (the index
  // space is row-major, so they are contiguous).
  std::vector<std::pair<int64_t, int64_t>> kept, red;  // (size, stride)
  int last = -1;                                        // 0 kept, 1 reduced
  int64_t stride = 1;
  for (int64_t d : w.dims) {
    const bool r = std::find(axes.begin(), axes.end(), static_cast<int>(d)) != axes.end();
    auto& to = r ? red : kept;
    if (last == static_cast<int>(r)) to.back().first *= os[static_cast<size_t>(d)];
    else to.push_back({os[static_cast<size_t>(d)], stride});
    if (w.layout == EwLayout::elementwise) w.layout = r ? EwLayout::rows : EwLayout::columns;
    last = r;
    stride *= os[static_cast<size_t>(d)];
  }
  if (w.layout == EwLayout::elementwise) w.layout = EwLayout::rows;  // a single element
  if (kept.empty()) kept.push_back({1, 0});
  if (red.empty()) red.push_back({1, 0});
  for (auto& [sz, st] : kept) w.kept *= sz;
  for (auto& [sz, st] : red) w.len *= sz;
  if (args) {
    args->kept_rank = static_cast<int>(kept.size());
    args->red_rank = static_cast<int>(red.size());
    for (size_t i = 0; i < kept.size(); ++i) args->kept_size[i] = kept[i].first, args->kept_st[i] = kept[i].second;
    for (size_t i = 0; i < red.size(); ++i) args->red_size[i] = red[i].first, args->red_st[i] = red[i].second;
    args->kept = w.kept;
    args->len = w.len;
  }
  return w;
}

// The kernel's signature for a walk, and the EwArgs fields that depend only on shapes:
// each broadcast input's element strides over the index space (0 along the dims it is
// broadcast on). Vector width 4 where the shapes allow it (the caller checks alignment):
// an elementwise or columns walk whose broadcast inputs are each contiguous or constant
// along an innermost dim of a multiple of 4.
EwSignature signature_of(const Walk& w, const std::vector<Shape>& in_shapes, const std::string& program, EwArgs& args) {
  EwSignature s;
  s.program = program;
  s.layout = w.layout;
  const Shape& os = w.shape;
  args.n = numel(os);
  args.rank = static_cast<int>(w.dims.size());
  for (size_t i = 0; i < w.dims.size(); ++i) args.size[i] = os[static_cast<size_t>(w.dims[i])];
  // Columns walks take four neighbouring kept elements a thread (the innermost dim is
  // kept), keeping four sums per reduced output: at most 4 of them, for registers and
  // shared memory.
  const EwProgram& prog = EwProgram::cached(program);
  const auto sums = std::count_if(prog.reduce.begin(), prog.reduce.end(), summed);
  bool vec = (w.layout == EwLayout::elementwise && args.n >= 4) ||
             (w.layout == EwLayout::columns && sums <= 4 && args.rank > 0 && args.size[0] % 4 == 0);
  for (size_t k = 0; k < in_shapes.size(); ++k) {
    const Shape& is = in_shapes[k];
    const bool strided = is != os;
    s.strided.push_back(strided);
    s.splat.push_back(false);
    if (!strided) continue;
    const size_t lead = os.size() - is.size();
    int64_t stride = 1;
    std::vector<int64_t> own(os.size(), 0);
    for (size_t d = is.size(); d-- > 0;) {
      own[lead + d] = is[d] == 1 ? 0 : stride;
      stride *= is[d];
    }
    for (size_t i = 0; i < w.dims.size(); ++i) args.st[k][i] = own[static_cast<size_t>(w.dims[i])];
    vec = vec && args.rank > 0 && args.size[0] % 4 == 0 && args.st[k][0] <= 1;
    s.splat.back() = args.rank > 0 && args.st[k][0] == 0;
  }
  s.vec = vec ? 4 : 1;
  if (s.vec == 1) s.splat.clear();
  s.idx32 = args.n < (int64_t{1} << 31);
  if (w.layout == EwLayout::norm && w.len <= 1024) s.row_values = lane_groups(w.len);
  return s;
}

static_assert(PartialSums::kMaxOutputs >= kEwMaxOutputs, "every reduced output's partials are added up in one launch");
// Generated kernels read the counters as two 64-bit words (codegen.cpp, counters_stmt).
static_assert(offsetof(DeviceCounters, step) == 0 && offsetof(DeviceCounters, seed) == 8,
              "generated kernels read the step and the seed as the counters' first two words");

Launch prepare_fused_elementwise(const StepArgs& a) {
  bool f64 = false;
  for (auto* ts : {&a.in, &a.out})
    for (const DeviceTensor& t : *ts) {
      expect_dtype(a, t, kValues);
      f64 = f64 || t.dtype() == DType::f64;
    }
  const EwProgram& prog = EwProgram::cached(a.step.attrs.s("program"));
  std::vector<Shape> in_shapes;
  for (auto& t : a.in) in_shapes.push_back(t.shape());
  EwArgs args{};
  const Walk w = walk_of(in_shapes, a.step.attrs, &args);
  const Shape& os = w.shape;
  const int64_t n = numel(os);
  if (n == 0 && !prog.reduces() && !prog.normalizes()) return [](cudaStream_t) {};
  // The generated kernels compute in float; the op kernels compute f64 in double. A group
  // with f64 values (all of it f64: the fusion pass keeps f64 among f64) runs op by op.
  if (f64) {
    a.ctx.choices.emplace_back(a.index, "split: f64 values, which the generated kernels do not compute in double");
    return split_variant(a, a.step.attrs.s("program"), os).launch;
  }
  // Past the generated kernel's limits (or with nothing to walk), the group runs as one
  // kernel per op.
  if (a.in.size() > static_cast<size_t>(kEwMaxInputs) || a.out.size() > static_cast<size_t>(kEwMaxOutputs) ||
      w.dims.size() > static_cast<size_t>(kEwMaxDims) || n == 0) {
    a.ctx.choices.emplace_back(a.index, "split: " + std::to_string(a.in.size()) + " inputs, " +
                                            std::to_string(a.out.size()) + " outputs, " + std::to_string(w.dims.size()) +
                                            " dims, " + std::to_string(n) + " elements; a generated kernel takes " +
                                            std::to_string(kEwMaxInputs) + ", " + std::to_string(kEwMaxOutputs) + ", " +
                                            std::to_string(kEwMaxDims) + ", at least 1");
    return split_variant(a, a.step.attrs.s("program"), os).launch;
  }
  EwSignature s = signature_of(w, in_shapes, a.step.attrs.s("program"), args);
  s.arch = current_arch();
  for (auto& t : a.in) s.in_dtypes.push_back(t.dtype());
  for (auto& t : a.out) s.out_dtypes.push_back(t.dtype());
  // Vector loads and stores need every full operand, and each broadcast one read four
  // at a time, aligned to four elements (16 bytes of f32, 8 of a 16-bit type).
  bool aligned = true;
  auto vector_aligned = [](const DeviceTensor& t) {
    return reinterpret_cast<uintptr_t>(t.data) % (4 * dtype_size(t.dtype())) == 0;
  };
  for (size_t k = 0; k < a.in.size(); ++k) {
    args.in[k] = a.in[k].data;
    const bool as_vector = !s.strided[k] || (s.vec == 4 && !s.splat[k]);
    aligned = aligned && (!as_vector || vector_aligned(a.in[k]));
  }
  args.counters = a.ctx.counters;  // read when the kernel runs: a graph replay sees each step's
  int reduced = 0;
  PartialSums fin;
  std::vector<size_t> reduced_output;  // the output each reduced one is
  for (size_t j = 0; j < a.out.size(); ++j) {
    args.out[j] = a.out[j].data;
    // only stored outputs are written four at a time
    if (prog.reduce[j] == EwReduce::none) aligned = aligned && vector_aligned(a.out[j]);
    const EwReduce r = prog.reduce[j];
    args.scale[j] = r == EwReduce::mean ? static_cast<double>(w.kept) / static_cast<double>(n) : 1.0;
    if (!summed(r)) continue;
    fin.out[reduced] = a.out[j].dtype() == DType::f32 ? a.out[j].as<float>() : nullptr;
    fin.scale[reduced] = args.scale[j];
    reduced_output.push_back(j);
    ++reduced;
  }
  if (!aligned) s.vec = 1, s.splat.clear();

  // The generated kernel for a signature as a variant: its launch (and the second kernel
  // adding chunk partials), or nothing when the loaded function's figures rule it out: a
  // kernel that uses local memory (spills), or whose registers and shared memory leave
  // room for fewer than a quarter of the 2048 threads an SM holds (more than 128
  // registers a thread, say). A figure that is unknown rules it out too.
  std::string stats;
  auto generated = [&](const EwSignature& sig, EwArgs ka, const std::string& name) -> std::optional<Variant> {
    std::shared_ptr<const GeneratedKernel> k = ew_kernel(sig);
    const int threads = resident_threads(k->registers, k->shared_bytes);
    stats += (stats.empty() ? "" : "; ") + name + ": " + std::to_string(k->registers) + " registers, " +
             std::to_string(k->shared_bytes) + " bytes shared, " + std::to_string(k->spill_bytes) +
             " bytes spilled, " + std::to_string(threads) + " threads an SM, vector width " + std::to_string(sig.vec) +
             (w.layout == EwLayout::elementwise ? std::string()
              : w.layout == EwLayout::columns   ? ", ending in column sums"
              : w.layout == EwLayout::rows      ? ", ending in row sums"
                                                : ", ending in a layer norm");
    if (k->spill_bytes != 0 || threads < 512) return std::nullopt;
    ka.nvec = sig.vec == 4 && w.layout == EwLayout::elementwise ? n / 4 : 0;
    if (w.layout == EwLayout::elementwise || w.layout == EwLayout::norm) {
      const unsigned blocks =
          w.layout == EwLayout::norm ? blocks_for(w.kept, 8, std::max(a.ctx.sm_count, 1) * 16)  // 8 rows a block
                                     : blocks_for(ka.nvec > 0 ? ka.nvec : n, 256, static_cast<int>(grid_cap(a.ctx)));
      return Variant{name, [k, ka, blocks](cudaStream_t st) {
                       EwArgs copy = ka;
                       void* params[] = {&copy};
                       SEAM_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k->kernel), dim3(blocks),
                                                        dim3(256), params, 0, st));
                     }};
    }
    // Blocks across the kept elements, and chunks of the reduced ones until about eight
    // blocks per SM: a warp's loads are one row segment per operand, so it takes many
    // warps in flight to cover HBM latency. Each chunk stays long enough that its
    // partial's round trip costs little.
    const bool cols = w.layout == EwLayout::columns;
    const int64_t per_block = cols ? 32 * sig.vec : 8, min_chunk = cols ? 32 * sig.vec : 256;
    const int64_t bx = (w.kept + per_block - 1) / per_block;
    const int64_t want = 8 * std::max(a.ctx.sm_count, 1);
    int64_t chunks =
        std::clamp<int64_t>((want + bx - 1) / bx, 1, std::max<int64_t>((w.len + min_chunk - 1) / min_chunk, 1));
    chunks = std::min<int64_t>(chunks, 65535);
    ka.chunk = (w.len + chunks - 1) / chunks;
    chunks = (w.len + ka.chunk - 1) / ka.chunk;
    if (bx > 2147483647) fail("fused_elementwise: ", w.kept, " kept elements are too many for one grid");
    PartialSums f = fin;
    std::vector<void*> scratch;
    std::vector<Launch> casts;  // 16-bit reduced outputs: the chunks add up in f32, then round
    if (chunks > 1) {
      ka.partial = static_cast<double*>(a.ctx.scratch(static_cast<size_t>(chunks * reduced * w.kept) * sizeof(double)));
      scratch.push_back(ka.partial);
      f.partial = ka.partial;
      f.outputs = reduced;
      f.chunks = static_cast<int>(chunks);
      f.kept = w.kept;
      for (int r = 0; r < reduced; ++r) {
        const DeviceTensor& out = a.out[reduced_output[static_cast<size_t>(r)]];
        if (out.dtype() == DType::f32) continue;
        const TensorType f32{DType::f32, out.shape()};
        const DeviceTensor sums{a.ctx.scratch(f32.bytes()), f32};
        scratch.push_back(sums.data);
        f.out[r] = sums.as<float>();
        casts.push_back(
            prepare_as_step(a, Op::cast, Attrs{{"dtype", std::string(dtype_name(out.dtype()))}}, {sums}, {out}));
      }
    }
    const Launch round = casts.empty() ? Launch() : in_order(casts);
    const dim3 grid(static_cast<unsigned>(bx), static_cast<unsigned>(chunks));
    const dim3 block = cols ? dim3(32, 8) : dim3(256);
    Context* ctx = &a.ctx;
    return Variant{name,
                   [k, ka, grid, block, f, round](cudaStream_t st) {
                     EwArgs copy = ka;
                     void* params[] = {&copy};
                     SEAM_CUDA_CHECK(
                         cudaLaunchKernel(reinterpret_cast<const void*>(k->kernel), grid, block, params, 0, st));
                     if (grid.y > 1) add_partials(f, st);
                     if (round) round(st);
                   },
                   [ctx, scratch] {
                     for (void* p : scratch) ctx->release(p);
                   }};
  };

  // The candidates: the generated kernel; for column sums four columns a thread, also
  // one; and one kernel per op. Where the kernel moves at most half the split's bytes the
  // model rules the split out (fused_clearly_faster); what is left is timed once and the
  // pick cached (choose_variant).
  std::vector<Variant> variants;
  if (auto v = generated(s, args, "fused")) variants.push_back(std::move(*v));
  if (w.layout == EwLayout::columns && s.vec == 4) {
    EwSignature scalar = s;
    scalar.vec = 1;
    scalar.splat.clear();
    // (named "fused" when the vector kernel was ruled out: a forced policy asks for that name)
    if (auto v = generated(scalar, args, variants.empty() ? "fused" : "fused_scalar")) variants.push_back(std::move(*v));
  }
  if (variants.empty()) {
    a.ctx.choices.emplace_back(a.index, "split: the generated kernel was rejected (" + stats + ")");
    return split_variant(a, s.program, os).launch;
  }
  std::vector<TensorType> in_types;
  for (auto& t : a.in) in_types.push_back(t.type);
  const EwTraffic traffic = ew_traffic(prog, in_types, a.step.attrs.ints("axes"), s.out_dtypes);
  const bool model_decides = a.ctx.epilogue == EpiloguePolicy::fastest && fused_clearly_faster(traffic);
  if (model_decides && variants.size() == 1) {
    a.ctx.choices.emplace_back(a.index, "fused (the model: " + traffic.str() + "); generated kernel " + stats);
    return variants.front().launch;
  }
  if (!model_decides) variants.push_back(split_variant(a, s.program, os));
  // The pick is per shape too: chunking and the vector kernel's gain depend on it.
  const std::string pick_key = "fused_elementwise:" + s.hash() + ":n=" + std::to_string(n) +
                               ",kept=" + std::to_string(w.kept) + ",len=" + std::to_string(w.len);
  Launch chosen = choose_variant(a.ctx, a.index, pick_key, std::move(variants));
  a.ctx.choices.back().second += (model_decides ? "; split ruled out by the model: " : "; too close for the model: ") +
                                 traffic.str() + "; generated kernel " + stats;
  return chosen;
}

}  // namespace

void register_fused_elementwise(PreparerTable& t) { set(t, Op::fused_elementwise, prepare_fused_elementwise); }

}  // namespace seam::cuda

namespace seam {

// The kernel as the GPU would get it, assuming aligned operands (alignment is known only
// when prepared); for the GPU present, or sm_90 when there is none. Its figures come from
// the kernel caches where they hold it; compiling needs no GPU.
std::optional<GeneratedKernelReport> generated_kernel_report(const PlanStep& step) {
  if (step.op != Op::fused_elementwise) return std::nullopt;
  std::vector<Shape> shapes;
  for (auto& b : step.in) shapes.push_back(b.type.shape);
  const cuda::Walk w = cuda::walk_of(shapes, step.attrs, nullptr);
  cuda::EwArgs args{};
  cuda::EwSignature s = cuda::signature_of(w, shapes, step.attrs.s("program"), args);
  // The GPU stores f32, bf16 and f16 (an f64 plan is the CPU's alone).
  auto stored = [](DType t) { return t == DType::f32 || is_half(t); };
  for (auto& b : step.in) s.in_dtypes.push_back(b.type.dtype);
  for (auto& b : step.out) s.out_dtypes.push_back(b.type.dtype);
  if (!std::all_of(s.in_dtypes.begin(), s.in_dtypes.end(), stored) ||
      !std::all_of(s.out_dtypes.begin(), s.out_dtypes.end(), stored))
    return std::nullopt;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess)
    s.arch = major * 10 + minor;
  else
    (void)cudaGetLastError();
  const cuda::GeneratedKernel k = cuda::ew_kernel_info(s);
  return GeneratedKernelReport{k.registers, k.spill_bytes, k.shared_bytes, k.compile_ms, k.log};
}

}  // namespace seam
