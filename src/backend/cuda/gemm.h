// GEMMs on cuBLASLt for the CUDA backend (matmul.cu uses them): descriptors built once
// per shape, the algorithm chosen once per (shapes, dtypes, layouts, epilogue, pointer
// alignments) and kept in a cache that is saved to disk and read back on the next run.
//
// How an algorithm is chosen: cuBLASLt's heuristic proposes up to kGemmCandidates
// algorithms; each is timed with CUDA events on the plan's stream, on the step's real
// buffers (a GEMM run at prepare time only writes its outputs; the executable keeps a
// copy of those outside the arena while the step is prepared), and the fastest is kept.
// A candidate that fails to run is skipped.
//
// The cache: one process-wide table per cache file (shared by every Model of the
// process), read when the first GemmCache for that file is constructed and written back
// (temp file + rename, merged with what the file holds by then) when a GemmCache that
// learned something is destroyed. The file is
//   $XDG_CACHE_HOME/seam/ (or $HOME/.cache/seam/) gemm-<GPU>-sm<cc>-<SMs>sm-lt<cuBLASLt version>.txt
// with a header line naming the format version, GPU and cuBLASLt version, then one GEMM a
// line:
//   gemm ta=0 tb=1 m=256 n=1024 k=784 ... type=14 dtype=0 ... aaux=0 algo=<8 x 16 hex digits, ':'-separated>
//        ws=<bytes> ns=<time>
// (see key fields in gemm.cu; type and dtype are the cudaDataType_t of A/B and of D, so an
// algorithm chosen for f32 is never reused for bf16). The file is never trusted: a
// malformed line or a file with another header (another version of the format, written
// before the key had dtypes) is dropped, and an entry read from it is used only after
// cublasLtMatmulAlgoCheck accepts it for the real descriptors and a trial run succeeds;
// otherwise the GEMM is timed again and the entry replaced.
#pragma once
#include <cublasLt.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda.h"

namespace seam::cuda {

class GemmCache {
 public:
  GemmCache();   // reads the cache file of this GPU and cuBLASLt version, if any
  ~GemmCache();  // writes it back when it learned something
  GemmCache(const GemmCache&) = delete;
  GemmCache& operator=(const GemmCache&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }
  // Frees the workspace that timing GEMMs at prepare time takes (32 MiB, made again when a
  // later prepare times another): a prepared step runs in the context's own workspace.
  void release_tuning_workspace();

 private:
  Impl* impl_;
};

// The workspace every GEMM may use (cuBLAS recommends 32 MiB on Hopper).
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
// Heuristic candidates timed per GEMM.
inline constexpr int kGemmCandidates = 16;

// One GEMM in cuBLASLt's own column-major terms:
//   D[m, n] = epilogue(op(A) [m, k] . op(B) [k, n]), `batch` times,
// A stored as [m, k] (trans_a false) or [k, m] (trans_a true), column-major with leading
// dimension lda; B likewise ([k, n] or [n, k], ldb); D [m, n] with ldc. Batch i reads
// A + i * stride_a, B + i * stride_b and writes D + i * stride_c (elements; a stride of 0
// broadcasts that operand). A and B are stored as ab_type (f32, bf16 or f16), D as d_type
// (ab_type, or f32 from 16-bit A and B); products accumulate in fp32 (TF32 tensor cores
// only for f32 A and B under ctx.tf32). C is D with beta = 0, or with `accumulate` a
// matrix of its own laid out like D (GemmOperands::c) with beta = 1: D = C + the product,
// before the epilogue's activation (a residual added by the GEMM that reads it anyway).
// An epilogue's bias (read or written) and gelu aux have D's type: cuBLASLt's default
// for these types, and the only one it takes (an f32 bias with a bf16 D is
// INVALID_VALUE), so a preparer whose bias has another type adds it with a kernel of
// its own.
//
// A row-major buffer X[r, c] read column-major is X^T [c, r] with ld c: the preparers in
// matmul.cu derive each op's mapping from that.
struct GemmShape {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  DType ab_type = DType::f32, d_type = DType::f32;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  // Leading dimension of the epilogue's auxiliary matrix (laid out like D): bits for the
  // relu mask (a multiple of 128), elements for gelu's pre-activation (a multiple of 8).
  int64_t aux_ld = 0;
  bool accumulate = false;  // beta = 1 with GemmOperands::c
};

// The buffers of one run of the GEMM.
struct GemmOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const void* c = nullptr;  // GemmShape::accumulate: D's addend (D's layout and type; D itself in place)
};

