// The GEMM of wgmma_gemm.h.
//
// Shape of the work. Output tiles of 128 x 256, taken in turn by one persistent block an
// SM (or pair of blocks: below); tiles walk groups of 8 row tiles across every column tile,
// so that the blocks running at one time share A's rows and B's tiles in L2. A block is
// 3 warpgroups: group 2 is the producer, one thread of it issuing TMA copies of A's 128 x 64
// and B's 256 x 64 k-slices into a ring of 4 stages (48 KB each); warps 0-7 are two
// consumer warpgroups, each multiplying its 64 rows of the tile with m64n256k16 wgmmas
// (128 f32 accumulators a thread). A stage's `full` barrier completes when its bytes have
// landed; its `empty` barrier when both groups' products that read it have finished, after
// which the producer refills it, running ahead into the next tile while the consumers
// store this one. Registers: a register file part (a quarter of the SM) holds 16K for the
// warps placed on it, three of this block's twelve, so a block of 12 warps (or of 9: 288
// threads fail to launch above 168) gets 168 a thread at launch; the producer group then
// gives up all but 40 and the consumers take 232 (setmaxnreg), which the epilogues need.
//
// Epilogue. Each group writes its 64 x 256 rows 64 columns at a time into one of its two
// 8 KB shared buffers (the GELU epilogue: both, the record and the value) in the TMA's
// 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8): the eight rows a warp's
// store touches fall in distinct banks), then one thread hands the buffer to a bulk
// tensor store and goes on; before a buffer is written again its previous store must
// have read it. Rows and columns past the matrix are clipped by the store, and read as
// zeros by the loads, so no shape needs padding.
//
// A's column sums (sums_a). The producer group has one thread issuing copies and three
// warps with nothing to do: two of them read each landed A tile from shared memory, one
// its upper 64 rows, one its lower, a 16-byte chunk (8 columns) of 16 rows a thread, add
// across the four lanes that share the chunk and store the 64 rows' sums of the slice's 64
// columns. Of the col_tiles tiles that read the same A rows, the one whose column index is
// the slice's number modulo col_tiles sums it, so each partial is written once, by a
// fixed order, and the work spreads over the blocks. Those warps release a stage as the
// consumers do (the `empty` barrier counts them), so the ring waits for them too; they
// read 16 KB a slice where the tensor cores take ~0.6 us over it.
//
// Clusters (cluster = 2): the blocks of a pair take tiles one above the other, and each
// loads half of B's tile for both (TMA multicast), so a stage is free only once the
// consumers of both blocks released it, and no block leaves while its peer may still
// write to it.
//
// Measured (docs/perf.md, "W6 takes the Hopper GEMM..."): single blocks at 0.90-1.00x
// cuBLASLt on W6's layer products, at parity with its GELU_AUX_BIAS, 0.94-0.97x its DGELU
// (faster with the column sums, which cuBLASLt leaves to a second read of D); pairs within
// a few percent of single blocks; weight gradients on half the SMs (too few tiles without
// split K). The epilogue overlaps nothing; handing it to spare warps, ping-pong groups and
// deferring it into the next tile's products (2f82e9b, 34a57b2, 3631655) were all
// measured slower (docs/architecture/gemm.md). The steps offer it as a timed variant
// (matmul.cu).
#include <cuda.h>

#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/storage.cuh"
#include "backend/cuda/wgmma.cuh"
#include "backend/cuda/wgmma_gemm.h"

