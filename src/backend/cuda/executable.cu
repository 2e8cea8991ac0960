// A prepared plan on the GPU. Each step's launches are replayed as one CUDA Graph
// (captured at the first run; `graph = false` keeps eager launches). Inputs are staged:
// set_input copies into pinned host memory and uploads on a copy stream into one of two
// landing buffers, so the next batch's upload overlaps the step in flight; the step
// starts by copying its landing buffer into the arena (a device copy, inside the graph)
// and events order the rest. Everything that changes between steps is read from device
// memory, so the graph stays valid for the whole run.
//
// Independent steps run side by side: step_dependencies and schedule_lanes (plan.h) put
// each step on one of the backend's streams (lanes), with event waits for what it needs
// from other lanes; captured, that is a graph with parallel branches. Each lane has its
// own workspace. The optimizer update runs after every lane has joined the first.
#include <algorithm>
#include <cstring>
#include <utility>

#include "backend/cuda/check.h"
#include "backend/cuda/graph_memset.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/optim.h"
#include "backend/cuda/shared.h"
#include "dist/comm.h"

namespace seam::cuda {

namespace {

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
    case kZeroGamma:
      return where + ": gamma[" + std::to_string(e.a) + "] is 0, so this layer norm's backward cannot recover its "
             "input from its output (a memory budget chose that backward: raise the budget)";
    default:
      return where + ": device error code " + std::to_string(e.code);
  }
}

// A preparer may run its step while choosing (GEMM algorithms and variants, cuDNN
// algorithms, generated kernels against their split), and that writes the step's
// outputs. Nothing in the arena is live while a plan is prepared, but an output elsewhere
// (a gradient) belongs to the model, and another program may have produced it: such
// outputs are copied aside before the preparer runs and copied back after, stream-ordered
// behind whatever the preparer ran.
class KeepOutputs {
 public:
  KeepOutputs(const PlanStep& s, const StepArgs& a, cudaStream_t stream) : stream_(stream) {
    size_t total = 0;
    for (size_t i = 0; i < s.out.size(); ++i)
      if (s.out[i].region != Region::arena && s.out[i].bytes() > 0) {
        kept_.push_back({a.out[i].data, total, s.out[i].bytes()});
        total += (s.out[i].bytes() + 255) / 256 * 256;
      }
    if (kept_.empty()) return;
    SEAM_CUDA_CHECK(cudaMallocAsync(&copy_, total, stream_));
    for (const Kept& k : kept_)
      SEAM_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(copy_) + k.at, k.data, k.bytes, cudaMemcpyDeviceToDevice,
                                      stream_));
  }
  void restore() { SEAM_CUDA_CHECK(put_back()); }
  ~KeepOutputs() { (void)put_back(); }  // a preparer threw: its error is on its way, not this one's
  KeepOutputs(const KeepOutputs&) = delete;
  KeepOutputs& operator=(const KeepOutputs&) = delete;

 private:
  // Copies the outputs back and frees the copy, stream-ordered; the first error, if any.
  cudaError_t put_back() {
    if (!copy_) return cudaSuccess;
    cudaError_t e = cudaSuccess;
    for (const Kept& k : kept_)
      if (e == cudaSuccess)
        e = cudaMemcpyAsync(k.data, static_cast<char*>(copy_) + k.at, k.bytes, cudaMemcpyDeviceToDevice, stream_);
    const cudaError_t f = cudaFreeAsync(std::exchange(copy_, nullptr), stream_);
    return e != cudaSuccess ? e : f;
  }
  struct Kept {
    void* data;
    size_t at, bytes;
  };
  cudaStream_t stream_;
  std::vector<Kept> kept_;
  void* copy_ = nullptr;
};

