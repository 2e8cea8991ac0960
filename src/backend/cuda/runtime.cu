// The CUDA backend: device memory from a stream-ordered pool, library handles, and the
// executable that enqueues a prepared plan's launches on one compute stream.
#include <cublasLt.h>
#include <cudnn.h>

#include <cstring>

#include "backend/backend.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/optim.h"

namespace seam::cuda {

Context::~Context() {
  for (void* p : scratch_) cudaFree(p);
  if (workspace_) cudaFree(workspace_);
}

void* Context::scratch(size_t bytes) {
  void* p = nullptr;
  SEAM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  SEAM_CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(bytes, 16)));
  scratch_.push_back(p);
  return p;
}

void Context::finish_prepare() {
  if (workspace_need_ > 0) {
    SEAM_CUDA_CHECK(cudaMalloc(&workspace_, workspace_need_));
    workspace_size_ = workspace_need_;
  }
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
  register_pool(t);
  return t;
}

std::string error_message(const DeviceError& e, const Plan& plan) {
  std::string where = e.step >= 0 && e.step < static_cast<int>(plan.steps.size())
                          ? "step " + std::to_string(e.step) + " (" + op_name(plan.steps[static_cast<size_t>(e.step)].op) +
                                " '" + plan.steps[static_cast<size_t>(e.step)].name + "')"
                          : "a kernel";
  switch (e.code) {
    case kEmbeddingId:
      return where + ": id " + std::to_string(e.b) + " at position " + std::to_string(e.a) + " is outside [0, " +
             std::to_string(e.c) + ")";
    case kLabelRange:
      return where + ": label " + std::to_string(e.b) + " of row " + std::to_string(e.a) + " is outside [0, " +
             std::to_string(e.c) + ") and is not ignore_index";
    default:
      return where + ": device error code " + std::to_string(e.code);
  }
}

}  // namespace

Preparer preparer_for(Op op) {
  static const PreparerTable table = build();
  Preparer p = table.at(static_cast<size_t>(op));
  if (!p) fail("the CUDA backend has no kernel for ", op_name(op));
  return p;
}

void expect_f32(const StepArgs& a) {
  for (auto* list : {&a.in, &a.out})
    for (auto& t : *list)
      if (t.dtype() != DType::f32 && t.dtype() != DType::i32 && t.dtype() != DType::u8)
        fail(op_name(a.step.op), " '", a.step.name, "': the CUDA backend computes in f32, got ", t.type.str());
}

namespace {

struct Shared {
  bool tf32 = true;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  cudnnHandle_t dnn = nullptr;
  int sm_count = 0;
  std::unique_ptr<GemmCache> gemm_cache;
  ~Shared() {
    if (dnn) cudnnDestroy(dnn);
    if (lt) cublasLtDestroy(lt);
    if (stream) cudaStreamDestroy(stream);
  }
};

class CudaExecutable : public Executable {
 public:
  CudaExecutable(std::shared_ptr<Shared> sh, const Plan& plan, const Regions& r) : sh_(std::move(sh)), plan_(plan), r_(r) {
    ctx_.stream = sh_->stream;
    ctx_.cublaslt = sh_->lt;
    ctx_.cudnn = sh_->dnn;
    ctx_.gemm_cache = sh_->gemm_cache.get();
    ctx_.tf32 = sh_->tf32;
    ctx_.sm_count = sh_->sm_count;
    ctx_.counters = reinterpret_cast<DeviceCounters*>(r.counters);
    ctx_.error = reinterpret_cast<DeviceError*>(ctx_.scratch(sizeof(DeviceError)));
    clear_error_ = {-1, kNoError, 0, 0, 0};
    SEAM_CUDA_CHECK(cudaMemcpy(ctx_.error, &clear_error_, sizeof(DeviceError), cudaMemcpyHostToDevice));
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      const PlanStep& s = plan.steps[i];
      StepArgs a{s, static_cast<int>(i), {}, {}, ctx_};
      for (auto& b : s.in) a.in.push_back({r.base(b.region) + b.offset, b.type});
      for (auto& b : s.out) a.out.push_back({r.base(b.region) + b.offset, b.type});
      launches_.push_back(preparer_for(s.op)(a));
    }
    if (plan.optimizer) launches_.push_back(prepare_optimizer(*plan.optimizer, plan.layout, r, ctx_));
    ctx_.finish_prepare();
  }

  void run(StepState& state) override {
    StepState& dev = *r_.synced;
    if (dev.step != state.step || dev.seed != state.seed) {  // set on the host (reset, resume)
      DeviceCounters c{state.step, state.seed, 0.0f, 0.0f};
      SEAM_CUDA_CHECK(cudaMemcpyAsync(ctx_.counters, &c, sizeof c, cudaMemcpyHostToDevice, sh_->stream));
      SEAM_CUDA_CHECK(cudaStreamSynchronize(sh_->stream));  // c lives on this stack frame
      dev.step = state.step;
      dev.seed = state.seed;
    }
    for (auto& l : launches_) l(sh_->stream);
    SEAM_CUDA_LAUNCH_CHECK();
    if (plan_.optimizer) {
      // The device advanced its counter; the host mirrors it without reading it back.
      state.lr = plan_.optimizer->schedule.lr_at(plan_.optimizer->lr, state.step);
      ++state.step;
      dev.step = state.step;
    }
  }

  void check() override {
    DeviceError e{};
    SEAM_CUDA_CHECK(cudaMemcpyAsync(&e, ctx_.error, sizeof e, cudaMemcpyDeviceToHost, sh_->stream));
    SEAM_CUDA_CHECK(cudaStreamSynchronize(sh_->stream));
    if (e.code != kNoError) {
      SEAM_CUDA_CHECK(cudaMemcpy(ctx_.error, &clear_error_, sizeof(DeviceError), cudaMemcpyHostToDevice));
      fail(error_message(e, plan_));
    }
  }

 private:
  std::shared_ptr<Shared> sh_;
  const Plan& plan_;
  Regions r_;
  Context ctx_;
  DeviceError clear_error_;
  std::vector<Launch> launches_;
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(bool tf32) : sh_(std::make_shared<Shared>()) {
    sh_->tf32 = tf32;
    SEAM_CUDA_CHECK(cudaSetDevice(0));
    SEAM_CUDA_CHECK(cudaStreamCreateWithFlags(&sh_->stream, cudaStreamNonBlocking));
    SEAM_CUBLAS_CHECK(cublasLtCreate(&sh_->lt));
    SEAM_CUDNN_CHECK(cudnnCreate(&sh_->dnn));
    SEAM_CUDNN_CHECK(cudnnSetStream(sh_->dnn, sh_->stream));
    SEAM_CUDA_CHECK(cudaDeviceGetAttribute(&sh_->sm_count, cudaDevAttrMultiProcessorCount, 0));
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
  std::unique_ptr<Executable> prepare(const Plan& plan, const Regions& r) override {
    return std::make_unique<CudaExecutable>(sh_, plan, r);
  }

 private:
  std::shared_ptr<Shared> sh_;
};

}  // namespace

}  // namespace seam::cuda

namespace seam {

std::shared_ptr<Backend> make_cuda_backend(bool tf32) {
  std::string why;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    fail("no usable GPU: ", e != cudaSuccess ? std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"
                                             : std::string("no CUDA device found"));
  }
  return std::make_shared<cuda::CudaBackend>(tf32);
}

}  // namespace seam