namespace seam::cuda {
namespace {

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4, kThreads = 384;
// Registers a thread after setmaxnreg. A group's increase waits until the others'
// decreases have freed enough of what the block got at launch (65536 / 384, rounded down
// to 8: 168 a thread), so the three groups' counts must fit in three times that, or the
// consumers wait forever.
[[maybe_unused]] constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8, kProducerRegs = 40, kConsumerRegs = 232;
static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * kLaunchRegs, "setmaxnreg beyond the block's registers");
constexpr uint32_t kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2, kCBuf = 64 * 64 * 2;
[[maybe_unused]] constexpr int kGroupRows = 8;  // row tiles a group of the tile order spans
// The ring, the four store buffers, the barriers (the ring's two a stage, DGELU's record
// one a store buffer), and room to align the ring to 1024.
constexpr size_t kSmemBytes = kStages * (kABytes + kBBytes) + 4 * kCBuf + (2 * kStages + 4) * 8 + 1024;

// The epilogues that add a bias.
constexpr bool biased(WgmmaEpilogue e) {
  return e == WgmmaEpilogue::bias || e == WgmmaEpilogue::bias_gelu_aux || e == WgmmaEpilogue::bias_add;
}

// GELU (tanh form) and its derivative as ew_math.h has them, with the hardware's tanh: one
// MUFU op a value where the shared forms' sigmoid takes two exponentials, which an
// epilogue that stalls the tensor cores cannot spare. Written as the FMAs they are (the
// compiler may not reassociate): with u = c (x + k x^3),
//   gelu(x)  = 0.5 x (1 + tanh u)                           6 ops,
//   gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2)  10 ops, t = tanh u
// where the plain spelling took 9 and 16.
[[maybe_unused]] __device__ __forceinline__ float tanh_approx(float u) {
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
  return t;
}
constexpr float kGeluC = 0.7978845608028654f, kGeluK = 0.044715f;
[[maybe_unused]] __device__ __forceinline__ float gelu_tanh(float x) {
  const float t = tanh_approx(x * fmaf(x * x, kGeluC * kGeluK, kGeluC)), h = 0.5f * x;
  return fmaf(h, t, h);
}
[[maybe_unused]] __device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float x2 = x * x, t = tanh_approx(x * fmaf(x2, kGeluC * kGeluK, kGeluC));
  const float w = x * fmaf(x2, 1.5f * kGeluC * kGeluK, 0.5f * kGeluC);  // 0.5 x du/dx
  return fmaf(w, fmaf(-t, t, 1.0f), fmaf(0.5f, t, 0.5f));
}

// One round of a reduce-scatter over lanes 2W apart: of the 2W values part[0, 2W) a lane
// keeps the half its lane bit 2W names, adds its partner's copy of that half, and holds the
// W sums in part[0, W). W a template argument: the array stays in registers.
template <int W>
__device__ __forceinline__ void halve_across(float (&part)[16], int lane) {
  const bool upper = lane & (2 * W);
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const float keep = upper ? part[W + i] : part[i], send = upper ? part[i] : part[W + i];
    part[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * W);
  }
}

