// seam's Python module (_seam): the C++ API as it is, through nanobind. Graphs, the op
// builders and layers, models and programs; arrays in and out as numpy arrays (and any
// buffer or DLPack producer nanobind accepts), GPU arrays through DLPack without a host
// round trip; seam::Error as seam.Error.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <span>

#include "backend/cpu/gemm.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "train/trainer.h"
#include "seam/nn.h"
#include "seam/seam.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace seam {
namespace {

DType dtype_of(const std::string& name) {
  auto d = parse_dtype(name);
  if (!d) throw nb::value_error(("unknown dtype '" + name + "' (f32, f64, bf16, f16, i32, u8)").c_str());
  return *d;
}

Precision precision_of(const std::string& name) {
  auto p = parse_precision(name);
  if (!p) throw nb::value_error(("unknown precision '" + name + "'").c_str());
  return *p;
}

Device device_of(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") return Device::cuda;
  if (name == "auto") return default_device();
  throw nb::value_error(("unknown device '" + name + "' (cpu, cuda, auto)").c_str());
}

// The numpy dtype of a seam dtype: bf16 reads back as its raw uint16 bits.
nb::dlpack::dtype numpy_dtype(DType d) {
  switch (d) {
    case DType::f64: return nb::dtype<double>();
    case DType::i32: return nb::dtype<int32_t>();
    case DType::u8: return nb::dtype<uint8_t>();
    case DType::bf16:
    case DType::f16: return nb::dtype<uint16_t>();
    default: return nb::dtype<float>();
  }
}

// The exact DLPack dtype of a seam dtype, for arrays that can hold it (GPU arrays, torch):
// bf16 as bfloat16, f16 as float16.
nb::dlpack::dtype dlpack_dtype(DType d) {
  if (d == DType::bf16) return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
  if (d == DType::f16) return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
  return numpy_dtype(d);
}

using Array = nb::ndarray<nb::numpy>;

// A host array holding `bytes` with `shape`, owned by Python.
Array to_numpy(std::vector<std::byte> bytes, const TensorType& t) {
  auto* owner = new std::vector<std::byte>(std::move(bytes));
  nb::capsule free(owner, [](void* p) noexcept { delete static_cast<std::vector<std::byte>*>(p); });
  std::vector<size_t> shape(t.shape.begin(), t.shape.end());
  return Array(owner->data(), shape.size(), shape.data(), free, nullptr, numpy_dtype(t.dtype));
}

// Checks an array against the plan's type of an input: ValueError naming the input, what
// it takes and what came (or the program's inputs, for a name it does not read).
template <class... Ts>
void checked_input(const Program& p, const std::string& name, const nb::ndarray<Ts...>& a) {
  const Binding* b = p.plan().input(name);
  if (!b) {
    std::string known;
    for (auto& i : p.plan().inputs) known += (known.empty() ? "" : ", ") + i.name;
    throw nb::value_error(("no input named '" + name + "' (this program's inputs: " + known + ")").c_str());
  }
  const TensorType& t = b->ref.type;
  std::vector<int64_t> shape(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) shape[i] = static_cast<int64_t>(a.shape(i));
  const bool same_dtype = a.dtype() == numpy_dtype(t.dtype) || a.dtype() == dlpack_dtype(t.dtype);
  if (!same_dtype || shape != t.shape)
    throw nb::value_error(("input '" + name + "' takes " + t.str() + ", got an array of shape " + shape_str(shape) +
                           (same_dtype ? "" : " and another dtype"))
                              .c_str());
}

// An array in the memory of a GPU, through DLPack: its producer makes the program's
// input stream wait for the work that writes it, and the program holds the array until
// its device copy has run. It must be in C order (a device array cannot be made so here).
void set_gpu_input(Program& p, const std::string& name, nb::handle a) {
  void* stream = p.input_stream();
  if (!stream)
    throw nb::value_error(("input '" + name + "': a GPU array, but this program runs on the CPU").c_str());
  nb::object capsule = a.attr("__dlpack__")("stream"_a = reinterpret_cast<uintptr_t>(stream));
  auto arr = nb::cast<nb::ndarray<>>(capsule);
  checked_input(p, name, arr);
  int64_t expect = 1;
  for (size_t i = arr.ndim(); i-- > 0;) {
    if (arr.shape(i) != 1 && arr.stride(i) != expect)
      throw nb::value_error(("input '" + name + "': a GPU array must be contiguous in C order (call .contiguous())").c_str());
    expect *= static_cast<int64_t>(arr.shape(i));
  }
  // Dropped when the slot is next written or the program goes, from C++: take the GIL.
  std::shared_ptr<const void> owner(new nb::ndarray<>(arr), [](const void* q) {
    nb::gil_scoped_acquire gil;
    delete static_cast<const nb::ndarray<>*>(q);
  });
  p.set_input_device(name, arr.data(), arr.nbytes(), std::move(owner));
}

void set_input(Program& p, const std::string& name, nb::handle a) {
  if (nb::hasattr(a, "__dlpack_device__")) {
    const int type = nb::cast<std::pair<int, int>>(a.attr("__dlpack_device__")()).first;
    if (type == nb::device::cuda::value || type == nb::device::cuda_managed::value) return set_gpu_input(p, name, a);
  }
  nb::ndarray<nb::c_contig> host;
  if (!nb::try_cast(a, host))
    throw nb::type_error(("input '" + name + "': expected an array (numpy, or anything with DLPack or the buffer protocol)").c_str());
  if (host.device_type() != nb::device::cpu::value)
    throw nb::value_error(("input '" + name + "': an array on a device seam cannot read").c_str());
  checked_input(p, name, host);
  p.set_input(name, {static_cast<const std::byte*>(host.data()), host.nbytes()});  // set_input copies them
}

// A value read on the GPU as an array exporting DLPack (torch.from_dlpack takes it),
// owning its device memory.
nb::ndarray<> to_gpu_array(DeviceArray a) {
  auto* owner = new std::shared_ptr<std::byte>(std::move(a.data));
  nb::capsule free(owner, [](void* q) noexcept { delete static_cast<std::shared_ptr<std::byte>*>(q); });
  std::vector<size_t> shape(a.type.shape.begin(), a.type.shape.end());
  return nb::ndarray<>(owner->get(), shape.size(), shape.data(), free, nullptr, dlpack_dtype(a.type.dtype),
                       nb::device::cuda::value, a.device);
}

bool on_gpu(const std::string& device) {
  if (device == "cuda") return true;
  if (device == "cpu") return false;
  throw nb::value_error(("device is 'cpu' (a numpy array) or 'cuda' (a GPU array through DLPack), got '" + device + "'").c_str());
}

}  // namespace
}  // namespace seam

