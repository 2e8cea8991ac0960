// CUDA kernels of the losses: cross_entropy (ignore_index, PyTorch's label smoothing) and
// mse, each reduced to a scalar mean, and their gradients. Same formulas as the CPU
// reference (src/backend/cpu/loss.cpp).
//
// Reductions are deterministic: per-row (or per-block) values go to scratch and one block
// adds them in a fixed order, in double. The gradients read the upstream scalar dy on the
// device and recount the rows there, so nothing waits for the host.
//
// cross_entropy rows: one warp per row when C <= 1024, else one block per row; the row's
// max and sum of exp come from one pass (online log-sum-exp), the gradient reads it once
// more to write dlogits; the fused loss and gradient stages a block row in shared memory
// where it fits (Staged, two rows a block where two fit), so the row is read once.
// A label outside [0, C) that is not ignore_index is reported with report_error and its
// row left out; the host turns the report into a seam::Error on its next read.
//
// Logits (and predictions) are stored as f32, bf16 or f16 (the kernels template on the
// storage type T and compute in float); the losses are f32, the gradients in the logits'
// dtype. Rows whose length is a multiple of a 16-byte pack (4 floats, 8 16-bit values)
// are read and written a pack at a time: a warp of 2- or 4-byte loads would leave the
// row's read bound by the loads in flight. A pack's exponentials are independent of
// each other (one rescale for the pack's maximum), so they overlap instead of forming
// one serial chain per row.
#include <cmath>

#include <type_traits>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/ce_row.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/storage.cuh"

namespace seam::cuda {

namespace {

using namespace ce;  // the row: ce_row.cuh

constexpr int kWarpBlock = 256;   // warp-per-row kernels: 8 rows in flight per block
constexpr int kRowBlock = 512;    // block-per-row kernels
// Block-per-row kernels staging the row in shared memory: one block an SM (its two
// rows take most of the shared memory); 512 threads ran the W6 loss 5% faster than 1024
// (each warp repeats the row's reductions) and 20% faster than 256.
constexpr int kStagedBlock = 512;
constexpr int kReduceBlock = 1024;
constexpr size_t kStaticShared = 2048;  // at most, in ce_with_grad_rows
constexpr int kThreads = 256;     // elementwise kernels
constexpr int64_t kMaxWarpClasses = 1024;


// The upstream gradient dy: f32, or the data's own dtype. It is read once per launch, so
// its dtype can be a run-time value rather than one more template parameter.
struct Scalar {
  const void* p;
  DType dtype;
};

__device__ inline double load(const Scalar& v) {
  if (v.dtype == DType::bf16) return to_float(*static_cast<const bf16_t*>(v.p));
  if (v.dtype == DType::f16) return to_float(*static_cast<const f16_t*>(v.p));
  return *static_cast<const float*>(v.p);
}

// Per row: the loss into row_loss[row] (0 for rows that do not count) and row_used[row]
// (0 or 1).
template <class G, class T>
__global__ void ce_rows(const T* __restrict__ logits, const int32_t* __restrict__ labels, int64_t rows,
                        int64_t classes, int64_t stride, int64_t ignore_index, double smoothing, bool vec,
                        double* __restrict__ row_loss, int* __restrict__ row_used, DeviceError* err, int step) {
  const G g{};
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    const int32_t label = labels[r];
    if (!row_counts(g, label, r, classes, ignore_index, err, step)) {
      if (g.rank() == 0) {
        row_loss[r] = 0.0;
        row_used[r] = 0;
      }
      continue;
    }
    float m, s;
    int64_t unused;
    const T* z = logits + r * stride;
    const double loss =
        row_loss_of<G, false>(g, Streamed<T>{z, classes, vec}, to_float(z[label]), smoothing, m, s, unused);
    if (g.rank() == 0) {
      row_loss[r] = loss;
      row_used[r] = 1;
    }
  }
}

// One block: loss = sum(row_loss) / sum(row_used), 0 if no row counts.
__global__ void __launch_bounds__(kReduceBlock)
    ce_mean(const double* __restrict__ row_loss, const int* __restrict__ row_used, int64_t rows,
            float* __restrict__ out) {
  double total = 0;
  int64_t count = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    total += row_loss[i];
    count += row_used[i];
  }
  total = block_sum(total);
  count = block_sum(count);
  if (threadIdx.x == 0) out[0] = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.f;
}