template <WgmmaEpilogue E, int CL, bool AT, bool BT>
__global__ void __launch_bounds__(kThreads, 1) wgmma_gemm_kernel(const __grid_constant__ CUtensorMap map_a,
                                                   const __grid_constant__ CUtensorMap map_b,
                                                   const __grid_constant__ CUtensorMap map_d,
                                                   const __grid_constant__ CUtensorMap map_aux,
                                                   const bf16_t* __restrict__ bias, float* __restrict__ col_sums,
                                                   int m, int n, int k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* s_a = smem;
  uint8_t* s_b = s_a + kStages * kABytes;
  uint8_t* s_c = s_b + kStages * kBBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(s_c + 4 * kCBuf);
  uint64_t* empty = full + kStages;
  uint64_t* record = empty + kStages;  // DGELU: a store buffer's record has landed

  const int row_tiles = (m + kBM - 1) / kBM, col_tiles = (n + kBN - 1) / kBN, slices = (k + kBK - 1) / kBK;
  // A unit: CL tiles one above the other, one a block of the cluster, sharing B's tile.
  const int row_units = (row_tiles + CL - 1) / CL, units = row_units * col_tiles;
  const int cluster = blockIdx.x / CL, clusters = gridDim.x / CL;
  const uint32_t rank = CL > 1 ? wg::cluster_rank() : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s]);
      // Both groups of every block read the stage, and the summing warps their own A.
      mbar_init(&empty[s], 2 * CL + (E == WgmmaEpilogue::sums_a ? 2 : 0));
    }
    for (int b = 0; b < 4; ++b) mbar_init(&record[b]);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // the inits before any arrival
  }
  if constexpr (CL > 1) wg::cluster_sync();  // no block's copies or arrivals reach a peer not yet set up
  else __syncthreads();
  auto unit_origin = [&](int u, int& m0, int& n0) {
    const int per_group = kGroupRows * col_tiles, first = u / per_group * kGroupRows;
    const int rows = min(kGroupRows, row_units - first), r = u % per_group;
    m0 = ((first + r % rows) * CL + static_cast<int>(rank)) * kBM;
    n0 = r / rows * kBN;
  };

  if (threadIdx.x >= 256) {  // the producer group
    wg::regs_shrink<kProducerRegs>();
    if (threadIdx.x == 256) {
      int pos = 0;  // k-slices issued so far, over this block's tiles
      for (int u = cluster; u < units; u += clusters) {
        int m0, n0;
        unit_origin(u, m0, n0);
        for (int kb = 0; kb < slices; ++kb, ++pos) {
          const int s = pos % kStages;
          // Each block's share of B lands in every block: all of them must have freed s.
          if (pos >= kStages) mbar_wait(&empty[s], (pos / kStages - 1) & 1);
          wg::bar_expect(&full[s], kABytes + kBBytes);  // a box past the edges still counts whole
          // A [m, k]: one box of kBM rows. A [k, m]: two boxes of 64 k-rows by 64 columns.
          if constexpr (AT) {
            wg::tma_load(s_a + s * kABytes, &map_a, m0, kb * kBK, &full[s]);
            wg::tma_load(s_a + s * kABytes + kABytes / 2, &map_a, m0 + 64, kb * kBK, &full[s]);
          } else {
            wg::tma_load(s_a + s * kABytes, &map_a, kb * kBK, m0, &full[s]);
          }
          // B [n, k]: one box of this block's kBN / CL rows. B [k, n]: boxes of 64 k-rows by
          // 64 columns, side by side, this block's kBN / 64 / CL of them.
          constexpr int boxes = BT ? kBN / 64 / CL : 1, box_bytes = kBBytes / CL / boxes;
#pragma unroll
          for (int i = 0; i < boxes; ++i) {
            const int at = static_cast<int>(rank) * boxes + i;
            uint8_t* dst = s_b + s * kBBytes + at * box_bytes;
            const int x = BT ? n0 + at * 64 : kb * kBK, y = BT ? kb * kBK : n0 + at * (kBN / CL);
            if constexpr (CL == 1) wg::tma_load(dst, &map_b, x, y, &full[s]);
            else wg::tma_load_multicast(dst, &map_b, x, y, &full[s], (1u << CL) - 1);
          }
        }
      }
    } else if constexpr (E == WgmmaEpilogue::sums_a && !AT) {  // A's column sums (above)
      if (threadIdx.x >= 320) {
        // Warp w sums rows 64 w + lane / 8 + 4 i of the tile, chunk lane % 8 of each.
        const int t = threadIdx.x - 320, lane = t % 32, chunk = lane % 8, row0 = t / 32 * 64 + lane / 8;
        int pos = 0;
        for (int u = cluster; u < units; u += clusters) {
          int m0, n0;
          unit_origin(u, m0, n0);
          const int mine = n0 / kBN;
          for (int kb = 0; kb < slices; ++kb, ++pos) {
            const int s = pos % kStages;
            mbar_wait(&full[s], (pos / kStages) & 1);
            if (kb % col_tiles == mine && m0 < m) {
              float acc[8] = {};
              const uint32_t tile = smem_addr(s_a + s * kABytes);
#pragma unroll 2
              for (int i = 0; i < 16; ++i) {
                const int r = row0 + 4 * i;  // line r's chunk c sits at chunk c ^ (r % 8)
                const uint4 v = wg::lds128(tile + r * 128 + ((chunk ^ (r & 7)) * 16));
                const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                  const float2 f = bf16_unpair(w[q]);
                  acc[2 * q] += f.x;
                  acc[2 * q + 1] += f.y;
                }
              }
#pragma unroll
              for (int q = 0; q < 8; ++q) {  // lanes chunk, chunk + 8, + 16, + 24
                acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], 8);
                acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], 16);
              }
              const int col = kb * kBK + chunk * 8;
              if (lane < 8 && col < k) {
                float4* dst = reinterpret_cast<float4*>(col_sums + static_cast<int64_t>(m0 / 64 + t / 32) * k + col);
                dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
                dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
              }
            }
            __syncwarp();
            if (lane == 0) wg::bar_arrive(&empty[s]);
          }
        }
      }
    }
  } else {  // the consumer groups
    wg::regs_grow<kConsumerRegs>();
    const int group = threadIdx.x / 128, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    float d[kBN / 2];
    int j = 0, piece = 0;  // tiles done by this block; stores issued by this group
    // DGELU's record (bias_add's residual) comes through the store buffers: piece p of a
    // tile (64 columns) is loaded by the TMA into buffer p % 2 (pieces 0 and 1 during the
    // tile's first slice, 2 and 3 once the stores of 0 and 1 have read their buffers),
    // rewritten in place and stored from there. record_phase: a bit a buffer, the phase
    // its barrier waits for.
    constexpr bool dgelu = E == WgmmaEpilogue::dgelu, reads_aux = dgelu || E == WgmmaEpilogue::bias_add;
    uint64_t* my_record = record + 2 * group;
    uint32_t record_phase = 0;
    auto load_record = [&](int p, int m0, int n0) {  // one thread of the group
      uint8_t* buf = s_c + (group * 2 + p % 2) * kCBuf;
      wg::bar_expect(&my_record[p % 2], kCBuf);
      wg::tma_load(buf, &map_aux, n0 + p * 64, m0 + group * 64, &my_record[p % 2]);
    };
    auto release = [&](uint64_t* bar) {  // this group is done with a stage, in every block
      if constexpr (CL == 1) {
        if (tid == 0) wg::bar_arrive(bar);
      } else {
        if (tid < CL) wg::bar_arrive_at(bar, tid);  // thread r tells block r
      }
    };
    for (int u = cluster; u < units; u += clusters, ++j) {
      int m0, n0;
      unit_origin(u, m0, n0);
      int pos = j * slices;
      for (int kb = 0; kb < slices; ++kb, ++pos) {
        const int s = pos % kStages;
        mbar_wait(&full[s], (pos / kStages) & 1);
        wg::mma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          wg::mma_64x256x16<AT, BT>(d,
                                    AT ? wg::sw128_desc_mn(s_a + s * kABytes + group * (kABytes / 2) + kk * 16 * 128)
                                       : wg::sw128_desc(s_a + s * kABytes + group * 64 * 128 + kk * 32),
                                BT ? wg::sw128_desc_mn(s_b + s * kBBytes + kk * 16 * 128)
                                   : wg::sw128_desc(s_b + s * kBBytes + kk * 32),
                                kb | kk);
        wg::mma_commit();
        if constexpr (reads_aux) {
          // While the first slice multiplies: the last tile's stores have read the buffers.
          // (Fetching pieces 2 and 3 into L2 here too made DGELU 3% slower on the H200.)
          if (kb == 0 && tid == 0 && m0 < m) {
            wg::tma_store_wait_read<0>();
            for (int p = 0; p < 2 && n0 + p * 64 < n; ++p) load_record(p, m0, n0);
          }
        }
        wg::mma_wait<1>();  // the previous slice's products are done: its stage may refill
        if (kb > 0) release(&empty[(pos - 1) % kStages]);
      }
      // A piece's bias pairs are loaded a piece ahead: loads issued after the barriers below
      // would wait out their latency there, the tensor cores idle (Nsight Compute: a fifth
      // of the epilogue's stalls).
      uint32_t bias_next[8];
      auto load_bias = [&](int p) {
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const int col = n0 + p * 64 + q * 8 + 2 * (lane % 4);  // even, n too: both in range
          bias_next[q] = col < n ? __ldg(reinterpret_cast<const unsigned int*>(bias + col)) : 0u;
        }
      };
      if constexpr (biased(E)) load_bias(0);
      wg::mma_wait<0>();
      release(&empty[(pos - 1) % kStages]);
      if (m0 >= m) continue;  // a cluster's tile past the last row: its products were of zeros

      // One output: the two buffers alternate, a store may still read the other. Two (the
      // GELU's record and its value): both buffers a piece, once the last stores have read.
      constexpr bool two = E == WgmmaEpilogue::bias_gelu_aux;
#pragma unroll
      for (int p = 0; p < kBN / 64; ++p, ++piece) {
        const int col0 = n0 + p * 64;
        if (col0 >= n) break;  // the same for the whole group
        uint32_t bias_now[8];
        if constexpr (biased(E)) {
#pragma unroll
          for (int q = 0; q < 8; ++q) bias_now[q] = bias_next[q];
          if (p + 1 < kBN / 64) load_bias(p + 1);
        }
        uint8_t* buf = s_c + (group * 2 + (two ? 0 : reads_aux ? p % 2 : piece & 1)) * kCBuf;
        if constexpr (reads_aux) {  // each thread rewrites only the values it reads
          mbar_wait(&my_record[p % 2], (record_phase >> (p % 2)) & 1);
          record_phase ^= 1u << (p % 2);
        } else {
          if (tid == 0) {
            if constexpr (two) wg::tma_store_wait_read<0>();
            else wg::tma_store_wait_read<1>();
          }
          wg::named_sync(1 + group, 128);
        }
        float part[16];  // DGELU: this thread's sums of its two rows, a column pair a q
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          float2 b = make_float2(0.0f, 0.0f);
          if constexpr (biased(E)) b = bf16_unpair(bias_now[q]);
          float sum0 = 0.0f, sum1 = 0.0f;  // DGELU: this thread's two rows of the two columns
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = warp * 16 + lane / 4 + 8 * h;
            const int at = r * 128 + ((q ^ (r & 7)) * 16) + 4 * (lane % 4);
            float x0 = d[4 * (p * 8 + q) + 2 * h], x1 = d[4 * (p * 8 + q) + 2 * h + 1];
            if constexpr (biased(E)) {  // x + 0.0f is no identity (-0): not added where there is no bias
              x0 += b.x;
              x1 += b.y;
            }
            const uint32_t where = smem_addr(buf) + at;
            if constexpr (dgelu) {
              const float2 pre = bf16_unpair(wg::lds32(where));
              x0 *= gelu_tanh_grad(pre.x);
              x1 *= gelu_tanh_grad(pre.y);
            } else if constexpr (reads_aux) {
              const float2 residual = bf16_unpair(wg::lds32(where));
              x0 += residual.x;
              x1 += residual.y;
            }
            const uint32_t y = bf16_pair(x0, x1);
            wg::sts32(where, y);
            if constexpr (two) wg::sts32(where + kCBuf, bf16_pair(gelu_tanh(x0), gelu_tanh(x1)));
            if constexpr (dgelu) {  // the values as stored
              const float2 stored = bf16_unpair(y);
              sum0 += stored.x;
              sum1 += stored.y;
            }
          }
          if constexpr (dgelu) {
            part[2 * q] = sum0;
            part[2 * q + 1] = sum1;
          }
        }
        // DGELU's column sums over the warp's 16 rows. The eight lanes sharing lane % 4 hold
        // the same 16 columns, two rows each: a reduce-scatter among them (each round a lane
        // keeps the half its lane bit names and adds its partner's copy of that half, three
        // rounds, a fixed order) leaves lane l the 16 rows' sums of q = l / 4's pair, and the
        // warp writes 64 columns in one coalesced store.
        if (dgelu && col_sums) {
          halve_across<8>(part, lane);
          halve_across<4>(part, lane);
          halve_across<2>(part, lane);
          const int row16 = (m0 + group * 64 + warp * 16) / 16, col = col0 + lane / 4 * 8 + 2 * (lane % 4);
          if (col < n && row16 * 16 < m)
            *reinterpret_cast<float2*>(col_sums + static_cast<int64_t>(row16) * n + col) =
                make_float2(part[0], part[1]);
        }
        wg::fence_to_async();
        wg::named_sync(1 + group, 128);
        if (tid == 0) {
          wg::tma_store(two ? &map_aux : &map_d, buf, col0, m0 + group * 64);
          if constexpr (two) wg::tma_store(&map_d, buf + kCBuf, col0, m0 + group * 64);
          if (reads_aux && p + 2 < kBN / 64 && col0 + 128 < n) {  // the buffer's next piece, once read
            wg::tma_store_wait_read<0>();
            load_record(p + 2, m0, n0);
          }
        }
      }
    }
    if (tid == 0) wg::tma_store_wait_all();
  }
  if constexpr (CL > 1) wg::cluster_sync();  // no block leaves while a peer may still write to it