// The epilogue's vectors, fixed in the descriptor: bias (BIAS*: read, length m; BGRADB:
// written, length n) and aux (*_AUX: written; DRELU / DGELU: read).
struct GemmEpilogueData {
  void* bias = nullptr;
  void* aux = nullptr;
};

// Prepares a GEMM that runs once per entry of `calls`, in order, with the same shape and
// epilogue data (a batch broadcast that one strided batch cannot express): builds the
// descriptors, picks the algorithm (from the cache, or by timing on calls[0]'s buffers
// and every call's epilogue data), reserves the workspace, and returns the launch.
// `what` names the step in error messages.
Launch prepare_gemm(Context& ctx, const GemmShape& shape, std::vector<GemmOperands> calls, GemmEpilogueData epilogue,
                    const std::string& what);
// The same, but where cuBLASLt has no algorithm for this GEMM (an epilogue it lacks for
// these types, layouts or alignments) it returns an empty Launch and says why in *why:
// a step with another way to compute it (a split variant) falls back to that.
Launch try_prepare_gemm(Context& ctx, const GemmShape& shape, std::vector<GemmOperands> calls,
                        GemmEpilogueData epilogue, const std::string& what, std::string* why);

// A GEMM whose operands are given only when it runs (a step's temporaries in the lane's
// workspace, past the kGemmWorkspaceBytes that cuBLASLt itself uses there): prepared and
// tuned on `calls`' buffers (as prepare_gemm), then run on operands at least as aligned as
// those. No epilogue.
using GemmRun = std::function<void(const GemmOperands&, cudaStream_t)>;
GemmRun prepare_gemm_run(Context& ctx, const GemmShape& shape, std::vector<GemmOperands> calls, const std::string& what);

// Equivalent ways to compute one step: a GEMM with its epilogue fused, and the plain GEMM
// followed by separate kernels. Which is faster depends on the shape (some of cuBLASLt's
// epilogue kernels run well below its plain ones), so each variant is timed on the
// step's buffers and the fastest kept. The pick is saved with the GEMM algorithms under
// `key` (one word, no spaces; it names the op, shapes and precision) and the names of the
// variants available, and used without timing on later runs (a build that offers another
// variant times the step again). Records what it chose in ctx.choices for plan step `step`.
// Running a variant must only write the step's outputs (timing runs it several times).
// Steps offer "fused" and "split" (some also "split_t"; on sm_90 bf16 GELU layers and their
// gradients also "wgmma", the GEMM of our own, wgmma_gemm.h, and plain linear layers
// "cublaslt" and "wgmma"); ctx.epilogue may force one, "fused" forcing "wgmma" where it is
// offered (its epilogue is fused too), "split" forcing "cublaslt" where there is no split.
// A variant with an empty launch is not available (try_prepare_gemm found no algorithm,
// or cuBLASLt's epilogue does not take the step's dtypes): it is never chosen, and a
// policy forcing it gets "split" instead, noted in ctx.choices.
struct Variant {
  std::string name;  // one word: "fused", "split", ...
  Launch launch;     // empty: not available
  std::function<void()> unused = {};  // called if another variant is chosen (frees its memory)
  std::string why_not = {};           // why launch is empty, for ctx.choices
};
Launch choose_variant(Context& ctx, int step, const std::string& key, std::vector<Variant> variants);

// What the GEMM caches of this process did (for tests and diagnostics).
struct GemmCacheStats {
  int64_t tuned = 0;            // GEMMs whose algorithm was chosen by timing
  int64_t memory_hits = 0;      // found already checked in the process-wide table
  int64_t disk_hits = 0;        // found as read from the file, checked and used
  int64_t rejected = 0;         // read from the file but refused by the check or a trial run
  int64_t malformed_lines = 0;  // lines of cache files dropped when read
  int64_t files_written = 0;
  int64_t variants_timed = 0;   // steps whose variant was chosen by timing
  int64_t variant_hits = 0;     // steps whose variant came from the table
};
GemmCacheStats gemm_cache_stats();

// The cache file for the current device and cuBLASLt version under the current
// environment ($XDG_CACHE_HOME, $HOME); empty if neither names a folder.
std::string gemm_cache_path();

}  // namespace seam::cuda