// One block: counts the rows of the gradient (reporting bad labels as the forward does)
// and stores scale = dy / count (0 if none) for ce_grad_rows.
__global__ void __launch_bounds__(kReduceBlock)
    ce_grad_scale(Scalar dy, const int32_t* __restrict__ labels, int64_t rows, int64_t classes, int64_t ignore_index,
                  double* __restrict__ scale, DeviceError* err, int step) {
  int64_t count = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    const int32_t l = labels[i];
    if (static_cast<int64_t>(l) == ignore_index) continue;
    if (l < 0 || l >= classes) report_error(err, step, kLabelRange, i, l, classes);
    else ++count;
  }
  count = block_sum(count);
  if (threadIdx.x == 0) scale[0] = count > 0 ? load(dy) / static_cast<double>(count) : 0.0;
}

// dlogits = scale * (softmax(z) - target), target = (1 - eps) * onehot(label) + eps / C;
// zero rows for ignored (or bad) labels.
template <class G, class T>
__global__ void ce_grad_rows(const T* __restrict__ logits, const int32_t* __restrict__ labels, int64_t rows,
                             int64_t classes, int64_t stride, int64_t ignore_index, double smoothing, bool vec,
                             const double* __restrict__ scale, T* __restrict__ dz) {
  const G g{};
  const double sc = scale[0];
  const double off_target = smoothing / static_cast<double>(classes);
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    const int32_t label = labels[r];
    T* d = dz + r * stride;
    const bool counts = static_cast<int64_t>(label) != ignore_index && label >= 0 && label < classes;
    if (!counts) {
      zero_row(g, d, stride);
      continue;
    }
    const T* z = logits + r * stride;
    float m, s, unused;
    int64_t none;
    row_stats<G, false, false>(g, Streamed<T>{z, classes, vec}, m, s, unused, none);
    row_grad(g, z, d, stride, vec, grad_row(m, s, sc, smoothing, off_target, label, classes));
  }
}

// The rows of cross_entropy that count (label a class, not ignore_index), over a block.
__device__ int64_t block_count_rows(const int32_t* __restrict__ labels, int64_t rows, int64_t classes,
                                    int64_t ignore_index) {
  int64_t count = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    const int32_t l = labels[i];
    count += static_cast<int64_t>(l) != ignore_index && l >= 0 && l < classes;
  }
  return block_sum(count);
}

// One block: the count for ce_with_grad_rows<G, true>.
__global__ void __launch_bounds__(kReduceBlock)
    ce_count(const int32_t* __restrict__ labels, int64_t rows, int64_t classes, int64_t ignore_index,
             int64_t* __restrict__ count) {
  const int64_t c = block_count_rows(labels, rows, classes, ignore_index);
  if (threadIdx.x == 0) count[0] = c;
}