#endif
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, found once through the runtime (no link to libcuda).
EncodeTiled encoder() {
  static EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    SEAM_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || p == nullptr)
      fail("the CUDA driver has no cuTensorMapEncodeTiled (needed by the sm_90 GEMM)");
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A row-major [rows, cols] bf16 matrix read or written in boxes of box_rows x 64 columns
// (128 bytes: the swizzle span).
CUtensorMap tensor_map(const void* p, int64_t rows, int64_t cols, uint32_t box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, box_rows}, steps[2] = {1, 1};
  const CUresult r = encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p), dims, strides, box,
                               steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail("cuTensorMapEncodeTiled failed (", static_cast<int>(r), ") for a [", rows, ", ", cols, "] matrix");
  return map;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The launch's configuration, and its grid: persistent, one block an SM, or for clusters as
// many as can run at once (a GPC whose free SMs are odd leaves one over), never more than
// there are units of work.
template <class Kernel>
int configure(Kernel kernel, int CL, int sm_count, int64_t units, cudaLaunchConfig_t& config,
              cudaLaunchAttribute& attr) {
  // A function's attribute holds for the current device: set where the launch is prepared.
  SEAM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)));
  config = {};
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = CL;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = CL > 1 ? 1 : 0;  // single blocks launch as they always have
  int clusters = std::max(sm_count / CL, 1);
  if (CL > 1) {
    int fit = 0;
    config.gridDim = dim3(clusters * CL);
    SEAM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit, kernel, &config));
    if (fit < 1) fail("the sm_90 GEMM: no cluster of ", CL, " blocks fits on this GPU");
    clusters = std::min(clusters, fit);
  }
  return static_cast<int>(std::min<int64_t>(units, clusters)) * CL;
}