NB_MODULE(_seam, m) {
  using namespace seam;
  m.doc() = "seam: compiles a network's whole training step into one plan and runs it";
  m.attr("__version__") = SEAM_VERSION;  // the project's, as `seam --version` prints it
  nb::exception<Error>(m, "Error", PyExc_RuntimeError).attr("__doc__") =
      "A seam error (bad input, a model file, a shape, a device failure) with seam's message naming the place";

  nb::class_<Init>(m, "Init", "How a parameter or state is initialized")
      .def_static("zeros", &Init::zeros, "All zeros")
      .def_static("ones", &Init::ones, "All ones")
      .def_static("constant", &Init::constant, "value"_a, "Every element `value`")
      .def_static("uniform", &Init::uniform, "lo"_a, "hi"_a, "Uniform in [lo, hi), drawn from the model's seed")
      .def_static("normal", &Init::normal, "mean"_a, "stddev"_a, "Normal(mean, stddev), drawn from the model's seed")
      .def_static("fan_in_uniform", &Init::fan_in_uniform, "fan_in"_a,
                   "Uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's default for linear and conv layers")
      .def("__repr__", &Init::str);

  nb::class_<Var>(m, "Var", "A value of a graph: what the op builders take and return")
      .def_prop_ro("shape", [](const Var& v) { return v.shape(); })
      .def_prop_ro("dtype", [](const Var& v) { return std::string(dtype_name(v.dtype())); })
      .def_prop_ro("name", &Var::name)
      .def_prop_ro("id", &Var::id)
      .def("__add__", [](Var a, Var b) { return add(a, b); })
      .def("__sub__", [](Var a, Var b) { return sub(a, b); })
      .def("__mul__", [](Var a, Var b) { return mul(a, b); })
      .def("__mul__", [](Var a, double s) { return scale(a, s); })
      .def("__rmul__", [](Var a, double s) { return scale(a, s); })
      .def("__truediv__", [](Var a, Var b) { return div(a, b); })
      .def("__neg__", [](Var a) { return neg(a); })
      .def("__repr__", [](const Var& v) { return v.graph().describe(v.id()); });

  // A Var keeps its graph alive (it points into it).
  auto ka = nb::keep_alive<0, 1>();
  nb::class_<Graph>(m, "Graph", "A network: inputs, parameters, states and the ops between them")
      .def(nb::init<>())
      .def(
          "input", [](Graph& g, const std::string& n, Shape s, const std::string& d) { return g.input(n, s, dtype_of(d)); },
          "name"_a, "shape"_a, "dtype"_a = "f32", ka, "An input fed each run (Program.set_input)")
      .def(
          "param",
          [](Graph& g, const std::string& n, Shape s, Init init, bool decay) { return g.param(n, s, init, decay); },
          "name"_a, "shape"_a, "init"_a = Init::zeros(), "decay"_a = true, ka, "A trained parameter")
      .def(
          "state", [](Graph& g, const std::string& n, Shape s, Init init) { return g.state(n, s, init); }, "name"_a,
          "shape"_a, "init"_a = Init::zeros(), ka, "A state tensor the step updates (running statistics)")
      .def("verify", &Graph::verify, "Rechecks every node; raises seam.Error")
      .def_prop_ro("num_nodes", [](const Graph& g) { return g.nodes().size(); });

  // The op builders (seam/ops.h), each returning a Var of the operands' graph.
  auto ops = nb::keep_alive<0, 1>();
  m.def("relu", &relu, "x"_a, ops, "max(x, 0)");
  m.def("gelu", &gelu, "x"_a, "tanh_approximation"_a = false, ops, "x * Phi(x), or its tanh approximation");
  m.def("sigmoid", &sigmoid, "x"_a, ops, "1 / (1 + exp(-x))");
  m.def("tanh", &seam::tanh, "x"_a, ops, "tanh(x)");
  m.def("silu", &silu, "x"_a, ops, "x * sigmoid(x)");
  m.def("exp", &seam::exp, "x"_a, ops, "e^x");
  m.def("log", &seam::log, "x"_a, ops, "The natural logarithm");
  m.def("sqrt", &seam::sqrt, "x"_a, ops, "The square root");
  m.def("abs", &seam::abs, "x"_a, ops, "|x| (gradient 0 at 0)");
  m.def("erf", &seam::erf, "x"_a, ops, "The error function");
  m.def("add", &add, "a"_a, "b"_a, ops, "a + b, broadcasting as numpy");
  m.def("sub", &sub, "a"_a, "b"_a, ops, "a - b, broadcasting as numpy");
  m.def("mul", &mul, "a"_a, "b"_a, ops, "a * b, broadcasting as numpy");
  m.def("div", &seam::div, "a"_a, "b"_a, ops, "a / b, broadcasting as numpy");
  m.def("matmul", &matmul, "a"_a, "b"_a, "transpose_a"_a = false, "transpose_b"_a = false, ops,
        "a @ b over the last two dims (either transposed), batched over the leading ones");
  m.def("linear", &seam::linear, "x"_a, "w"_a, "b"_a = nb::none(), ops,
        "x @ w^T + b with w [out, in] (PyTorch's layout); seam.nn.linear makes the parameters");
  m.def("sum", &seam::sum, "x"_a, "axes"_a = std::vector<int64_t>{}, "keepdims"_a = false, ops,
        "The sum over axes (every axis when none are given)");
  m.def("mean", &seam::mean, "x"_a, "axes"_a = std::vector<int64_t>{}, "keepdims"_a = false, ops,
        "The mean over axes (every axis when none are given)");
  m.def("reshape", &reshape, "x"_a, "shape"_a, ops, "The same values in another shape (one dim may be -1)");
  m.def("flatten", &flatten, "x"_a, "start_dim"_a = 1, "end_dim"_a = -1, ops, "Dims start_dim..end_dim merged into one");
  m.def("permute", &permute, "x"_a, "perm"_a, ops, "The dims reordered: output dim i is input dim perm[i]");
  m.def("softmax", &softmax, "x"_a, "axis"_a = -1, ops, "exp(x) / sum(exp(x)) along axis");
  m.def("log_softmax", &log_softmax, "x"_a, "axis"_a = -1, ops, "x - log(sum(exp(x))) along axis");
  m.def("cross_entropy", &cross_entropy, "logits"_a, "labels"_a, "ignore_index"_a = -100, "label_smoothing"_a = 0.0,
        ops,
        "The mean cross-entropy of logits [..., classes] against i32 labels [...], over the labels that are not "
        "ignore_index, as torch.nn.functional.cross_entropy");
  m.def("mse", &mse, "prediction"_a, "target"_a, ops, "The mean of (prediction - target)^2");
  m.def("dropout", &dropout, "x"_a, "p"_a, ops,
        "In training, each element zeroed with probability p and the rest scaled by 1 / (1 - p); the identity "
        "when evaluating");
  m.def("attention", &attention, "q"_a, "k"_a, "v"_a, "causal"_a = false, "scale"_a = nb::none(), "dropout"_a = 0.0,
        ops,
        "softmax(q k^T * scale [+ causal mask]) v over [batch, heads, time, head_dim] (scale 1/sqrt(head_dim) by "
        "default), as torch's scaled_dot_product_attention");
  m.def("attention_qkv", &attention_qkv, "qkv"_a, "causal"_a = false, "scale"_a = nb::none(), "dropout"_a = 0.0, ops,
        "attention of q, k and v packed as one projection writes them, qkv [batch, time, 3, heads, head_dim]; the "
        "output is [batch, time, heads, head_dim], as the output projection reads it");
  m.def("argmax", &argmax, "x"_a, "axis"_a = -1, ops, "The index (i32) of the maximum along axis; no gradient");

  nb::module_ nnm = m.def_submodule("nn", "Layers: builders that create their parameters");
  nnm.def("linear", &nn::linear, "x"_a, "out_features"_a, "name"_a, "bias"_a = true, ops,
          "A linear layer: parameters name.weight [out, in] and name.bias, PyTorch's initialization");
  nnm.def("layer_norm", &nn::layer_norm, "x"_a, "name"_a, "eps"_a = 1e-5, ops,
          "Layer norm over the last dim: parameters name.weight (ones) and name.bias (zeros)");
  nnm.def("batch_norm", &nn::batch_norm, "x"_a, "name"_a, "momentum"_a = 0.1, "eps"_a = 1e-5, ops,
          "Batch norm over dim 1: the batch's statistics in training, the running ones (states name.running_mean, "
          "name.running_var) when evaluating");
  nnm.def("embedding", &nn::embedding, "ids"_a, "num"_a, "dim"_a, "name"_a, ops,
          "Rows of the table name.weight [num, dim] (N(0, 1), as torch.nn.Embedding) at i32 ids; an id outside [0, num) "
          "is an error");
  nnm.def("position_embedding", &nn::position_embedding, "x"_a, "num"_a, "name"_a, ops,
          "x [batch, time, dim] plus a learned row per position: rows 0..time-1 of name.weight [num, dim], N(0, 0.02)");
  nnm.def(
      "conv2d",
      [](Var x, int64_t out, int64_t kernel, const std::string& name, std::vector<int64_t> stride,
         std::vector<int64_t> padding, bool bias) {
        Conv2dOptions o;
        o.stride = std::move(stride), o.padding = std::move(padding);
        return nn::conv2d(x, out, kernel, name, o, bias);
      },
      "x"_a, "out_channels"_a, "kernel"_a, "name"_a, "stride"_a = std::vector<int64_t>{1, 1},
      "padding"_a = std::vector<int64_t>{0, 0}, "bias"_a = true, ops,
      "A 2-d convolution over NCHW: parameters name.weight [out, in, k, k] and name.bias, PyTorch's initialization");

  nb::class_<OptimizerConfig>(m, "Optimizer", "An optimizer and its settings (seam.SGD, seam.Adam, seam.AdamW)")
      .def_rw("lr", &OptimizerConfig::lr)
      .def_rw("weight_decay", &OptimizerConfig::weight_decay)
      .def_rw("clip_norm", &OptimizerConfig::clip_norm)
      .def("__repr__", &OptimizerConfig::str);
  m.def("SGD", [](double lr, double momentum, bool nesterov, double weight_decay) {
    OptimizerConfig c = OptimizerConfig::sgd(lr, momentum, nesterov);
    c.weight_decay = weight_decay;
    return c;
  }, "lr"_a, "momentum"_a = 0.0, "nesterov"_a = false, "weight_decay"_a = 0.0,
    "SGD with optional (Nesterov) momentum and L2 weight decay, as torch.optim.SGD");
  m.def("Adam", [](double lr, std::vector<double> betas, double eps) {
    return OptimizerConfig::adam(lr, betas.at(0), betas.at(1), eps);
  }, "lr"_a = 1e-3, "betas"_a = std::vector<double>{0.9, 0.999}, "eps"_a = 1e-8, "Adam, as torch.optim.Adam");
  m.def("AdamW", [](double lr, double weight_decay, std::vector<double> betas, double clip_norm) {
    OptimizerConfig c = OptimizerConfig::adamw(lr, weight_decay);
    c.beta1 = betas.at(0), c.beta2 = betas.at(1), c.clip_norm = clip_norm;
    return c;
  }, "lr"_a = 1e-3, "weight_decay"_a = 0.01, "betas"_a = std::vector<double>{0.9, 0.999}, "clip_norm"_a = 0.0,
    "AdamW (decoupled weight decay, as torch.optim.AdamW); clip_norm > 0 clips the global gradient norm first");

  nb::class_<Program>(m, "Program", "A compiled step: set its inputs, run it, read its outputs")
      .def("set_input", &set_input, "name"_a, "array"_a,
           "Copies an array into an input: numpy or any host array, or a GPU array through DLPack (a torch CUDA "
           "tensor), copied on the device after the work its producer queued. ValueError if its dtype or shape "
           "is not the input's")
      .def("run", &Program::run, nb::call_guard<nb::gil_scoped_release>(), "Runs the step once")
      .def("check", &Program::check, nb::call_guard<nb::gil_scoped_release>(),
           "Waits for the work queued so far and raises the first bad-input error a kernel reported")
      .def(
          "_run_many",
          [](Program& p, int64_t n) {
            const auto start = std::chrono::steady_clock::now();
            for (int64_t i = 0; i < n; ++i) p.run();
            p.check();
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          },
          nb::call_guard<nb::gil_scoped_release>(), "n"_a,
          "Runs the step n times from C++ and returns the seconds taken, the work included: the "
          "baseline against which bench/python_overhead.py measures the binding's cost per run")
      .def(
          "read",
          [](const Program& p, const std::string& name, const std::string& device) -> nb::object {
            if (on_gpu(device)) return nb::cast(to_gpu_array(p.read_device(name)));
            std::vector<std::byte> bytes = p.read(name);  // names the outputs when there is no such one
            return nb::cast(to_numpy(std::move(bytes), p.output_type(name)));
          },
          "name"_a, "device"_a = "cpu",
          "An output as a new numpy array, or with device='cuda' a new GPU array (DLPack: torch.from_dlpack takes "
          "it) copied on the device")
      .def(
          "read_grad",
          [](const Program& p, const std::string& name, const std::string& device) -> nb::object {
            if (on_gpu(device)) return nb::cast(to_gpu_array(p.read_grad_device(name)));
            std::vector<std::byte> bytes = p.read_grad(name);  // fails naming it when there is no such gradient
            const Slot* s = p.plan().layout.param(name);
            const TensorType& g = p.plan().grad(name)->ref.type;
            return nb::cast(to_numpy(std::move(bytes), TensorType{g.dtype, s ? s->user_type().shape : g.shape}));
          },
          "param"_a, "device"_a = "cpu", "A parameter's gradient from the last run (device as for read)")
      .def_prop_ro("plan", [](const Program& p) { return p.plan().str(); }, "The plan, as `seam plan` prints it")
      .def_prop_ro("inputs", [](const Program& p) {
        std::vector<std::string> r;
        for (auto& b : p.plan().inputs) r.push_back(b.name);
        return r;
      })
      .def_prop_ro("outputs", [](const Program& p) {
        std::vector<std::string> r;
        for (auto& b : p.plan().outputs) r.push_back(b.name);
        return r;
      });

  nb::class_<Model>(m, "Model", "A graph with its parameters on a device, ready to compile")
      .def(
          "__init__",
          [](Model* self, const Graph& g, uint64_t seed, const std::string& device, const std::string& precision,
             bool deterministic) {
            new (self) Model(g, {.seed = seed,
                                 .device = device_of(device),
                                 .precision = precision_of(precision),
                                 .deterministic = deterministic});
          },
          "graph"_a, "seed"_a = 0, "device"_a = "auto", "precision"_a = "f32", "deterministic"_a = false,
          "deterministic: bitwise repeatable GPU steps (fixed algorithm picks, no atomics)")
      .def(
          "compile",
          [](Model& m, std::optional<Var> loss, std::optional<OptimizerConfig> optimizer, std::vector<Var> outputs,
             const std::string& mode, bool fuse, std::vector<std::string> recompute,
             std::optional<double> memory_budget_gib, int output_chunks) {
            CompileOptions o;
            if (output_chunks < 1) throw nb::value_error("output_chunks must be at least 1");
            o.output_chunks = output_chunks;
            if (memory_budget_gib && !(*memory_budget_gib > 0))
              throw nb::value_error("memory_budget_gib must be a positive number of GiB");
            if (mode != "train" && mode != "eval") throw nb::value_error("mode is 'train' or 'eval'");
            o.mode = mode == "eval" ? Mode::eval : Mode::train;
            if (loss) o.loss = loss->id();
            o.optimizer = optimizer;
            // Without an optimizer the gradients are the program's results; with one they
            // feed the update and stay readable (read_grad) either way.
            o.gradients = loss.has_value() && !optimizer.has_value();
            for (Var v : outputs) o.outputs.push_back(v.id());
            o.fuse = fuse;
            o.recompute = std::move(recompute);
            if (memory_budget_gib) o.memory_budget = static_cast<size_t>(*memory_budget_gib * 1073741824.0);
            return m.compile(o);
          },
          "loss"_a = nb::none(), "optimizer"_a = nb::none(), "outputs"_a = std::vector<Var>{}, "mode"_a = "train",
          "fuse"_a = true, "recompute"_a = std::vector<std::string>{}, "memory_budget_gib"_a = nb::none(),
          "output_chunks"_a = 1, nb::keep_alive<0, 1>(),
          "A program: the step that trains on loss, or evaluates outputs. recompute: activations the backward "
          "computes again instead of keeping ('gelu', 'layer_norm'); memory_budget_gib: the GiB the model's buffers "
          "and the step's arena may take, the compiler splitting the output layer, then recomputing the fewest outputs "
          "that fit (Program.plan says which); output_chunks: the output layer (logits, loss, their gradient) in that "
          "many chunks of rows")
      .def(
          "read_param",
          [](const Model& m, const std::string& name) {
            const Slot* s = m.layout().param(name);
            if (!s) throw nb::value_error(("no parameter named '" + name + "'").c_str());
            return to_numpy(m.read_param(name), s->user_type());
          },
          "name"_a, "A parameter's values as a new numpy array")
      .def(
          "write_param",
          [](Model& m, const std::string& name, nb::ndarray<nb::c_contig> a) {
            const Slot* s = m.layout().param(name);
            if (!s) throw nb::value_error(("no parameter named '" + name + "'").c_str());
            const TensorType t = s->user_type();
            if (a.nbytes() != t.bytes() || a.dtype() != numpy_dtype(t.dtype))
              throw nb::value_error(("parameter '" + name + "' is " + t.str() + ", the array does not fit").c_str());
            m.write_param(name, std::span<const std::byte>(static_cast<const std::byte*>(a.data()), a.nbytes()));
          },
          "name"_a, "array"_a, "Overwrites a parameter")
      .def(
          "save",
          [](const Model& m, const std::string& path) {
            io::write_safetensors(path, {{{"format", "seam-tensors-1"}}, m.save_tensors()});
          },
          "path"_a,
          "Writes every parameter, state and optimizer moment to a safetensors file (a temporary file, synced and "
          "renamed), by name")
      .def(
          "load",
          [](Model& m, const std::string& path) { m.load_tensors(io::read_safetensors(path).tensors); },
          "path"_a, "Restores what save wrote; a file that does not fit changes nothing and raises seam.Error")
      .def_prop_ro("param_names", [](const Model& m) {
        std::vector<std::string> r;
        for (auto& s : m.layout().params) r.push_back(s.name);
        return r;
      })
      .def_prop_ro("device", [](const Model& m) { return std::string(device_name(m.device())); })
      .def_prop_ro("parameters", [](const Model& m) { return m.layout().param_count(); });

  nb::class_<io::BuiltGraph>(m, "BuiltModel", "A model file's graph at a batch size: x, y, logits, loss")
      .def_prop_ro("graph", [](io::BuiltGraph& b) -> Graph& { return b.graph; }, nb::rv_policy::reference_internal)
      .def_prop_ro("x", [](io::BuiltGraph& b) { return b.graph.var(b.x); }, nb::keep_alive<0, 1>())
      .def_prop_ro("y", [](io::BuiltGraph& b) { return b.graph.var(b.y); }, nb::keep_alive<0, 1>())
      .def_prop_ro("logits", [](io::BuiltGraph& b) { return b.graph.var(b.logits); }, nb::keep_alive<0, 1>())
      .def_prop_ro("loss", [](io::BuiltGraph& b) { return b.graph.var(b.loss); }, nb::keep_alive<0, 1>());
  nb::class_<io::ModelSpec>(m, "ModelFile", "A parsed, checked model file")
      .def_ro("name", &io::ModelSpec::name)
      .def_ro("batch_size", &io::ModelSpec::batch_size)
      .def_ro("classes", &io::ModelSpec::classes)
      .def_ro("optimizer", &io::ModelSpec::optimizer)
      .def("build", [](const io::ModelSpec& s, std::optional<int64_t> batch) {
        return io::build_graph(s, batch.value_or(s.batch_size));
      }, "batch"_a = nb::none(), "The model's graph (x, y, logits, loss) at a batch size, the file's by default");
  m.def("load_model_file", &io::parse_model_file, "path"_a, "Parses and checks a model file; raises seam.Error");
  m.def(
      "_train",
      [](const std::string& model_file, std::optional<int64_t> epochs, std::optional<int64_t> batch,
         std::optional<double> lr, std::optional<std::string> device, std::optional<std::string> precision,
         std::optional<std::string> data, std::optional<std::string> out, std::optional<std::string> resume,
         int64_t max_steps, int64_t limit_train, bool quiet, nb::object progress) {
        train::TrainOptions o;
        o.model_path = model_file;
        o.epochs = epochs, o.batch = batch, o.lr = lr, o.device = device, o.resume = resume;
        if (precision) o.precision = precision_of(*precision);
        o.data_dir = data.value_or("");
        o.out_dir = out.value_or("");
        o.max_steps = max_steps;
        o.limit_train = limit_train;
        o.output = quiet ? train::Output::quiet : train::Output::bar;
        if (!progress.is_none())
          o.on_progress = [progress](const train::ProgressEvent& e) {
            nb::gil_scoped_acquire gil;  // the training loop runs without the GIL
            progress(e.epoch, e.epochs, e.done, e.total, e.loss, e.accuracy);
          };
        nb::gil_scoped_release release;
        return train::run_train(o);
      },
      "model_file"_a, "epochs"_a = nb::none(), "batch"_a = nb::none(), "lr"_a = nb::none(), "device"_a = nb::none(),
      "precision"_a = nb::none(), "data"_a = nb::none(), "out"_a = nb::none(), "resume"_a = nb::none(),
      "max_steps"_a = 0, "limit_train"_a = 0, "quiet"_a = false, "progress"_a = nb::none(),
      "Trains a model file as `seam train` does (progress, metrics.csv, checkpoints in out, default "
      "runs/<name>); returns the exit status (0, or 130 / 143 when stopped by SIGINT / SIGTERM). progress(epoch, epochs, done, total, "
      "loss, accuracy), if given, replaces the terminal bar");
  m.def("cuda_available", [] { return default_device() == Device::cuda; },
        "Whether this build has the CUDA backend and a GPU it can use (device='auto' picks it)");
  m.def("gemm_library", &cpu::gemm_library, "What runs the CPU's GEMMs (as `seam --version` says)");
  m.def(
      "_blas_core_override",
      [] {
        const char* c = cpu::blas_core_override();
        return std::string(c ? c : "");
      },
      "The OPENBLAS_CORETYPE the CLI would set and run again with (src/backend/cpu/gemm.h), or ''");
}