// cross_entropy_with_grad. The gradient's scale dy / count needs the count of rows that
// count before any row is written: for a small batch every block counts them itself from
// the labels (one launch in all); for a large one (every block re-reading every label
// would cost as much as the logits) ce_count runs first (Counted). Then each row's loss
// and gradient come from one read of the row. Each block adds its rows' losses (each
// group its own rows in order, then the groups in order) into block_loss; the last block
// to finish adds those in block order and re-arms the arrival counter for the next
// launch. The grid is fixed when the step is prepared, so the sum is the same every run.
// dz may be the logits themselves (OpDef::in_place): a thread writes only elements it has
// read, and what the row's other threads read late (the label's logit) is read first.
// With `correct` (count_correct), the rows whose argmax is their label are counted as
// well (the argmax found in the log-sum-exp's reduction): per block into block_correct,
// then by the last block into correct.
// Staged (block rows in packs): the row is copied into shared memory by the copy engine
// (one bulk copy a row, issued by one thread, its bytes counted on the buffer's mbarrier)
// and read there, so it is read from memory once; with `buffers` = 2 the next row's copy
// is issued before this row is computed, so the block's one row at a time still keeps the
// memory busy. A bulk copy costs the block one instruction where per-thread 16-byte copies
// cost one per pack: on an H100 the W6 loss ran 4-6% faster so. Else Streamed (read twice:
// for the stats, then for the gradient).
// The next row's label is read a row ahead.
template <class G, bool Counted, class T, bool Stage>
__global__ void __launch_bounds__(Stage ? kStagedBlock : kRowBlock, 1)
    ce_with_grad_rows(const T* logits, const int32_t* __restrict__ labels, int64_t rows, int64_t classes,
                      int64_t stride, int64_t ignore_index, double smoothing, bool vec, int buffers,
                                  Scalar dy, const int64_t* __restrict__ counted, double* __restrict__ block_loss,
                                  int64_t* __restrict__ block_correct, unsigned* arrived, float* __restrict__ loss,
                                  int32_t* __restrict__ correct, const float* __restrict__ loss_acc,
                                  const int32_t* __restrict__ correct_acc, T* dz, DeviceError* err, int step) {
  const G g{};
  const int64_t count = Counted ? counted[0] : block_count_rows(labels, rows, classes, ignore_index);
  const double sc = count > 0 ? load(dy) / static_cast<double>(count) : 0.0;
  const double off_target = smoothing / static_cast<double>(classes);
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  auto* staged = reinterpret_cast<Pack<T>*>(staged_bytes);  // [buffers][packs]
  const int packs = static_cast<int>(stride / kPer<T>);
  __shared__ uint64_t landed[2];  // buffer b's copy has arrived (Stage)
  uint32_t parity[2] = {0, 0};   // of each buffer's next phase
  auto stage = [&](int64_t r, int b) {
    if (threadIdx.x == 0)
      bulk_load(staged + b * packs, logits + r * stride, static_cast<uint32_t>(packs * sizeof(Pack<T>)), &landed[b]);
  };
  if constexpr (Stage) {
    if (threadIdx.x == 0)
      for (int b = 0; b < buffers; ++b) mbar_init(&landed[b]);
    __syncthreads();
    if (buffers == 2 && g.first() < rows) stage(g.first(), 0);
  }
  double mine = 0;  // the group's rows, held by its rank 0
  int64_t right = 0;
  int32_t next_label = g.first() < rows ? labels[g.first()] : 0;
  int b = 0;  // this row's buffer
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    const int32_t label = next_label;
    if (r + g.stride() < rows) next_label = labels[r + g.stride()];
    T* d = dz + r * stride;
    const T* z = logits + r * stride;
    if constexpr (Stage) {
      __syncthreads();  // the buffer about to be filled was the last row's, read by then
      if (buffers == 1) stage(r, 0);
      else if (r + g.stride() < rows) stage(r + g.stride(), b ^ 1);
      mbar_wait(&landed[b], parity[b]);
      parity[b] ^= 1;
    }
    const Staged<T> held{staged + b * packs, static_cast<int>(classes), packs};
    if (Stage && buffers == 2) b ^= 1;
    if (!row_counts(g, label, r, classes, ignore_index, err, step)) {
      zero_row(g, d, stride);
      continue;
    }
    // Before d (maybe z itself) is written.
    const float zl = Stage ? held.at(label) : to_float(z[label]), z0 = Stage ? held.at(0) : to_float(z[0]);
    float m, s;
    int64_t first;
    double loss;
    if constexpr (Stage) {
      loss = correct ? row_loss_of<G, true>(g, held, zl, smoothing, m, s, first)
                     : row_loss_of<G, false>(g, held, zl, smoothing, m, s, first);
      held.grad(d, g.rank(), g.size(), grad_row(m, s, sc, smoothing, off_target, label, classes));
    } else {
      const Streamed<T> in{z, classes, vec};
      loss = correct ? row_loss_of<G, true>(g, in, zl, smoothing, m, s, first)
                     : row_loss_of<G, false>(g, in, zl, smoothing, m, s, first);
      row_grad(g, z, d, stride, vec, grad_row(m, s, sc, smoothing, off_target, label, classes));
    }
    if (g.rank() != 0) continue;
    mine += loss;
    // argmax's rule: a NaN first is the answer; none larger than -inf only where all are
    // -inf or NaN.
    const int64_t best = first == INT64_MAX || isnan(z0) ? 0 : first;
    right += correct && best == label;
  }
  if (correct) {
    const int64_t block_right = block_sum(right);
    if (threadIdx.x == 0) block_correct[blockIdx.x] = block_right;
  }
  const double block_total = block_sum(mine);
  // The last block to arrive sees every block_loss (each block's write is fenced before
  // it arrives).
  __shared__ bool last;
  if (threadIdx.x == 0) block_loss[blockIdx.x] = block_total;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(arrived, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  double total = 0;
  for (int64_t i = threadIdx.x; i < gridDim.x; i += blockDim.x) total += __ldcg(block_loss + i);
  total = block_sum(total);
  int64_t all_right = 0;
  if (correct) {
    for (int64_t i = threadIdx.x; i < gridDim.x; i += blockDim.x) all_right += __ldcg(block_correct + i);
    all_right = block_sum(all_right);
  }
  if (threadIdx.x == 0) {
    const float part = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.f;
    loss[0] = loss_acc ? loss_acc[0] + part : part;
    if (correct) correct[0] = static_cast<int32_t>(all_right) + (correct_acc ? correct_acc[0] : 0);
    *arrived = 0;
  }
}