template <WgmmaEpilogue E, int CL, bool AT, bool BT>
Launch launch_of(int sm_count, int64_t units, const CUtensorMap& a, const CUtensorMap& b, const CUtensorMap& d,
                 const CUtensorMap& aux, const void* bias, const std::function<float*()>& col_sums, int m, int n,
                 int k) {
  auto* kernel = wgmma_gemm_kernel<E, CL, AT, BT>;
  cudaLaunchConfig_t config;
  cudaLaunchAttribute attr;
  const int grid = configure(kernel, CL, sm_count, units, config, attr);
  const auto* bias16 = static_cast<const bf16_t*>(bias);
  return [=](cudaStream_t stream) {
    cudaLaunchConfig_t c = config;
    cudaLaunchAttribute at = attr;
    c.gridDim = dim3(grid);
    c.stream = stream;
    c.attrs = &at;
    float* sums = col_sums ? col_sums() : nullptr;
    SEAM_CUDA_CHECK(cudaLaunchKernelEx(&c, kernel, a, b, d, aux, bias16, sums, m, n, k));
    SEAM_CUDA_LAUNCH_CHECK();
  };
}

template <int CL, bool AT, bool BT>
Launch launch_with(WgmmaEpilogue epilogue, int sm_count, int64_t units, const CUtensorMap& a, const CUtensorMap& b,
                   const CUtensorMap& d, const CUtensorMap& aux, const void* bias,
                   const std::function<float*()>& col_sums, int m, int n, int k) {
  switch (epilogue) {
    case WgmmaEpilogue::none:
      return launch_of<WgmmaEpilogue::none, CL, AT, BT>(sm_count, units, a, b, d, aux, bias, col_sums, m, n, k);
    case WgmmaEpilogue::bias:
      return launch_of<WgmmaEpilogue::bias, CL, AT, BT>(sm_count, units, a, b, d, aux, bias, col_sums, m, n, k);
    case WgmmaEpilogue::bias_gelu_aux:
      return launch_of<WgmmaEpilogue::bias_gelu_aux, CL, AT, BT>(sm_count, units, a, b, d, aux, bias, col_sums, m,
                                                                  n, k);
    case WgmmaEpilogue::dgelu:
      return launch_of<WgmmaEpilogue::dgelu, CL, AT, BT>(sm_count, units, a, b, d, aux, bias, col_sums, m, n, k);
    case WgmmaEpilogue::bias_add:  // a linear layer's forward only: no other layout instantiated
      if constexpr (!AT && !BT)
        return launch_of<WgmmaEpilogue::bias_add, CL, AT, BT>(sm_count, units, a, b, d, aux, bias, col_sums, m, n, k);
      fail("the sm_90 GEMM adds a residual only with A stored [m, k] and B [n, k]");  // wgmma_gemm refuses it first
    case WgmmaEpilogue::sums_a:
      if constexpr (!AT)
        return launch_of<WgmmaEpilogue::sums_a, CL, AT, BT>(sm_count, units, a, b, d, aux, bias, col_sums, m, n, k);
      fail("the sm_90 GEMM sums A's columns only with A stored [m, k]");  // wgmma_gemm refuses it first
  }
  fail("unknown epilogue");
}

