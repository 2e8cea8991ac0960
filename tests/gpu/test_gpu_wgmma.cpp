// The sm_90 GEMM of seam's own (backend/cuda/wgmma_gemm.h) against a CPU product in
// double, on fresh random bf16 operands: whole tiles and ragged edges in every dimension,
// several tiles a block (a block count below the tile count), each epilogue, and the
// shapes it must refuse. Skipped, by name, on GPUs other than compute capability 9.0.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/wgmma_gemm.h"

namespace {

using seam::cuda::WgmmaEpilogue;

struct Buffer {
  void* p = nullptr;
  explicit Buffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~Buffer() { cudaFree(p); }
};

std::vector<__nv_bfloat16> random_bf16(size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<__nv_bfloat16> v(n);
  for (auto& x : v) x = __float2bfloat16(u(rng));
  return v;
}

// x [rows, cols] stored as [cols, rows].
std::vector<__nv_bfloat16> transposed(const std::vector<__nv_bfloat16>& x, int64_t rows, int64_t cols) {
  std::vector<__nv_bfloat16> t(x.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = x[i * cols + j];
  return t;
}

double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_tanh_grad(double x) {
  const double c = 0.7978845608028654, t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

// Every element within bf16's rounding of the reference (2^-8 relative), with a floor of
// 1e-2 of the reference's RMS for the elements that cancel.
void expect_close(const std::vector<__nv_bfloat16>& got, const std::vector<double>& want, const std::string& what) {
  double sq = 0;
  for (double w : want) sq += w * w;
  const double rms = std::sqrt(sq / static_cast<double>(want.size()));
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i) {
    const double g = __bfloat162float(got[i]), tol = 1e-2 * std::abs(want[i]) + 1e-2 * rms;
    if (!(std::abs(g - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << g << ", want " << want[i] << " (tolerance " << tol << ")";
      ++bad;
    }
  }
}

void check_one(int64_t m, int64_t n, int64_t k, WgmmaEpilogue e, int blocks, int cluster, bool a_km, bool b_kn,
               unsigned seed, bool in_place = false) {
  std::string why;
  const bool sums_a = e == WgmmaEpilogue::sums_a;
  const int64_t sum_rows = sums_a ? seam::cuda::wgmma_gemm_a_sum_rows(m) : seam::cuda::wgmma_gemm_col_sum_rows(m),
                sum_cols = sums_a ? k : n;
  Buffer a(m * k * 2), b(n * k * 2), d(m * n * 2), aux(m * n * 2), bias(n * 2), sums(sum_rows * sum_cols * 4);
  if (!seam::cuda::wgmma_gemm_fits(m, n, k, a.p, b.p, d.p, aux.p, &why, a_km)) GTEST_SKIP() << why;
  const bool gelu = e == WgmmaEpilogue::bias_gelu_aux, dgelu = e == WgmmaEpilogue::dgelu,
             residual = e == WgmmaEpilogue::bias_add, with_bias = e == WgmmaEpilogue::bias || gelu || residual;
  // bias_add's residual: its own buffer, or D itself (the stream updated in place).
  void* aux_p = residual && in_place ? d.p : aux.p;
  const std::function<float*()> sums_at = [p = sums.p] { return static_cast<float*>(p); };
  const seam::cuda::Launch run =
      seam::cuda::wgmma_gemm(blocks, m, n, k, a.p, b.p, d.p, e,
                             {.bias = with_bias ? bias.p : nullptr,
                              .aux = gelu || dgelu || residual ? aux_p : nullptr,
                              .cluster = cluster,
                              .a_km = a_km,
                              .b_kn = b_kn,
                              .col_sums = dgelu || sums_a ? sums_at : std::function<float*()>()});
  std::mt19937 rng(seed);
  for (int round = 0; round < 2; ++round) {
    const auto ha = random_bf16(m * k, rng, 1.0f), hb = random_bf16(n * k, rng, 1.0f);
    const auto hbias = random_bf16(n, rng, 2.0f);
    ASSERT_EQ(cudaMemcpy(a.p, (a_km ? transposed(ha, m, k) : ha).data(), m * k * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(b.p, (b_kn ? transposed(hb, n, k) : hb).data(), n * k * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(bias.p, hbias.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    // DGELU's record: pre-activations over GELU's curved part and both tails.
    const auto hpre = random_bf16(m * n, rng, 4.0f);
    if (dgelu) {
      ASSERT_EQ(cudaMemcpy(aux.p, hpre.data(), m * n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    }
    if (!(residual && in_place)) {
      ASSERT_EQ(cudaMemset(d.p, 0xff, m * n * 2), cudaSuccess);  // NaNs wherever nothing is written
    }
    if (residual) {  // the residual stream's values
      ASSERT_EQ(cudaMemcpy(aux_p, hpre.data(), m * n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    }
    ASSERT_EQ(cudaMemset(sums.p, 0xff, sum_rows * sum_cols * 4), cudaSuccess);
    run(nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<double> pre(m * n), out(m * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = with_bias ? __bfloat162float(hbias[j]) : 0.0;
        for (int64_t x = 0; x < k; ++x)
          s += static_cast<double>(__bfloat162float(ha[i * k + x])) * __bfloat162float(hb[j * k + x]);
        pre[i * n + j] = s;
        const double aux_value = __bfloat162float(hpre[i * n + j]);
        out[i * n + j] = gelu ? gelu_tanh(s) : dgelu ? s * gelu_tanh_grad(aux_value) : residual ? s + aux_value : s;
      }
    std::vector<__nv_bfloat16> hd(m * n), haux(m * n);
    ASSERT_EQ(cudaMemcpy(hd.data(), d.p, m * n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    const std::string what = "[" + std::to_string(m) + ", " + std::to_string(k) + "] x [" + std::to_string(n) + ", " +
                             std::to_string(k) + "], " + std::to_string(blocks) + " blocks, clusters of " +
                             std::to_string(cluster) + (a_km ? ", A stored [k, m]" : "") +
                             (b_kn ? ", B stored [k, n]" : "") + ", round " + std::to_string(round);
    const char* epilogue = gelu       ? ", gelu"
                           : dgelu    ? ", dgelu"
                           : sums_a   ? ", sums_a"
                           : residual ? (in_place ? ", residual added in place" : ", residual added")
                                      : "";
    expect_close(hd, out, what + epilogue);
    if (gelu) {
      ASSERT_EQ(cudaMemcpy(haux.data(), aux.p, m * n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      expect_close(haux, pre, what + ", record");
    }
    // DGELU's column sums over each 16 rows: each term carries D's bf16 rounding (0.4% of
    // it at most), the roundings adding up like noise.
    if (dgelu) {
      std::vector<float> hs(sum_rows * n);
      ASSERT_EQ(cudaMemcpy(hs.data(), sums.p, hs.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      int bad = 0;
      for (int64_t t = 0; t < sum_rows && bad < 5; ++t)
        for (int64_t j = 0; j < n && bad < 5; ++j) {
          double want = 0, sq = 0;
          for (int64_t i = 16 * t; i < std::min(m, 16 * t + 16); ++i) {
            want += out[i * n + j];
            sq += out[i * n + j] * out[i * n + j];
          }
          if (!(std::abs(hs[t * n + j] - want) <= 3e-2 * std::sqrt(sq) + 1e-6)) {
            ADD_FAILURE() << what << ", column sum of rows " << 16 * t << "+ column " << j << ": " << hs[t * n + j]
                          << ", want " << want;
            ++bad;
          }
        }
    }
    // A's column sums over each 64 rows: sums of exact bf16 values in f32.
    if (sums_a) {
      std::vector<float> hs(sum_rows * k);
      ASSERT_EQ(cudaMemcpy(hs.data(), sums.p, hs.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      int bad = 0;
      for (int64_t t = 0; t < sum_rows && bad < 5; ++t)
        for (int64_t j = 0; j < k && bad < 5; ++j) {
          double want = 0, sq = 0;
          for (int64_t i = 64 * t; i < std::min(m, 64 * t + 64); ++i) {
            const double x = __bfloat162float(ha[i * k + j]);
            want += x;
            sq += x * x;
          }
          if (!(std::abs(hs[t * k + j] - want) <= 1e-5 * std::sqrt(sq) + 1e-6)) {
            ADD_FAILURE() << what << ", A's column sum of rows " << 64 * t << "+ column " << j << ": "
                          << hs[t * k + j] << ", want " << want;
            ++bad;
          }
        }
    }
  }
}

// D = epilogue(A B^T) for one shape, `blocks` persistent blocks, two rounds of new values;
// single blocks and pairs sharing B's tile, each operand stored either way (A [k, m] where
// m is a multiple of 8).
void check(int64_t m, int64_t n, int64_t k, WgmmaEpilogue e, int blocks, unsigned seed) {
  for (bool a_km : {false, true})
    for (bool b_kn : {false, true})
      for (int cluster : {1, 2})
        if (!a_km || (m % 8 == 0 && e != WgmmaEpilogue::sums_a))  // sums_a reads A [m, k] only
          check_one(m, n, k, e, blocks, cluster, a_km, b_kn, seed + 100 * cluster + 1000 * b_kn + 2000 * a_km);
}

int sms() {
  int device = 0, count = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  return count;
}

TEST(GpuWgmma, WholeTilesMatchTheCpu) {
  check(128, 256, 64, WgmmaEpilogue::none, sms(), 1);
  check(256, 512, 768, WgmmaEpilogue::none, sms(), 2);
}

TEST(GpuWgmma, RaggedEdgesMatchTheCpu) {
  check(300, 264, 200, WgmmaEpilogue::none, sms(), 3);  // every dimension past a tile
  check(1, 8, 8, WgmmaEpilogue::none, sms(), 4);
  check(1000, 776, 72, WgmmaEpilogue::bias, sms(), 5);
}

// Fewer blocks than tiles: each block takes several, its stage ring carrying its phases
// from one tile to the next.
TEST(GpuWgmma, SeveralTilesABlockMatchTheCpu) {
  check(1040, 520, 320, WgmmaEpilogue::bias, 3, 6);  // 27 tiles on 3 blocks
  check(640, 768, 136, WgmmaEpilogue::none, 7, 7);
}

TEST(GpuWgmma, GeluRecordAndValueMatchTheCpu) {
  check(384, 512, 256, WgmmaEpilogue::bias_gelu_aux, sms(), 8);
  check(200, 264, 96, WgmmaEpilogue::bias_gelu_aux, 2, 9);
  check(384, 264, 768, WgmmaEpilogue::bias_gelu_aux, 2, 12);  // 3 tiles a block, 12 k-slices each
  check(256, 520, 64, WgmmaEpilogue::bias_gelu_aux, 2, 14);   // one k-slice a tile
}

// The backward of the above: the record loaded through the store buffers, two pieces a
// buffer, ragged pieces clipped; D's column sums.
TEST(GpuWgmma, GeluGradientMatchesTheCpu) {
  check(384, 512, 256, WgmmaEpilogue::dgelu, sms(), 10);
  check(1000, 776, 72, WgmmaEpilogue::dgelu, 5, 11);
  check(384, 264, 512, WgmmaEpilogue::dgelu, 2, 13);  // 3 tiles a block, 8 k-slices each
  check(256, 520, 64, WgmmaEpilogue::dgelu, 2, 15);    // one k-slice
}

// A residual added with the bias (a linear layer's forward onto its residual stream): the
// residual loaded through the store buffers as DGELU's record is, into D's own buffer or
// another; one layout (A [m, k], B [n, k]), single blocks and pairs.
TEST(GpuWgmma, ResidualAddMatchesTheCpu) {
  const auto one = [](int64_t m, int64_t n, int64_t k, int blocks, unsigned seed) {
    for (int cluster : {1, 2})
      for (bool in_place : {false, true})
        check_one(m, n, k, WgmmaEpilogue::bias_add, blocks, cluster, false, false, seed + 10 * cluster + in_place,
                  in_place);
  };
  one(384, 512, 256, sms(), 20);
  one(1000, 776, 72, 5, 21);   // ragged rows and columns, several tiles a block
  one(384, 264, 768, 2, 22);   // 12 k-slices a tile
  one(256, 520, 64, 2, 23);    // one k-slice a tile
}

// A data gradient's product with A's column sums (the bias gradient's partials): one
// column tile (every block sums every slice), three (a third each), ragged rows and
// columns, one k-slice, several tiles a block.
TEST(GpuWgmma, ColumnSumsOfAMatchTheCpu) {
  check(256, 256, 512, WgmmaEpilogue::sums_a, sms(), 16);
  check(384, 768, 320, WgmmaEpilogue::sums_a, sms(), 17);
  check(1000, 264, 200, WgmmaEpilogue::sums_a, 5, 18);
  check(200, 520, 64, WgmmaEpilogue::sums_a, 2, 19);
}

TEST(GpuWgmma, ShapesItCannotTakeAreRefusedByReason) {
  Buffer a(1 << 16), b(1 << 16), d(1 << 16);
  std::string why;
  if (!seam::cuda::wgmma_gemm_fits(64, 64, 64, a.p, b.p, d.p, nullptr, &why)) GTEST_SKIP() << why;
  EXPECT_FALSE(seam::cuda::wgmma_gemm_fits(64, 64, 60, a.p, b.p, d.p, nullptr, &why));
  EXPECT_NE(why.find("multiples of 8"), std::string::npos) << why;
  EXPECT_FALSE(seam::cuda::wgmma_gemm_fits(64, 60, 64, a.p, b.p, d.p, nullptr, &why));
  EXPECT_FALSE(seam::cuda::wgmma_gemm_fits(64, 64, 64, static_cast<char*>(a.p) + 8, b.p, d.p, nullptr, &why));
  EXPECT_NE(why.find("aligned"), std::string::npos) << why;
  EXPECT_FALSE(seam::cuda::wgmma_gemm_fits(0, 64, 64, a.p, b.p, d.p, nullptr, &why));
  EXPECT_TRUE(seam::cuda::wgmma_gemm_fits(60, 64, 64, a.p, b.p, d.p, nullptr, &why));
  EXPECT_FALSE(seam::cuda::wgmma_gemm_fits(60, 64, 64, a.p, b.p, d.p, nullptr, &why, /*a_km=*/true));
  EXPECT_NE(why.find("m must be a multiple of 8 with A stored [k, m]"), std::string::npos) << why;
  auto error_of = [&](int64_t k, WgmmaEpilogue e, int cluster = 2, float* sums = nullptr) {
    try {
      seam::cuda::WgmmaOptions o{.cluster = cluster};
      if (sums) o.col_sums = [sums] { return sums; };
      seam::cuda::wgmma_gemm(1, 64, 64, k, a.p, b.p, d.p, e, o);
    } catch (const std::exception& x) {
      return std::string(x.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(64, WgmmaEpilogue::bias_gelu_aux).find("bias"), std::string::npos);
  EXPECT_NE(error_of(64, WgmmaEpilogue::dgelu).find("GELU epilogues need their record"), std::string::npos);
  EXPECT_NE(error_of(64, WgmmaEpilogue::none, 3).find("clusters of 1 or 2 blocks, not 3"), std::string::npos);
  const std::string plain_sums = error_of(64, WgmmaEpilogue::none, 1, static_cast<float*>(a.p));
  EXPECT_NE(plain_sums.find("sums columns only with DGELU or sums_a"), std::string::npos) << plain_sums;
  EXPECT_NE(error_of(64, WgmmaEpilogue::sums_a).find("sums A's columns into given partials"), std::string::npos);
  for (const bool b_kn : {false, true}) {  // no residual given; B stored [k, n]
    try {
      seam::cuda::wgmma_gemm(1, 64, 64, 64, a.p, b.p, d.p, WgmmaEpilogue::bias_add,
                             {.bias = b.p, .aux = b_kn ? a.p : nullptr, .b_kn = b_kn});
      ADD_FAILURE() << "a residual add " << (b_kn ? "with B stored [k, n]" : "without a residual");
    } catch (const std::exception& x) {
      EXPECT_NE(std::string(x.what()).find("adds a residual (aux) with A stored [m, k] and B [n, k] only"),
                std::string::npos)
          << x.what();
    }
  }
  Buffer aux(1 << 16);
  try {
    seam::cuda::wgmma_gemm(1, 64, 64, 64, a.p, b.p, d.p, WgmmaEpilogue::dgelu,
                           {.aux = aux.p, .col_sums = [p = a.p] { return static_cast<float*>(p) + 1; }});
    ADD_FAILURE() << "column sums at a 4-byte offset";
  } catch (const std::exception& x) {
    EXPECT_NE(std::string(x.what()).find("column sums must be 8-byte aligned"), std::string::npos) << x.what();
  }
  try {
    seam::cuda::wgmma_gemm_grid(132, 64, 64, 4);
    ADD_FAILURE() << "a grid for clusters of 4";
  } catch (const std::exception& x) {
    EXPECT_NE(std::string(x.what()).find("clusters of 1 or 2 blocks, not 4"), std::string::npos) << x.what();
  }
  EXPECT_NE(error_of(60, WgmmaEpilogue::none).find("[64, 60] x [64, 60]: k and n must be multiples of 8"),
            std::string::npos);
}

}  // namespace