// mse: per-block partial sums of (p - t)^2 in double, then one block adds them in order.
template <class T>
__global__ void __launch_bounds__(kThreads)
    mse_partial(const T* __restrict__ p, const T* __restrict__ t, int64_t n, double* __restrict__ partial) {
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const double d = static_cast<double>(to_float(p[i])) - static_cast<double>(to_float(t[i]));
    s += d * d;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kReduceBlock)
    mse_mean(const double* __restrict__ partial, int blocks, int64_t n, float* __restrict__ out) {
  double s = 0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = n > 0 ? static_cast<float>(s / static_cast<double>(n)) : 0.f;
}

// dp = dy * 2 (p - t) / n
template <class T>
__global__ void __launch_bounds__(kThreads)
    mse_grad_kernel(Scalar dy, const T* __restrict__ p, const T* __restrict__ t, T* __restrict__ dp, int64_t n) {
  const double scale = 2.0 * load(dy) / static_cast<double>(n);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dp[i] = from_float<T>(
        static_cast<float>(scale * (static_cast<double>(to_float(p[i])) - static_cast<double>(to_float(t[i])))));
}

// ---- preparers ----

// The most shared memory a block of this device may ask for.
int smem_optin() {
  int device = 0, bytes = 0;
  SEAM_CUDA_CHECK(cudaGetDevice(&device));
  SEAM_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// dy of a gradient: f32, or the data's dtype.
Scalar upstream(const StepArgs& a, const DeviceTensor& dy, DType data) {
  if (data == DType::f32) expect_dtype(a, dy, {DType::f32});
  else expect_dtype(a, dy, {DType::f32, data});
  return {dy.data, dy.dtype()};
}

// Rows, classes and attributes of cross_entropy(_grad); logits/labels are the inputs,
// dlogits the gradient's output where there is one (in the logits' dtype).
struct CeShape {
  int64_t rows, classes, stride, ignore_index;  // classes of each row of stride (the rest padding)
  int64_t offset;    // a chunk's first row among the labels (row_offset), else 0
  int64_t all_rows;  // the labels' rows, which the mean's divisor counts
  double smoothing;
  bool warp;          // one warp per row, else one block per row
  bool vec;           // rows read and written in 16-byte packs
  unsigned blocks;    // of the row kernels
};

CeShape ce_shape(const StepArgs& a, const DeviceTensor& logits, const DeviceTensor& labels,
                 const DeviceTensor* dlogits) {
  expect_dtype(a, logits, kStored);
  expect_dtype(a, labels, {DType::i32});
  if (dlogits) expect_dtype(a, *dlogits, {logits.dtype()});
  CeShape c{};
  c.stride = logits.shape().back();
  c.all_rows = labels.numel();
  c.offset = a.step.attrs.has("row_offset") ? std::max<int64_t>(a.step.attrs.i("row_offset"), 0) : 0;
  c.rows = c.stride ? logits.numel() / c.stride : c.all_rows;
  c.classes = a.step.attrs.i("classes") > 0 ? a.step.attrs.i("classes") : c.stride;
  c.ignore_index = a.step.attrs.i("ignore_index");
  c.smoothing = a.step.attrs.f("label_smoothing");
  c.warp = c.stride <= kMaxWarpClasses;
  c.vec = c.stride % (16 / static_cast<int64_t>(dtype_size(logits.dtype()))) == 0 && aligned16(logits.data) &&
          (!dlogits || aligned16(dlogits->data));
  const int sms = std::max(a.ctx.sm_count, 1);
  c.blocks = c.warp ? blocks_for(c.rows, kWarpBlock / 32, sms * 16)
                    : static_cast<unsigned>(std::clamp<int64_t>(c.rows, 1, int64_t{sms} * 4));
  return c;
}

Launch prepare_cross_entropy(const StepArgs& a) {
  const CeShape c = ce_shape(a, a.in[0], a.in[1], nullptr);
  expect_dtype(a, a.out[0], {DType::f32});
  const int32_t* labels = a.in[1].as<int32_t>();
  float* out = a.out[0].as<float>();
  auto* row_loss = static_cast<double*>(a.ctx.scratch(static_cast<size_t>(c.rows) * sizeof(double)));
  auto* row_used = static_cast<int*>(a.ctx.scratch(static_cast<size_t>(c.rows) * sizeof(int)));
  DeviceError* err = a.ctx.error;
  const int step = a.index;
  Launch launch;
  dispatch_storage(a.in[0].dtype(), op_name(a.step.op), [&]<class T>() {
    const T* logits = a.in[0].as<T>();
    launch = [=](cudaStream_t st) {
      if (c.warp)
        ce_rows<WarpGroup><<<c.blocks, kWarpBlock, 0, st>>>(
            logits, labels, c.rows, c.classes, c.stride, c.ignore_index, c.smoothing, c.vec, row_loss, row_used, err,
            step);
      else
        ce_rows<BlockGroup><<<c.blocks, kRowBlock, 0, st>>>(
            logits, labels, c.rows, c.classes, c.stride, c.ignore_index, c.smoothing, c.vec, row_loss, row_used, err,
            step);
      SEAM_CUDA_LAUNCH_CHECK();
      ce_mean<<<1, kReduceBlock, 0, st>>>(row_loss, row_used, c.rows, out);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

Launch prepare_cross_entropy_grad(const StepArgs& a) {
  const CeShape c = ce_shape(a, a.in[1], a.in[2], &a.out[0]);
  const Scalar dy = upstream(a, a.in[0], a.in[1].dtype());
  const int32_t* labels = a.in[2].as<int32_t>();
  auto* scale = static_cast<double*>(a.ctx.scratch(sizeof(double)));
  DeviceError* err = a.ctx.error;
  const int step = a.index;
  if (a.out[0].numel() == 0) return [](cudaStream_t) {};
  Launch launch;
  dispatch_storage(a.in[1].dtype(), op_name(a.step.op), [&]<class T>() {
    const T* logits = a.in[1].as<T>();
    T* dz = a.out[0].as<T>();
    launch = [=](cudaStream_t st) {
      ce_grad_scale<<<1, kReduceBlock, 0, st>>>(dy, labels, c.rows, c.classes, c.ignore_index, scale, err, step);
      SEAM_CUDA_LAUNCH_CHECK();
      if (c.warp)
        ce_grad_rows<WarpGroup><<<c.blocks, kWarpBlock, 0, st>>>(
            logits, labels, c.rows, c.classes, c.stride, c.ignore_index, c.smoothing, c.vec, scale, dz);
      else
        ce_grad_rows<BlockGroup><<<c.blocks, kRowBlock, 0, st>>>(
            logits, labels, c.rows, c.classes, c.stride, c.ignore_index, c.smoothing, c.vec, scale, dz);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

// Up to this many rows, every block counts the labels itself (one launch).
constexpr int64_t kSelfCountRows = 2048;

Launch prepare_cross_entropy_with_grad(const StepArgs& a) {
  const DeviceTensor &logits_t = a.in[0], &labels_t = a.in[1], &dy_t = a.in[2];
  const CeShape c = ce_shape(a, logits_t, labels_t, &a.out[1]);
  expect_dtype(a, a.out[0], {DType::f32});
  const Scalar dy = upstream(a, dy_t, logits_t.dtype());
  // A chunk's divisor counts labels outside its rows: counted first, whatever its size.
  const bool counted = c.rows > kSelfCountRows || c.rows != c.all_rows;
  const int32_t* all_labels = labels_t.as<int32_t>();
  const int32_t* labels = all_labels + c.offset;
  const float* loss_acc = nullptr;
  const int32_t* correct_acc = nullptr;
  if (a.in.size() > 3) {
    expect_dtype(a, a.in[3], {DType::f32});
    loss_acc = a.in[3].as<float>();
  }
  if (a.in.size() > 4) {
    expect_dtype(a, a.in[4], {DType::i32});
    correct_acc = a.in[4].as<int32_t>();
  }
  float* loss = a.out[0].as<float>();
  int32_t* correct = nullptr;
  if (a.out.size() == 3) {
    expect_dtype(a, a.out[2], {DType::i32});
    correct = a.out[2].as<int32_t>();
  }
  auto* arrived = static_cast<unsigned*>(a.ctx.scratch(sizeof(unsigned)));
  auto* count = static_cast<int64_t*>(a.ctx.scratch(sizeof(int64_t)));
  DeviceError* err = a.ctx.error;
  const int step = a.index;
  Launch launch;
  dispatch_storage(logits_t.dtype(), op_name(a.step.op), [&]<class T>() {
    const T* logits = logits_t.as<T>();
    T* dz = a.out[1].as<T>();
    // Block rows in packs are staged in shared memory, two rows a block where two fit
    // (the next one copied while this one is computed), else one; the grid is then as
    // many blocks as stay resident (each loops over rows: a second wave would wait for
    // the first's last rows).
    const size_t row_bytes = static_cast<size_t>(c.stride) * sizeof(T);
    // The kernel's static shared memory (its reductions', the buffers' barriers) comes
    // out of the same allowance.
    const size_t room = static_cast<size_t>(smem_optin()) - kStaticShared;
    const int buffers = c.warp || !c.vec ? 0 : 2 * row_bytes <= room ? 2 : row_bytes <= room ? 1 : 0;
    auto rows_kernel = [&]() {
      if (c.warp) return counted ? ce_with_grad_rows<WarpGroup, true, T, false> : ce_with_grad_rows<WarpGroup, false, T, false>;
      if (buffers > 0)
        return counted ? ce_with_grad_rows<BlockGroup, true, T, true> : ce_with_grad_rows<BlockGroup, false, T, true>;
      return counted ? ce_with_grad_rows<BlockGroup, true, T, false> : ce_with_grad_rows<BlockGroup, false, T, false>;
    }();
    const int threads = c.warp ? kWarpBlock : buffers > 0 ? kStagedBlock : kRowBlock;
    const size_t smem = buffers * row_bytes;
    int resident = 0;
    if (buffers > 0) {
      SEAM_CUDA_CHECK(cudaFuncSetAttribute(rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      SEAM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, rows_kernel, threads, smem));
    }
    const unsigned blocks =
        buffers > 0 ? static_cast<unsigned>(std::clamp<int64_t>(c.rows, 1, int64_t{std::max(a.ctx.sm_count, 1)} *
                                                                               std::max(resident, 1)))
                    : c.blocks;
    auto* block_loss = static_cast<double*>(a.ctx.scratch(blocks * sizeof(double)));
    int64_t* block_correct =
        correct ? static_cast<int64_t*>(a.ctx.scratch(blocks * sizeof(int64_t))) : nullptr;
    launch = [=](cudaStream_t st) {
      if (counted) {
        ce_count<<<1, kReduceBlock, 0, st>>>(all_labels, c.all_rows, c.classes, c.ignore_index, count);
        SEAM_CUDA_LAUNCH_CHECK();
      }
      rows_kernel<<<blocks, threads, smem, st>>>(logits, labels, c.rows, c.classes, c.stride, c.ignore_index,
                                                 c.smoothing, c.vec, buffers, dy, count, block_loss, block_correct, arrived, loss,
                                                 correct, loss_acc, correct_acc, dz, err, step);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

// prediction and target share one dtype (f32, bf16, f16).
void expect_mse_operands(const StepArgs& a, const DeviceTensor& p, const DeviceTensor& t) {
  expect_dtype(a, p, kStored);
  expect_dtype(a, t, {p.dtype()});
}

Launch prepare_mse(const StepArgs& a) {
  expect_mse_operands(a, a.in[0], a.in[1]);
  expect_dtype(a, a.out[0], {DType::f32});
  const int64_t n = a.in[0].numel();
  float* out = a.out[0].as<float>();
  // Fixed at prepare time, so the summation order is the same every run.
  const unsigned blocks = blocks_for(n, kThreads, std::max(a.ctx.sm_count, 1) * 4);
  auto* partial = static_cast<double*>(a.ctx.scratch(blocks * sizeof(double)));
  Launch launch;
  dispatch_storage(a.in[0].dtype(), op_name(a.step.op), [&]<class T>() {
    const T* p = a.in[0].as<T>();
    const T* t = a.in[1].as<T>();
    launch = [=](cudaStream_t st) {
      mse_partial<<<blocks, kThreads, 0, st>>>(p, t, n, partial);
      SEAM_CUDA_LAUNCH_CHECK();
      mse_mean<<<1, kReduceBlock, 0, st>>>(partial, static_cast<int>(blocks), n, out);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

Launch prepare_mse_grad(const StepArgs& a) {
  expect_mse_operands(a, a.in[1], a.in[2]);
  expect_dtype(a, a.out[0], {a.in[1].dtype()});
  const Scalar dy = upstream(a, a.in[0], a.in[1].dtype());
  const int64_t n = a.in[1].numel();
  if (n == 0) return [](cudaStream_t) {};
  const unsigned blocks = blocks_for(n, kThreads, std::max(a.ctx.sm_count, 1) * 8);
  Launch launch;
  dispatch_storage(a.in[1].dtype(), op_name(a.step.op), [&]<class T>() {
    const T* p = a.in[1].as<T>();
    const T* t = a.in[2].as<T>();
    T* dp = a.out[0].as<T>();
    launch = [=](cudaStream_t st) {
      mse_grad_kernel<<<blocks, kThreads, 0, st>>>(dy, p, t, dp, n);
      SEAM_CUDA_LAUNCH_CHECK();
    };
  });
  return launch;
}

}  // namespace

void register_loss(PreparerTable& t) {
  set(t, Op::cross_entropy, prepare_cross_entropy);
  set(t, Op::cross_entropy_grad, prepare_cross_entropy_grad);
  set(t, Op::cross_entropy_with_grad, prepare_cross_entropy_with_grad);
  set(t, Op::mse, prepare_mse);
  set(t, Op::mse_grad, prepare_mse_grad);
}

}  // namespace seam::cuda
