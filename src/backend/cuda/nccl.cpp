#include "backend/cuda/nccl.h"

#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/dynlib.h"
#include "dist/comm.h"
#include "seam/error.h"

namespace seam::cuda {

namespace {

struct Api {
  void* lib = nullptr;
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*abort)(ncclComm_t) = nullptr;
  ncclResult_t (*async_error)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
};

const Api& api() {
  static const Api a = [] {
    std::vector<std::string> tried;
    if (const char* e = std::getenv("SEAM_NCCL"); e && *e) tried.push_back(e);
    tried.push_back("libnccl.so.2");
    tried.push_back("libnccl.so");
    for (const char* root : {"/usr/local/cuda/lib64/", "/usr/local/cuda/lib/"}) tried.push_back(std::string(root) + "libnccl.so.2");
    Api a;
    a.lib = open_first(tried, "summing gradients over GPUs needs NCCL (libnccl.so.2)", "SEAM_NCCL");
    auto sym = [&](auto& f, const char* name) { load_symbol(a.lib, f, name, "NCCL"); };
    sym(a.get_unique_id, "ncclGetUniqueId");
    sym(a.init_rank, "ncclCommInitRank");
    sym(a.destroy, "ncclCommDestroy");
    sym(a.abort, "ncclCommAbort");
    sym(a.async_error, "ncclCommGetAsyncError");
    sym(a.all_reduce, "ncclAllReduce");
    sym(a.reduce, "ncclReduce");
    sym(a.broadcast, "ncclBroadcast");
    sym(a.group_start, "ncclGroupStart");
    sym(a.group_end, "ncclGroupEnd");
    sym(a.error_string, "ncclGetErrorString");
    return a;
  }();
  return a;
}

void check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  fail("NCCL: ", what, ": ", api().error_string(r));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    default: fail("NCCL: no sum of ", dtype_name(t), " values");
  }
}

}  // namespace

Nccl::Nccl(dist::Comm& host) : host_(host) {
  const Api& a = api();
  ncclUniqueId id{};
  if (host.rank() == 0) check(a.get_unique_id(&id), "ncclGetUniqueId");
  host.broadcast(&id, sizeof id, 0);
  ncclComm_t c = nullptr;
  check(a.init_rank(&c, host.size(), id, host.rank()), "ncclCommInitRank");
  comm_ = c;
  watchdog_ = std::thread([this] {
    while (!stop_.load()) {
      ncclResult_t e = ncclSuccess;
      if (api().async_error(static_cast<ncclComm_t>(comm_), &e) == ncclSuccess && e != ncclSuccess && e != ncclInProgress) {
        std::fprintf(stderr, "seam: error: rank %d of %d: NCCL reports %s; stopping this rank\n", host_.rank(),
                     host_.size(), api().error_string(e));
        std::fflush(stderr);
        api().abort(static_cast<ncclComm_t>(comm_));
        std::_Exit(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
}

Nccl::~Nccl() {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  if (comm_) api().destroy(static_cast<ncclComm_t>(comm_));
}

void Nccl::all_reduce_mean(void* data, size_t n, DType t, cudaStream_t stream) {
  check(api().all_reduce(data, data, n, nccl_type(t), ncclAvg, static_cast<ncclComm_t>(comm_), stream), "ncclAllReduce");
}

void Nccl::all_reduce_sum(void* data, size_t n, DType t, cudaStream_t stream) {
  check(api().all_reduce(data, data, n, nccl_type(t), ncclSum, static_cast<ncclComm_t>(comm_), stream), "ncclAllReduce");
}

namespace {

// `call(r, lo, n)` for each rank r's nonempty piece [lo, lo + n) of `split`, in one NCCL
// group (NCCL then runs them as one operation: ranks may own pieces of any size).
template <class Call>
void grouped(const std::vector<size_t>& split, int ranks, const char* what, Call call) {
  dist::check_split(split, ranks);
  check(api().group_start(), "ncclGroupStart");
  for (int r = 0; r < ranks; ++r) {
    const size_t lo = split[static_cast<size_t>(r)], n = split[static_cast<size_t>(r) + 1] - lo;
    if (n == 0) continue;  // every rank skips the same pieces
    if (const ncclResult_t e = call(r, lo, n); e != ncclSuccess) {
      api().group_end();
      check(e, what);
    }
  }
  check(api().group_end(), what);
}

}  // namespace

void Nccl::reduce_scatter_mean(void* data, const std::vector<size_t>& split, DType t, cudaStream_t stream) {
  auto* bytes = static_cast<std::byte*>(data);
  grouped(split, host_.size(), "ncclReduce to each shard's owner", [&](int r, size_t lo, size_t n) {
    void* at = bytes + lo * dtype_size(t);
    return api().reduce(at, at, n, nccl_type(t), ncclAvg, r, static_cast<ncclComm_t>(comm_), stream);
  });
}

void Nccl::all_gather(void* data, const std::vector<size_t>& split, cudaStream_t stream) {
  auto* bytes = static_cast<std::byte*>(data);
  grouped(split, host_.size(), "ncclBroadcast from each shard's owner", [&](int r, size_t lo, size_t n) {
    return api().broadcast(bytes + lo, bytes + lo, n, ncclUint8, r, static_cast<ncclComm_t>(comm_), stream);
  });
}

int local_device() {
  int local = 0;
  const char* from = nullptr;
  for (const char* v : {"SEAM_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v); s && *s) {
      local = std::atoi(s), from = v;
      break;
    }
  int count = 0;
  SEAM_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (local < 0 || local >= count)
    fail("local rank ", local, " (", from ? from : "default", ") but this host has ", count,
         " GPU(s): start at most one rank per GPU");
  return local;
}

}  // namespace seam::cuda
