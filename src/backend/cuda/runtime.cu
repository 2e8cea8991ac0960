// The CUDA backend: device memory from a stream-ordered pool, library handles, and the
// executable that enqueues a prepared plan's launches on one compute stream.
#include <cublasLt.h>
#include <cudnn.h>

#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "backend/cuda/check.h"
#include "backend/cuda/storage.cuh"
#include "backend/cuda/cuda.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/optim.h"
#include "backend/cuda/shared.h"
#include "dist/comm.h"

namespace seam::cuda {

Context::~Context() {
  for (void* p : scratch_) cudaFree(p);
  for (void* p : lane_workspace_)
    if (p) cudaFree(p);
}

void* Context::scratch(size_t bytes) {
  void* p = nullptr;
  SEAM_ASSERT(stream != nullptr);
  SEAM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  // On the stream that runs the steps: the legacy default stream does not order work on
  // non-blocking streams, and counters such as the optimizer's `done` must read zero.
  SEAM_CUDA_CHECK(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 16), stream));
  scratch_.push_back(p);
  scratch_sizes_.push_back(std::max<size_t>(bytes, 16));
  return p;
}

size_t Context::device_bytes() const {
  size_t n = 0;
  for (size_t b : lane_workspace_size_) n += b;
  for (size_t b : scratch_sizes_) n += b;
  return n;
}

void Context::release(void* p) {
  auto it = std::find(scratch_.begin(), scratch_.end(), p);
  SEAM_ASSERT(it != scratch_.end());
  scratch_sizes_.erase(scratch_sizes_.begin() + (it - scratch_.begin()));
  scratch_.erase(it);
  SEAM_CUDA_CHECK(cudaStreamSynchronize(stream));  // a timed launch may still use it
  SEAM_CUDA_CHECK(cudaFree(p));
}

namespace {

// (Re)allocates one lane's workspace at `bytes`; a launch timed earlier may still use the old one.
void resize_workspace(void*& p, size_t& size, size_t bytes, cudaStream_t stream) {
  if (bytes == size) return;
  if (p) {
    SEAM_CUDA_CHECK(cudaStreamSynchronize(stream));
    SEAM_CUDA_CHECK(cudaFree(p));
    p = nullptr;
  }
  size = 0;
  if (bytes) SEAM_CUDA_CHECK(cudaMalloc(&p, bytes));
  size = bytes;
}

}  // namespace

void Context::set_lanes(const std::vector<int>& lane_of, int count) {
  SEAM_ASSERT(!lanes_set_ && count >= 1);
  lanes_set_ = true;
  std::vector<size_t> need(static_cast<size_t>(count), 0);
  need[0] = outside_need_;
  for (size_t j = 0; j < step_need_.size(); ++j) {
    const size_t l = j < lane_of.size() ? static_cast<size_t>(lane_of[j]) : 0;
    SEAM_ASSERT(l < need.size());
    need[l] = std::max(need[l], step_need_[j]);
  }
  lane_workspace_.resize(need.size(), nullptr);
  lane_workspace_size_.resize(need.size(), 0);
  for (size_t l = 0; l < need.size(); ++l)
    resize_workspace(lane_workspace_[l], lane_workspace_size_[l], need[l], stream);
}

void Context::need_workspace(size_t bytes) {
  SEAM_ASSERT(!lanes_set_ || preparing_ < 0);  // every step states its need while prepared; later work runs on lane 0
  if (preparing_ < 0) {
    outside_need_ = std::max(outside_need_, bytes);
  } else {
    if (step_need_.size() <= static_cast<size_t>(preparing_)) step_need_.resize(static_cast<size_t>(preparing_) + 1, 0);
    step_need_[static_cast<size_t>(preparing_)] = std::max(step_need_[static_cast<size_t>(preparing_)], bytes);
  }
  if (bytes > lane_workspace_size_[0]) resize_workspace(lane_workspace_[0], lane_workspace_size_[0], bytes, stream);
}

void Context::set_workspace_need(size_t bytes) {
  SEAM_ASSERT(preparing_ >= 0 && !lanes_set_);
  if (step_need_.size() <= static_cast<size_t>(preparing_)) step_need_.resize(static_cast<size_t>(preparing_) + 1, 0);
  step_need_[static_cast<size_t>(preparing_)] = bytes;
  need_workspace(bytes);
}

size_t Context::workspace_need() const {
  SEAM_ASSERT(preparing_ >= 0);
  return static_cast<size_t>(preparing_) < step_need_.size() ? step_need_[static_cast<size_t>(preparing_)] : 0;
}

Launch prepare_as_step(const StepArgs& a, Op op, Attrs attrs, std::vector<DeviceTensor> in,
                       std::vector<DeviceTensor> out) {
  PlanStep s{op, std::move(attrs), {}, {}, a.step.name, 0};
  StepArgs sub{s, a.index, std::move(in), std::move(out), a.ctx};
  return preparer_for(op)(sub);
}

std::string cache_root() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/') return std::string(xdg) + "/seam";
  const char* home = std::getenv("HOME");
  if (home && home[0] == '/') return std::string(home) + "/.cache/seam";
  return {};
}