void check_cluster(int cluster) {
  if (cluster != 1 && cluster != 2) fail("the sm_90 GEMM takes clusters of 1 or 2 blocks, not ", cluster);
}

// Work units: tiles, or pairs of tiles one above the other.
int64_t units_of(int64_t m, int64_t n, int cluster) {
  return (((m + kBM - 1) / kBM + cluster - 1) / cluster) * ((n + kBN - 1) / kBN);
}

}  // namespace

int64_t wgmma_gemm_col_sum_rows(int64_t m) { return (m + 15) / 16; }
int64_t wgmma_gemm_a_sum_rows(int64_t m) { return (m + kBM - 1) / kBM * 2; }

int wgmma_gemm_grid(int sm_count, int64_t m, int64_t n, int cluster) {
  cudaLaunchConfig_t config;
  cudaLaunchAttribute attr;
  check_cluster(cluster);
  const int64_t units = units_of(m, n, cluster);
  if (cluster == 1)
    return configure(wgmma_gemm_kernel<WgmmaEpilogue::none, 1, false, false>, 1, sm_count, units, config, attr);
  return configure(wgmma_gemm_kernel<WgmmaEpilogue::none, 2, false, false>, 2, sm_count, units, config, attr);
}

bool wgmma_gemm_runs_here() {
  int device = 0, major = 0, minor = 0;
  SEAM_CUDA_CHECK(cudaGetDevice(&device));
  SEAM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  SEAM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

bool wgmma_gemm_fits(int64_t m, int64_t n, int64_t k, const void* a, const void* b, const void* d,
                     const void* aux, std::string* why, bool a_km) {
  auto no = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  if (!wgmma_gemm_runs_here()) return no("built for sm_90a only");
  if (m <= 0 || n <= 0 || k <= 0) return no("an empty product");
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return no("a dimension past 2^31");
  if (k % 8 != 0 || n % 8 != 0) return no("k and n must be multiples of 8");
  if (a_km && m % 8 != 0) return no("m must be a multiple of 8 with A stored [k, m]");
  if (!aligned16(a) || !aligned16(b) || !aligned16(d) || (aux && !aligned16(aux)))
    return no("operands not 16-byte aligned");
  return true;
}

Launch wgmma_gemm(int sm_count, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* d,
                  WgmmaEpilogue epilogue, const WgmmaOptions& o) {
  std::string why;
  if (!wgmma_gemm_fits(m, n, k, a, b, d, o.aux, &why, o.a_km))
    fail("the sm_90 GEMM cannot take [", m, ", ", k, "] x [", n, ", ", k, "]: ", why);
  if (biased(epilogue) && (o.bias == nullptr || reinterpret_cast<uintptr_t>(o.bias) % 4 != 0))
    fail("the sm_90 GEMM's epilogue needs a 4-byte aligned bias");
  if ((epilogue == WgmmaEpilogue::bias_gelu_aux || epilogue == WgmmaEpilogue::dgelu) && o.aux == nullptr)
    fail("the sm_90 GEMM's GELU epilogues need their record");
  if (epilogue == WgmmaEpilogue::bias_add && (o.aux == nullptr || o.a_km || o.b_kn))
    fail("the sm_90 GEMM adds a residual (aux) with A stored [m, k] and B [n, k] only");
  const bool sums_a = epilogue == WgmmaEpilogue::sums_a;
  if (sums_a && (!o.col_sums || o.a_km)) fail("the sm_90 GEMM sums A's columns into given partials, A stored [m, k]");
  if (o.col_sums) {  // where they go now; the launch asks again, and its place keeps the alignment
    if (epilogue != WgmmaEpilogue::dgelu && !sums_a) fail("the sm_90 GEMM sums columns only with DGELU or sums_a");
    if (reinterpret_cast<uintptr_t>(o.col_sums()) % (sums_a ? 16 : 8) != 0)
      fail("the sm_90 GEMM's column sums must be ", sums_a ? 16 : 8, "-byte aligned");
  }
  check_cluster(o.cluster);
  const CUtensorMap map_a = o.a_km ? tensor_map(a, k, m, kBK) : tensor_map(a, m, k, kBM),
                    map_b = o.b_kn ? tensor_map(b, k, n, kBK) : tensor_map(b, n, k, kBN / o.cluster),
                    map_d = tensor_map(d, m, n, 64), map_aux = tensor_map(o.aux ? o.aux : d, m, n, 64);
  const int64_t units = units_of(m, n, o.cluster);
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  using Fn = Launch (*)(WgmmaEpilogue, int, int64_t, const CUtensorMap&, const CUtensorMap&, const CUtensorMap&,
                       const CUtensorMap&, const void*, const std::function<float*()>&, int, int, int);
  constexpr Fn by_layout[2][2][2] = {{{launch_with<1, false, false>, launch_with<1, false, true>},
                                      {launch_with<1, true, false>, launch_with<1, true, true>}},
                                     {{launch_with<2, false, false>, launch_with<2, false, true>},
                                      {launch_with<2, true, false>, launch_with<2, true, true>}}};
  const Fn launch = by_layout[o.cluster - 1][o.a_km][o.b_kn];
  return launch(epilogue, sm_count, units, map_a, map_b, map_d, map_aux, o.bias, o.col_sums, mi, ni, ki);
}

}  // namespace seam::cuda