// One input of the plan, double-buffered between host and arena.
struct StagedInput {
  size_t bytes = 0;
  std::byte* arena = nullptr;      // where the plan reads it
  void* landing[2] = {};           // device
  void* pinned[2] = {};            // host, page-locked
  cudaEvent_t uploaded[2] = {};    // copy stream: landing[s] holds the data
  bool written[2] = {false, false};
  std::shared_ptr<const void> owner[2];  // what an upload from device memory reads, held until it ran
  int last = -1;                   // slot written most recently
  // Which set_input each landing buffer holds (the count of calls so far), so that an
  // input set once is carried into the other slot once, not on every step.
  uint64_t version = 0, held[2] = {0, 0};
};

class CudaExecutable : public Executable {
 public:
  CudaExecutable(std::shared_ptr<Shared> sh, const Plan& plan, const Regions& r) : sh_(std::move(sh)), plan_(plan), r_(r) {
    ctx_.stream = sh_->stream;
    ctx_.cublaslt = sh_->lt;
    ctx_.cudnn = sh_->dnn;
    ctx_.gemm_cache = sh_->gemm_cache.get();
    ctx_.tf32 = sh_->tf32;
    ctx_.epilogue = sh_->epilogue;
    ctx_.deterministic = sh_->deterministic;
    ctx_.sm_count = sh_->sm_count;
    ctx_.counters = reinterpret_cast<DeviceCounters*>(r.counters);
    ctx_.error = reinterpret_cast<DeviceError*>(ctx_.scratch(sizeof(DeviceError)));
    clear_error_ = {-1, kNoError, 0, 0, 0};
    clear_error();
    for (auto& b : plan.inputs) {
      StagedInput in;
      in.bytes = b.ref.bytes();
      in.arena = r.arena + b.ref.offset;
      for (int s = 0; s < 2; ++s) {
        in.landing[s] = ctx_.scratch(in.bytes);
        SEAM_CUDA_CHECK(cudaMallocHost(&in.pinned[s], std::max<size_t>(in.bytes, 1)));
        SEAM_CUDA_CHECK(cudaEventCreateWithFlags(&in.uploaded[s], cudaEventDisableTiming));
      }
      inputs_.push_back(in);
    }
    for (int s = 0; s < 2; ++s) SEAM_CUDA_CHECK(cudaEventCreateWithFlags(&freed_[s], cudaEventDisableTiming));
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      const PlanStep& s = plan.steps[i];
      StepArgs a{s, static_cast<int>(i), {}, {}, ctx_};
      for (auto& b : s.in) a.in.push_back({r.base(b.region) + b.offset, b.type});
      for (auto& b : s.out) a.out.push_back({r.base(b.region) + b.offset, b.type});
      KeepOutputs keep(s, a, sh_->stream);
      ctx_.set_preparing_step(static_cast<int>(i));
      launches_.push_back(preparer_for(s.op)(a));
      ctx_.set_preparing_step(-1);
      keep.restore();
    }
    if (plan.optimizer) {
      const Binding* loss = plan.loss.empty() ? nullptr : plan.output(plan.loss);
      if (loss && loss->ref.type.dtype != DType::f32)
        fail("the CUDA optimizer checks an f32 loss, '", plan.loss, "' is ", loss->ref.type.str());
      const float* lp = loss ? reinterpret_cast<const float*>(r.base(loss->ref.region) + loss->ref.offset) : nullptr;
      OptimizerShard shard;
      if (plan.zero) {
        if (!sh_->nccl || !r.comm) fail("a ZeRO-1 plan runs among ranks, and this one has none");
        const auto [lo, hi] = zero_shard(values(), r.comm->rank(), r.comm->size());
        shard = {static_cast<int64_t>(lo), static_cast<int64_t>(hi), sh_->nccl.get()};
      }
      launches_.push_back(
          prepare_optimizer(*plan.optimizer, plan.layout, r, ctx_, lp, plan.working, plan.zero ? &shard : nullptr));
    } else if (!plan.grads.empty()) {
      launches_.push_back(gradients_as_written(ctx_));
    }
    sched_ = schedule_lanes(step_dependencies(plan), static_cast<int>(sh_->lanes.size()));
    ctx_.set_lanes(sched_.lane, sched_.lanes_used);
    signals_.assign(plan.steps.size(), false);
    for (auto& w : sched_.waits)
      for (int d : w) signals_[static_cast<size_t>(d)] = true;
    auto event = [] {
      cudaEvent_t e = nullptr;
      SEAM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      return e;
    };
    done_.assign(plan.steps.size(), nullptr);
    for (size_t j = 0; j < plan.steps.size(); ++j)
      if (signals_[j]) done_[j] = event();
    if (sched_.lanes_used > 1) {
      fork_ = event();
      for (int l = 1; l < sched_.lanes_used; ++l) joined_.push_back(event());
    }
    if (!plan.buckets.empty()) {
      // A bucket's `after` is its last step in program order; a step before it on another
      // lane (the bias sums beside the weight gradient reading the same dy) may still run
      // when `after` is done, so the sum waits for every lane that reads or writes its bytes.
      for (const GradBucket& b : plan.buckets) {
        std::vector<int> lanes;
        for (size_t j = 0; j < plan.steps.size(); ++j)
          if (touches(plan.steps[j], b)) lanes.push_back(sched_.lane[j]);
        std::sort(lanes.begin(), lanes.end());
        lanes.erase(std::unique(lanes.begin(), lanes.end()), lanes.end());
        if (lanes.empty()) lanes.push_back(0);
        std::vector<cudaEvent_t> ready;
        for (size_t i = 0; i < lanes.size(); ++i) ready.push_back(event());
        bucket_lanes_.push_back(std::move(lanes));
        bucket_ready_.push_back(std::move(ready));
      }
      summed_ = event();
      if (plan.optimizer && !plan.loss.empty())
        if (const Binding* b = plan.output(plan.loss)) loss_ = r.base(b->ref.region) + b->ref.offset;
    }
    std::vector<Launch> once;
    for (size_t i = 0; i < plan.init.size(); ++i) {
      const PlanStep& s = plan.init[i];
      StepArgs a{s, -1, {}, {}, ctx_};
      for (auto& b : s.out) a.out.push_back({r.base(b.region) + b.offset, b.type});
      once.push_back(preparer_for(s.op)(a));
    }
    for (auto& l : once) l(sh_->stream);
    SEAM_CUDA_LAUNCH_CHECK();
    SEAM_CUDA_CHECK(cudaStreamSynchronize(sh_->stream));
    sh_->gemm_cache->release_tuning_workspace();  // every GEMM is timed by now
  }

  ~CudaExecutable() override {
    cudaStreamSynchronize(sh_->stream);
    cudaStreamSynchronize(sh_->copy_stream);
    for (int s = 0; s < 2; ++s) {
      if (exec_[s]) cudaGraphExecDestroy(exec_[s]);
      if (graph_[s]) cudaGraphDestroy(graph_[s]);
      cudaEventDestroy(freed_[s]);
    }
    for (cudaEvent_t e : done_)
      if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : joined_) cudaEventDestroy(e);
    for (auto& ready : bucket_ready_)
      for (cudaEvent_t e : ready) cudaEventDestroy(e);
    if (summed_) cudaEventDestroy(summed_);
    if (fork_) cudaEventDestroy(fork_);
    for (auto& in : inputs_)
      for (int s = 0; s < 2; ++s) {
        cudaFreeHost(in.pinned[s]);
        cudaEventDestroy(in.uploaded[s]);
      }
  }

  void set_input(size_t index, std::span<const std::byte> data) override {
    StagedInput& in = inputs_.at(index);
    const int s = slot_;
    // The pinned buffer may still feed the upload of two steps ago.
    if (in.written[s]) SEAM_CUDA_CHECK(cudaEventSynchronize(in.uploaded[s]));
    in.owner[s].reset();
    std::memcpy(in.pinned[s], data.data(), data.size());
    ++in.version;
    upload(in, s, in.pinned[s], cudaMemcpyHostToDevice);
  }

  // The producer made copy_stream wait for its work (DLPack's stream argument), so the
  // copy on it reads finished data; `owner` keeps that memory until the copy has run.
  void set_input_device(size_t index, const void* data, std::shared_ptr<const void> owner) override {
    StagedInput& in = inputs_.at(index);
    const std::string& name = plan_.inputs.at(index).name;
    cudaPointerAttributes at{};
    if (cudaPointerGetAttributes(&at, data) != cudaSuccess) {
      cudaGetLastError();
      at.type = cudaMemoryTypeUnregistered;
    }
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
      fail("input '", name, "': the array is said to be in GPU memory, but its address is not");
    if (at.device != sh_->device)
      fail("input '", name, "': the array is on GPU ", at.device, ", the program runs on GPU ", sh_->device);
    const int s = slot_;
    if (in.written[s]) SEAM_CUDA_CHECK(cudaEventSynchronize(in.uploaded[s]));
    in.owner[s] = std::move(owner);  // the slot's last copy has run: its owner may go
    ++in.version;
    upload(in, s, data, cudaMemcpyDeviceToDevice);
  }
  void* input_stream() override { return sh_->copy_stream; }

  // What the host set since it last synced (reset, resume) goes to the device; the
  // fields only the device changes (the loss scale, skips) stay equal otherwise.
  void push_state(const StepState& state) {
    StepState& dev = *r_.synced;
    if (dev.step != state.step || dev.seed != state.seed || dev.loss_scale != state.loss_scale ||
        dev.scale_good != state.scale_good || dev.skipped_steps != state.skipped_steps ||
        dev.skip_streak != state.skip_streak) {
      DeviceCounters c{state.step,
                       state.seed,
                       0.0f,
                       0.0f,
                       static_cast<float>(state.loss_scale),
                       static_cast<int32_t>(state.scale_good),
                       state.skipped_steps,
                       state.skip_streak,
                       1.0f};
      SEAM_CUDA_CHECK(cudaMemcpyAsync(ctx_.counters, &c, sizeof c, cudaMemcpyHostToDevice, sh_->stream));
      SEAM_CUDA_CHECK(cudaStreamSynchronize(sh_->stream));  // c lives on this stack frame
      dev = state;
    }
  }

  void run(StepState& state) override {
    push_state(state);
    StepState& dev = *r_.synced;
    const int s = slot_;
    for (auto& in : inputs_) {
      // An input not set for this step keeps its last value: carry it into this slot,
      // unless the slot holds it already.
      if (in.last >= 0 && in.last != s && in.held[s] != in.version)
        upload(in, s, in.landing[in.last], cudaMemcpyDeviceToDevice);
      if (in.written[s]) SEAM_CUDA_CHECK(cudaStreamWaitEvent(sh_->stream, in.uploaded[s], 0));
    }
    if (sh_->graph) {
      if (!exec_[s]) capture(s);
      SEAM_CUDA_CHECK(cudaGraphLaunch(exec_[s], sh_->stream));
    } else {
      enqueue(s, sh_->stream);
    }
    SEAM_CUDA_LAUNCH_CHECK();
    SEAM_CUDA_CHECK(cudaEventRecord(freed_[s], sh_->stream));
    slot_ = 1 - s;
    if (plan_.optimizer) {
      // The device advanced its counter; the host mirrors it without reading it back.
      state.lr = plan_.optimizer->schedule.lr_at(plan_.optimizer->lr, state.step);
      ++state.step;
      dev.step = state.step;
    }
  }

  void sync_state(StepState& state) override {
    // A state the host set (a checkpoint's step, a reset) that no step has taken to the
    // device yet goes there first: else the read below would bring the device's stale
    // counters back and mark them as synced, and the next step would run from them.
    push_state(state);
    DeviceCounters c{};
    SEAM_CUDA_CHECK(cudaMemcpyAsync(&c, ctx_.counters, sizeof c, cudaMemcpyDeviceToHost, sh_->stream));
    SEAM_CUDA_CHECK(cudaStreamSynchronize(sh_->stream));
    state.grad_norm = c.grad_norm;
    state.loss_scale = c.loss_scale;
    state.scale_good = c.scale_good;
    state.skipped_steps = c.skipped_steps;
    state.skip_streak = c.skip_streak;
    *r_.synced = state;
  }

  static_assert(sizeof(DeviceCounters) <= 64, "Regions::counters holds 64 bytes (model.cpp's kCounterBytes)");
  float grad_read_scale() override {
    float f = 1.0f;
    SEAM_CUDA_CHECK(cudaMemcpyAsync(&f, &ctx_.counters->grad_scale, sizeof f, cudaMemcpyDeviceToHost, sh_->stream));
    SEAM_CUDA_CHECK(cudaStreamSynchronize(sh_->stream));
    return f;
  }

  void check() override {
    DeviceError e{};
    SEAM_CUDA_CHECK(cudaMemcpyAsync(&e, ctx_.error, sizeof e, cudaMemcpyDeviceToHost, sh_->stream));
    SEAM_CUDA_CHECK(cudaStreamSynchronize(sh_->stream));
    if (e.code != kNoError) {
      clear_error();
      fail(error_message(e, plan_));
    }
  }

  ExecStats stats() override {
    ExecStats st;
    st.graph = sh_->graph;
    st.streams = sched_.lanes_used;
    st.choices = ctx_.choices;
    st.device_bytes = ctx_.device_bytes();
    cudaGraph_t g = graph_[0] ? graph_[0] : graph_[1];
    bool own = false;
    if (!g) {  // capture once just to count what a step launches
      SEAM_CUDA_CHECK(cudaStreamBeginCapture(sh_->stream, cudaStreamCaptureModeThreadLocal));
      enqueue(0, sh_->stream);
      SEAM_CUDA_CHECK(cudaStreamEndCapture(sh_->stream, &g));
      own = true;
    }
    size_t n = 0;
    SEAM_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    SEAM_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
    for (auto node : nodes) {
      cudaGraphNodeType t;
      SEAM_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
      st.kernels += t == cudaGraphNodeTypeKernel;
      st.nodes += t != cudaGraphNodeTypeEmpty;
    }
    if (own) cudaGraphDestroy(g);
    return st;
  }

  std::vector<double> time_steps(int reps) override {
    cudaEvent_t a, b;
    SEAM_CUDA_CHECK(cudaEventCreate(&a));
    SEAM_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<double> ms;
    // Each step on the stream, one at a time, but with its own lane's workspace: a lane's
    // is sized for its own steps' needs, and lane 0's may be smaller than another's step
    // needs.
    LaneReset reset{ctx_};
    for (size_t j = 0; j < launches_.size(); ++j) {
      ctx_.set_lane(j < sched_.lane.size() ? sched_.lane[j] : 0);
      const Launch& l = launches_[j];
      l(sh_->stream);  // warm
      std::vector<float> t;
      for (int i = 0; i < reps; ++i) {
        SEAM_CUDA_CHECK(cudaEventRecord(a, sh_->stream));
        l(sh_->stream);
        SEAM_CUDA_CHECK(cudaEventRecord(b, sh_->stream));
        SEAM_CUDA_CHECK(cudaEventSynchronize(b));
        float x = 0;
        SEAM_CUDA_CHECK(cudaEventElapsedTime(&x, a, b));
        t.push_back(x);
      }
      std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
      ms.push_back(t[t.size() / 2]);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms;
  }

 private:
  // Puts the context back on lane 0 (where work outside the steps runs) however a loop
  // over the steps' lanes ends.
  struct LaneReset {
    Context& c;
    ~LaneReset() { c.set_lane(0); }
  };

  // Resets the error slot, ordered with the kernels that report into it (clear_error_
  // lives as long as the executable, so the copy may still be in flight on return).
  void clear_error() {
    SEAM_CUDA_CHECK(
        cudaMemcpyAsync(ctx_.error, &clear_error_, sizeof(DeviceError), cudaMemcpyHostToDevice, sh_->stream));
  }

  // Enqueues a copy into landing[s] on the copy stream, once the step that last read
  // landing[s] has finished with it.
  void upload(StagedInput& in, int s, const void* src, cudaMemcpyKind kind) {
    SEAM_CUDA_CHECK(cudaStreamWaitEvent(sh_->copy_stream, freed_[s], 0));
    SEAM_CUDA_CHECK(cudaMemcpyAsync(in.landing[s], src, in.bytes, kind, sh_->copy_stream));
    SEAM_CUDA_CHECK(cudaEventRecord(in.uploaded[s], sh_->copy_stream));
    in.written[s] = true;
    in.last = s;
    in.held[s] = in.version;
  }

  // The step reading slot s: the inputs into the arena (always all of them, so a graph
  // captured before an input was first set still copies it later), then every launch on
  // its lane, the lanes forked from `stream` and joined back before the optimizer.
  void enqueue(int s, cudaStream_t stream) {
    for (auto& in : inputs_)
      SEAM_CUDA_CHECK(cudaMemcpyAsync(in.arena, in.landing[s], in.bytes, cudaMemcpyDeviceToDevice, stream));
    const int lanes = sched_.lanes_used;
    auto lane_stream = [&](int l) { return lane_stream_of(l, stream); };
    if (lanes > 1) {
      SEAM_CUDA_CHECK(cudaEventRecord(fork_, stream));
      for (int l = 1; l < lanes; ++l) SEAM_CUDA_CHECK(cudaStreamWaitEvent(lane_stream(l), fork_, 0));
    }
    LaneReset reset{ctx_};
    const size_t n = plan_.steps.size();
    sum_buckets(-1, stream);
    for (size_t j = 0; j < n; ++j) {
      const int l = sched_.lane[j];
      cudaStream_t ls = lane_stream(l);
      for (int d : sched_.waits[j]) SEAM_CUDA_CHECK(cudaStreamWaitEvent(ls, done_[static_cast<size_t>(d)], 0));
      ctx_.set_lane(l);
      launches_[j](ls);
      if (signals_[j]) SEAM_CUDA_CHECK(cudaEventRecord(done_[j], ls));
      sum_buckets(static_cast<int>(j), stream);
    }
    ctx_.set_lane(0);
    for (int l = 1; l < lanes; ++l) {
      SEAM_CUDA_CHECK(cudaEventRecord(joined_[static_cast<size_t>(l - 1)], lane_stream(l)));
      SEAM_CUDA_CHECK(cudaStreamWaitEvent(stream, joined_[static_cast<size_t>(l - 1)], 0));
    }
    if (!plan_.buckets.empty()) {
      // The update waits for every sum; its finiteness check reads the ranks' mean loss,
      // so every rank skips or takes the step alike.
      SEAM_CUDA_CHECK(cudaEventRecord(summed_, sh_->comm_stream));
      SEAM_CUDA_CHECK(cudaStreamWaitEvent(stream, summed_, 0));
      if (loss_) sh_->nccl->all_reduce_mean(loss_, 1, DType::f32, stream);
    }
    for (size_t k = n; k < launches_.size(); ++k) launches_[k](stream);  // the optimizer
  }

  cudaStream_t lane_stream_of(int l, cudaStream_t stream) const {
    return l == 0 ? stream : sh_->lanes[static_cast<size_t>(l)];
  }

  // Whether step s reads or writes any of bucket b's bytes.
  static bool touches(const PlanStep& s, const GradBucket& b) {
    for (const auto* list : {&s.in, &s.out})
      for (const BufferRef& o : *list)
        for (const BufferRef& p : b.parts)
          if (o.overlaps(p)) return true;
    return false;
  }

  // The buckets whose last step is `after` (-1: none), each summed on the communication
  // stream as soon as every lane has done what it was given up to that step (`stream`
  // is lane 0's), beside the rest of the step.
  void sum_buckets(int after, cudaStream_t stream) {
    for (size_t k = 0; k < plan_.buckets.size(); ++k) {
      const GradBucket& b = plan_.buckets[k];
      if (b.after != after) continue;
      for (size_t i = 0; i < bucket_lanes_[k].size(); ++i) {
        SEAM_CUDA_CHECK(cudaEventRecord(bucket_ready_[k][i], lane_stream_of(bucket_lanes_[k][i], stream)));
        SEAM_CUDA_CHECK(cudaStreamWaitEvent(sh_->comm_stream, bucket_ready_[k][i], 0));
      }
      for (const BufferRef& p : b.parts) {
        const auto n = static_cast<size_t>(p.type.numel());
        if (!plan_.zero) {
          sh_->nccl->all_reduce_mean(r_.grads + p.offset, n, p.type.dtype, sh_->comm_stream);
          continue;
        }
        // ZeRO-1: each rank receives the mean of the part's values its shard covers.
        const size_t first = p.offset / dtype_size(p.type.dtype);
        std::vector<size_t> split = zero_split(values(), plan_.ranks);
        for (size_t& v : split) v = std::clamp(v, first, first + n) - first;
        sh_->nccl->reduce_scatter_mean(r_.grads + p.offset, split, p.type.dtype, sh_->comm_stream);
      }
    }
  }

  // The flat parameters' values (ZeRO-1 shards them).
  size_t values() const { return plan_.layout.param_bytes / dtype_size(plan_.layout.param_dtype); }

  void capture(int s) {
    SEAM_CUDA_CHECK(cudaStreamBeginCapture(sh_->stream, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue(s, sh_->stream);
    } catch (...) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(sh_->stream, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    cudaError_t e = cudaStreamEndCapture(sh_->stream, &graph_[s]);
    if (e != cudaSuccess)
      fail("capturing the training step as a CUDA Graph failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
           "); run with --no-graph to launch the steps one by one");
    memsets_as_kernels(graph_[s]);
    SEAM_CUDA_CHECK(cudaGraphInstantiate(&exec_[s], graph_[s], 0));
  }

  std::shared_ptr<Shared> sh_;
  const Plan& plan_;
  Regions r_;
  Context ctx_;
  DeviceError clear_error_;
  std::vector<Launch> launches_;  // the plan's steps, then the optimizer if any
  LaneSchedule sched_;
  std::vector<bool> signals_;        // step j's completion is waited for on another lane
  std::vector<cudaEvent_t> done_;    // recorded after step j where signals_[j]
  std::vector<cudaEvent_t> joined_;  // lane l's last work, for lanes 1..
  cudaEvent_t fork_ = nullptr;
  std::vector<std::vector<int>> bucket_lanes_;          // the lanes reading or writing bucket k
  std::vector<std::vector<cudaEvent_t>> bucket_ready_;  // each of them done with it
  cudaEvent_t summed_ = nullptr;           // every bucket summed
  std::byte* loss_ = nullptr;              // averaged over the ranks before the update
  std::vector<StagedInput> inputs_;
  int slot_ = 0;
  cudaEvent_t freed_[2] = {};  // compute stream: the step that read slot s is done
  cudaGraph_t graph_[2] = {};
  cudaGraphExec_t exec_[2] = {};
};

}  // namespace

std::unique_ptr<Executable> make_executable(std::shared_ptr<Shared> sh, const Plan& plan, const Regions& r) {
  return std::make_unique<CudaExecutable>(std::move(sh), plan, r);
}

}  // namespace seam::cuda