Launch in_order(std::vector<Launch> parts) {
  return [parts](cudaStream_t s) {
    for (const Launch& l : parts) l(s);
  };
}

namespace {

PreparerTable build() {
  PreparerTable t(static_cast<size_t>(kNumOps), nullptr);
  register_elementwise(t);
  register_reduce(t);
  register_shape(t);
  register_misc(t);
  register_matmul(t);
  register_softmax(t);
  register_loss(t);
  register_norm(t);
  register_batch_norm(t);
  register_conv(t);
  register_conv_bn(t);
  register_pool(t);
  register_attention(t);
  register_fused_elementwise(t);
  return t;
}

}  // namespace

Preparer preparer_for(Op op) {
  static const PreparerTable table = build();
  Preparer p = table.at(static_cast<size_t>(op));
  if (!p) fail("the CUDA backend has no kernel for ", op_name(op));
  return p;
}

void expect_f32(const StepArgs& a, std::initializer_list<IntOperand> integers) {
  for (auto* list : {&a.in, &a.out})
    for (size_t i = 0; i < list->size(); ++i) {
      const DeviceTensor& t = (*list)[i];
      DType want = DType::f32;
      for (const IntOperand& o : integers)
        if (o.tensor == &t) want = o.dtype;
      if (t.dtype() != want)
        fail(op_name(a.step.op), " '", a.step.name, "': the CUDA kernel takes ", dtype_name(want), " for ",
             list == &a.in ? "input " : "output ", i, ", got ", t.type.str());
    }
}

void expect_dtype(const StepArgs& a, const DeviceTensor& t, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype() == d) return;
  const bool input = &t >= a.in.data() && &t < a.in.data() + a.in.size();
  const auto index = input ? &t - a.in.data() : &t - a.out.data();
  std::string names;
  for (DType d : allowed) names += std::string(names.empty() ? "" : ", ") + dtype_name(d);
  fail(op_name(a.step.op), " '", a.step.name, "': the CUDA kernel takes ", names, " for ", input ? "input " : "output ",
       index, ", got ", t.type.str());
}

DType expect_one_stored_dtype(const StepArgs& a, std::initializer_list<DType> allowed) {
  const DeviceTensor& first = a.in.empty() ? a.out.at(0) : a.in[0];
  expect_dtype(a, first, allowed);
  for (auto* list : {&a.in, &a.out})
    for (const DeviceTensor& t : *list) expect_dtype(a, t, {first.dtype()});
  return first.dtype();
}

