// Generated kernels for fused_elementwise groups: CUDA source written from the group's
// program and the expressions of seam/ops.def (and ew_math.h), compiled by NVRTC into a
// cubin for this GPU, once per signature, cached in memory and on disk.
//
// The signature: the program text (which names the outputs), the dtype each input is
// loaded in and each output stored in (f32, bf16, f16; every value is computed in float),
// which inputs have the output's shape (read at the element's own index) or are broadcast
// (read through strides), the vector width (4: four neighbouring elements a thread, loaded
// and stored 4 at a time, a float4 or four 16-bit values in 8 bytes, when every operand is
// aligned to that and each broadcast one is contiguous or constant along an innermost dim
// of a multiple of 4), 32- or 64-bit index arithmetic, how the kernel walks its elements
// (layout), and the GPU architecture. Its hash names the
// file: $XDG_CACHE_HOME/seam/kernels/ew-<hash>.cubin (or ~/.cache/seam/...), holding a
// header line, the signature, what the compiler reported (registers, spill bytes, shared
// memory), the
// cubin's size and checksum, then the cubin. A file whose header, signature, size or
// checksum does not match is not trusted: the kernel is compiled again and the file
// rewritten.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/fused_ew.h"

namespace seam::cuda {

inline constexpr int kEwMaxInputs = 16;
inline constexpr int kEwMaxOutputs = 8;
inline constexpr int kEwMaxDims = 8;

// The generated kernel's one parameter; the same struct is written into the source.
// Operands are untyped: each is read or written in its signature's dtype.
struct EwArgs {
  const void* in[kEwMaxInputs];
  void* out[kEwMaxOutputs];
  long long n;     // elements of the index space (every input broadcast)
  long long nvec;  // groups of four handled by the vector loop (0 when vec is 1)
  int rank;        // dims of the index space, innermost first
  long long size[kEwMaxDims];
  long long st[kEwMaxInputs][kEwMaxDims];  // element strides of broadcast inputs
  // Programs with sum/mean outputs: the index space split into the kept and the reduced
  // dims (innermost first, with their row-major strides in the index space); each block
  // reduces `chunk` of the `len` reduced elements of its outputs. One chunk: the block
  // stores out = sum * scale; more: it stores the double sum in partial[chunk][output][kept]
  // and a second kernel adds the chunks up in order.
  int kept_rank, red_rank;
  long long kept_size[kEwMaxDims], kept_st[kEwMaxDims], red_size[kEwMaxDims], red_st[kEwMaxDims];
  long long kept, len, chunk;
  double* partial;
  double scale[kEwMaxOutputs];
  // DeviceCounters (its step, then its seed), for a program that draws dropout masks.
  const void* counters;
};

// How the kernel walks its index space: one thread per element (vectorized when it can),
// or, ending in reductions, by tiles of 32 kept elements x a chunk of reduced ones (the
// innermost dim kept, bias-gradient style) or by one warp per kept element (the innermost
// dim reduced).
// A program ending in a layer norm walks by rows (norm): a warp per row of the last dim.
enum class EwLayout { elementwise, columns, rows, norm };

struct EwSignature {
  std::string program;        // its outputs are the kernel's
  std::vector<bool> strided;  // per input: read through strides (broadcast)
  // Per input and per output: its storage dtype (f32, bf16 or f16); empty: all f32.
  std::vector<DType> in_dtypes, out_dtypes;
  // Per input, with vec 4: a broadcast input constant along the innermost dim (one load
  // for the four lanes) rather than contiguous along it (a float4 at its own offset).
  std::vector<bool> splat;
  int vec = 1;                // 1 or 4
  bool idx32 = false;         // the index space fits 32-bit index arithmetic
  int arch = 90;              // compute capability major * 10 + minor
  EwLayout layout = EwLayout::elementwise;
  // Norm walks: values a lane holds in registers (rows of up to 32 * row_values; see
  // lane_groups), or 0: the row is written to y and read back.
  int row_values = 0;
  int inputs() const { return static_cast<int>(strided.size()); }
  DType in_dtype(int k) const { return in_dtypes.empty() ? DType::f32 : in_dtypes.at(static_cast<size_t>(k)); }
  DType out_dtype(int j) const { return out_dtypes.empty() ? DType::f32 : out_dtypes.at(static_cast<size_t>(j)); }
  std::string key() const;    // one line, every field and the generated source's hash
  std::string hash() const;   // of the key, 16 hex digits
};

// Values a lane of a warp holds to keep a row of `dim` (<= 1024) in registers: the
// smallest of 1, 2, 4, 8, 12, 16, 24, 32 groups of 32 that covers it. Few sizes, so few
// kernels; layer_norm's kernels and generated norm walks share them.
inline int lane_groups(int64_t dim) {
  for (int n : {1, 2, 4, 8, 12, 16, 24})
    if (32 * n >= dim) return n;
  return 32;
}

struct GeneratedKernel {
  std::string key;
  std::vector<char> cubin;
  // Once loaded, the function's own figures (spill_bytes: its local memory a thread,
  // spills and local arrays alike); before, the compiler's report (-1: not in it).
  int registers = 0, spill_bytes = 0;
  int shared_bytes = 0;  // static shared memory a block
  double compile_ms = 0;  // 0 when it came from a cache
  std::string log;        // NVRTC's, when compiled in this process
  cudaKernel_t kernel = nullptr;  // set once loaded on the GPU
};

// The CUDA source for a signature (the kernel is named seam_fused_ew).
std::string ew_source(const EwSignature& s);

// Compiles with NVRTC (no GPU needed); fills cubin, registers, spills, shared memory and
// compile_ms.
// Throws seam::Error with NVRTC's log on failure.
GeneratedKernel compile_ew(const EwSignature& s);

// The kernel for a signature, loaded: from this process's table, else the disk cache,
// else compiled (and saved). Thread-safe.
std::shared_ptr<const GeneratedKernel> ew_kernel(const EwSignature& s);

// What a signature's kernel needs: with a GPU, the loaded function's figures (ew_kernel);
// without one, the compiler's report, from the disk cache, else compiled (and saved).
GeneratedKernel ew_kernel_info(const EwSignature& s);

// Threads of 256-thread blocks one SM (Hopper: 64K registers, 228 KB shared memory,
// 2048 threads) holds at once with this much per thread and block; 0 when a figure is
// unknown (negative), so that an unknown kernel never passes as fitting.
int resident_threads(int registers, int shared_bytes);

struct KernelCacheStats {
  int64_t compiled = 0, memory_hits = 0, disk_hits = 0, rejected_files = 0, files_written = 0;
};
KernelCacheStats kernel_cache_stats();
// Forgets the kernels this process loaded (they stay valid), so that the next request
// goes to the disk cache: for tests of the cache.
void forget_loaded_kernels();
// The file a signature is cached in (empty if no cache folder is known).
std::string kernel_cache_file(const EwSignature& s);

}  // namespace seam::cuda