namespace {

template <class T>
__global__ void round_kernel(T* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = from_float<T>(src[i]);
}

// dst[i] = src[i] * scale in T, i running over NCHW order, src holding the value
// channels-last (c channels, hw pixels an image); with c = hw = 1 both orders are one.
template <class F, class T>
__global__ void convert_kernel(T* __restrict__ dst, const F* __restrict__ src, int64_t n, int64_t c, int64_t hw,
                               float scale) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = i % hw, ch = i / hw % c, img = i / (hw * c);
    dst[i] = from_float<T>(to_float(src[(img * hw + p) * c + ch]) * scale);  // x * 1 is x
  }
}

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(CudaOptions o) : sh_(std::make_shared<Shared>()) {
    sh_->tf32 = o.tf32;
    sh_->graph = o.graph;
    sh_->epilogue = o.epilogue;
    sh_->deterministic = o.deterministic;
    const int device = local_device();  // one GPU a rank where a launcher started several
    sh_->device = device;
    SEAM_CUDA_CHECK(cudaSetDevice(device));
    SEAM_CUDA_CHECK(cudaStreamCreateWithFlags(&sh_->stream, cudaStreamNonBlocking));
    SEAM_CUDA_CHECK(cudaStreamCreateWithFlags(&sh_->copy_stream, cudaStreamNonBlocking));
    SEAM_ASSERT(o.streams >= 1 && o.streams <= 16);  // Model checks ModelOptions::cuda_streams
    sh_->lanes.push_back(sh_->stream);
    for (int i = 1; i < o.streams; ++i) {
      cudaStream_t s = nullptr;
      SEAM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      sh_->lanes.push_back(s);
    }
    SEAM_CUBLAS_CHECK(cublasLtCreate(&sh_->lt));
    SEAM_CUDNN_CHECK(cudnnCreate(&sh_->dnn));
    SEAM_CUDNN_CHECK(cudnnSetStream(sh_->dnn, sh_->stream));
    SEAM_CUDA_CHECK(cudaDeviceGetAttribute(&sh_->sm_count, cudaDevAttrMultiProcessorCount, device));
    sh_->gemm_cache = std::make_unique<GemmCache>();
  }
  ~CudaBackend() override { cudaStreamSynchronize(sh_->stream); }

  const char* name() const override { return "cuda"; }

  std::byte* alloc(size_t bytes) override {
    void* p = nullptr;
    cudaError_t e = cudaMallocAsync(&p, std::max<size_t>(bytes, 256), sh_->stream);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      fail("out of GPU memory: asked for ", bytes, " bytes with ", free, " of ", total, " bytes free");
    }
    SEAM_CUDA_CHECK(e);
    SEAM_CUDA_CHECK(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 256), sh_->stream));
    SEAM_CUDA_CHECK(cudaStreamSynchronize(sh_->stream));
    return static_cast<std::byte*>(p);
  }
  void release(std::byte* p) override {
    if (p) cudaFreeAsync(p, sh_->stream);
  }
  void upload(std::byte* dst, const void* src, size_t bytes) override {
    SEAM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, sh_->stream));
    SEAM_CUDA_CHECK(cudaStreamSynchronize(sh_->stream));  // src may be gone when we return
  }
  void download(void* dst, const std::byte* src, size_t bytes) override {
    SEAM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, sh_->stream));
    SEAM_CUDA_CHECK(cudaStreamSynchronize(sh_->stream));
  }
  void fill_zero(std::byte* dst, size_t bytes) override {
    SEAM_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, sh_->stream));
  }
  int device_index() const override { return sh_->device; }
  std::shared_ptr<std::byte> alloc_exported(size_t bytes) override {
    void* p = nullptr;
    // cudaMalloc, not the stream-ordered pool: another library's streams use it, and
    // cudaFree waits for the device, so work they queued on it finishes first.
    cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      fail("out of GPU memory: asked for ", bytes, " bytes for a value read on the device");
    }
    SEAM_CUDA_CHECK(e);
    return {static_cast<std::byte*>(p), [](std::byte* q) { cudaFree(q); }};
  }
  void copy_converted(std::byte* dst, DType to, const std::byte* src, DType from, const Shape& shape, bool nhwc,
                      float scale) override {
    const int64_t n = numel(shape);
    if (to == from && !nhwc && scale == 1.0f) {
      SEAM_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(to), cudaMemcpyDeviceToDevice,
                                      sh_->stream));
    } else {
      SEAM_ASSERT(!nhwc || shape.size() == 4);
      const int64_t c = nhwc ? shape[1] : 1, hw = nhwc ? shape[2] * shape[3] : 1;
      const unsigned blocks = blocks_for(n, 256, 65535);
      dispatch_storage(from, "reading a value on the device", [&]<class F>() {
        dispatch_storage(to, "reading a value on the device", [&]<class T>() {
          convert_kernel<F, T><<<blocks, 256, 0, sh_->stream>>>(reinterpret_cast<T*>(dst),
                                                                 reinterpret_cast<const F*>(src), n, c, hw, scale);
        });
      });
      SEAM_CUDA_LAUNCH_CHECK();
    }
    SEAM_CUDA_CHECK(cudaStreamSynchronize(sh_->stream));
  }
  void round_f32(std::byte* dst, DType to, const std::byte* src, size_t n) override {
    const auto* f = reinterpret_cast<const float*>(src);
    const unsigned blocks = blocks_for(static_cast<int64_t>(n), 256, 65535);
    dispatch_storage(to, "round_f32", [&]<class T>() {
      if constexpr (std::is_same_v<T, float>) fail("round_f32: the target must be bf16 or f16");
      else round_kernel<T><<<blocks, 256, 0, sh_->stream>>>(reinterpret_cast<T*>(dst), f, static_cast<int64_t>(n));
    });
    SEAM_CUDA_LAUNCH_CHECK();
  }
  std::unique_ptr<Executable> prepare(const Plan& plan, const Regions& r) override {
    if (!plan.buckets.empty()) {
      if (!r.comm || r.comm->size() != plan.ranks)
        fail("the plan sums its gradients over ", plan.ranks, " ranks, but runs in a group of ", r.comm ? r.comm->size() : 1);
      if (!sh_->nccl) {
        sh_->nccl = std::make_unique<Nccl>(*r.comm);
        SEAM_CUDA_CHECK(cudaStreamCreateWithFlags(&sh_->comm_stream, cudaStreamNonBlocking));
      } else if (&sh_->nccl->host() != r.comm) {
        fail("a model's plans sum their gradients over one group of ranks");
      }
    }
    return make_executable(sh_, plan, r);
  }

 private:
  std::shared_ptr<Shared> sh_;
};

}  // namespace

}  // namespace seam::cuda

namespace seam {

bool cuda_available(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return true;
  cudaGetLastError();  // clear it, so later calls start clean
  if (why)
    *why = e != cudaSuccess ? std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"
                            : std::string("no CUDA device found");
  return false;
}

std::optional<size_t> cuda_device_used_bytes() {
  if (!cuda_available()) return std::nullopt;
  size_t free = 0, total = 0;
  SEAM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return total - free;
}

std::optional<std::string> cuda_pci_bus_id() {
  if (!cuda_available()) return std::nullopt;
  int dev = 0;
  char bus[32] = {};
  SEAM_CUDA_CHECK(cudaGetDevice(&dev));
  SEAM_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, dev));
  return std::string(bus);
}

std::shared_ptr<Backend> make_cuda_backend(CudaOptions options) {
  std::string why;
  if (!cuda_available(&why)) fail("no usable GPU: ", why);
  return std::make_shared<cuda::CudaBackend>(options);
}

}  // namespace seam
