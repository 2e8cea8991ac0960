// Generated kernels for fused_elementwise: source, NVRTC, caches (see codegen.h).
#include "backend/cuda/codegen.h"

#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/ew_math_source.h"
#include "common/file.h"
#include "ops/elementwise.h"

namespace seam::cuda {

namespace {

struct Counters {
  std::atomic<int64_t> compiled{0}, memory_hits{0}, disk_hits{0}, rejected_files{0}, files_written{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

std::string literal(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return std::string("T(") + buf + ")";
}

std::string operand(const std::string& lane, int a) {
  return a >= 0 ? "i" + std::to_string(a) + lane : "t" + std::to_string(-a - 1) + lane;
}

// How a dtype is stored in generated source. 16-bit values travel as unsigned short and
// convert through the conversion instructions that cuda_bf16.h's and cuda_fp16.h's
// intrinsics compile to (round to nearest even), written inline: NVRTC then needs no
// header search path and no time for those headers.
std::string ctype(DType t) {
  SEAM_ASSERT(t == DType::f32 || is_half(t));
  return t == DType::f32 ? "float" : "unsigned short";
}
const char* half_name(DType t) { return t == DType::bf16 ? "bf16" : "f16"; }

// The value of element `idx` of operand `ptr` (an EwArgs pointer) as a float.
std::string load_expr(DType t, const std::string& ptr, const std::string& idx) {
  const std::string raw = "((const " + ctype(t) + "*)" + ptr + ")[" + idx + "]";
  return t == DType::f32 ? raw : "seam_from_" + std::string(half_name(t)) + "(" + raw + ")";
}
// Stores float `v` at element `idx` of output `ptr`.
std::string store_stmt(DType t, const std::string& ptr, const std::string& idx, const std::string& v) {
  return "((" + ctype(t) + "*)" + ptr + ")[" + idx + "] = " +
         (t == DType::f32 ? v : "seam_to_" + std::string(half_name(t)) + "(" + v + ")") + ";\n";
}

// The conversions a kernel uses, for the 16-bit dtypes among `used`: one value, and four
// packed in a uint2 (element 0 in the low half of .x). Before sm_80 there is no bf16
// conversion instruction: the rounding is done on the bits.
std::string half_helpers(const std::vector<DType>& used, int arch) {
  std::ostringstream o;
  for (DType t : {DType::bf16, DType::f16}) {
    if (std::find(used.begin(), used.end(), t) == used.end()) continue;
    const std::string n = half_name(t);
    if (t == DType::bf16) {
      o << "__device__ __forceinline__ float seam_from_bf16(unsigned short h) {\n"
           "  return __uint_as_float((unsigned)h << 16);\n}\n";
      if (arch >= 80)
        o << "__device__ __forceinline__ unsigned short seam_to_bf16(float f) {\n"
             "  unsigned short h;\n  asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n  return h;\n}\n";
      else
        o << "__device__ __forceinline__ unsigned short seam_to_bf16(float f) {\n"
             "  const unsigned u = __float_as_uint(f);\n"
             "  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);\n"
             "  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n}\n";
    } else {
      o << "__device__ __forceinline__ float seam_from_f16(unsigned short h) {\n"
           "  float f;\n  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));\n  return f;\n}\n";
      o << "__device__ __forceinline__ unsigned short seam_to_f16(float f) {\n"
           "  unsigned short h;\n  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n  return h;\n}\n";
    }
    o << "__device__ __forceinline__ float seam_round_" << n << "(float f) { return seam_from_" << n << "(seam_to_" << n
      << "(f)); }\n";
    o << "__device__ __forceinline__ float4 seam_unpack_" << n << "(uint2 w) {\n"
      << "  return make_float4(seam_from_" << n << "((unsigned short)(w.x & 0xffffu)), seam_from_" << n
      << "((unsigned short)(w.x >> 16)),\n                     seam_from_" << n
      << "((unsigned short)(w.y & 0xffffu)), seam_from_" << n << "((unsigned short)(w.y >> 16)));\n}\n";
    o << "__device__ __forceinline__ uint2 seam_pack_" << n << "(float4 v) {\n"
      << "  return make_uint2((unsigned)seam_to_" << n << "(v.x) | ((unsigned)seam_to_" << n << "(v.y) << 16),\n"
      << "                    (unsigned)seam_to_" << n << "(v.z) | ((unsigned)seam_to_" << n << "(v.w) << 16));\n}\n";
  }
  return o.str();
}

// The statements computing every temp of the program from i<k><lane> into t<k><lane>.
// A kernel's step and seed, read once from the device counters, for a program that draws.
std::string counters_stmt(const EwProgram& p) {
  if (!p.draws()) return "";
  return "  const uint64_t seam_step = (uint64_t)((const long long*)args.counters)[0];\n"
         "  const uint64_t seam_seed = (uint64_t)((const long long*)args.counters)[1];\n";
}

// The statements computing every temp t<k><lane> of the program; `at` is the element's
// index in the index space (what a dropout draws for).
std::string body(const EwProgram& p, const std::string& lane, const std::string& at) {
  std::ostringstream s;
  for (size_t k = 0; k < p.code.size(); ++k) {
    const EwInstr& in = p.code[k];
    auto arg = [&](size_t j) { return operand(lane, in.args[j]); };
    const std::string t = "t" + std::to_string(k) + lane;
    s << "    T " << t << ";\n    {\n";
    if (ew_draws(in.op)) {  // as dropout's kernel (src/backend/cuda/misc.cu): the same draw, in float
      char prob[40], keep[40];  // the float values exactly, as hexadecimal literals
      std::snprintf(prob, sizeof prob, "%af", static_cast<double>(static_cast<float>(in.p)));
      std::snprintf(keep, sizeof keep, "%af", static_cast<double>(static_cast<float>(1.0 / (1.0 - in.p))));
      s << "      const float u = seam::dropout_uniform(seam_seed, seam_step, " << in.stream << "u, (uint64_t)(" << at
        << "));\n";
      s << "      " << t << " = u >= " << prob << " ? " << arg(0) << " * " << keep << " : 0.0f;\n";
    } else if (const UnaryInfo* u = unary_info(in.op)) {
      s << "      const T p = " << (*u->attr ? literal(in.p) : "T(0)") << ";\n";
      if (in.op == u->op) {
        s << "      const T x = " << arg(0) << ";\n      " << t << " = (" << u->value << ");\n";
      } else {
        s << "      const T dy = " << arg(0) << ";\n";
        s << "      const T x = " << (u->uses == Uses::X ? arg(1) : "T(0)") << ";\n";
        s << "      const T y = " << (u->uses == Uses::Y ? arg(1) : "T(0)") << ";\n";
        s << "      " << t << " = (" << u->derivative << ");\n";
      }
    } else if (in.op == Op::cast) {  // a round trip through the dtype; f32 (or f64) keeps the float
      const std::string x = arg(0);
      const std::string v = is_half(in.dtype) ? "seam_round_" + std::string(half_name(in.dtype)) + "(" + x + ")" : x;
      s << "      " << t << " = " << v << ";\n";
    } else if (const BinaryInfo* b = binary_info(in.op)) {
      if (in.op == b->op) {
        s << "      const T a = " << arg(0) << ", b = " << arg(1) << ";\n      " << t << " = (" << b->value << ");\n";
      } else {
        s << "      const T dy = " << arg(0) << ", a = " << arg(1) << ", b = " << arg(2) << ";\n";
        s << "      " << t << " = (" << (in.op == b->grad_a ? b->da : b->db) << ");\n";
      }
    }
    s << "    }\n";
  }
  return s.str();
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string cache_dir() {
  const std::string root = cache_root();
  return root.empty() ? root : root + "/kernels";
}

constexpr const char* kFileHeader = "seam generated kernel v3";

// Reads a cache file; nullopt (and counted) if it is missing or not to be trusted.
std::optional<GeneratedKernel> read_cached(const std::string& path, const std::string& key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  auto reject = [] {
    counters().rejected_files += 1;
    return std::nullopt;
  };
  std::string header, key_line, info;
  if (!std::getline(in, header) || header != kFileHeader) return reject();
  if (!std::getline(in, key_line) || key_line != key) return reject();
  if (!std::getline(in, info)) return reject();
  GeneratedKernel k;
  unsigned long long size = 0, sum = 0;
  if (std::sscanf(info.c_str(), "registers=%d spill=%d smem=%d bytes=%llu fnv=%llx", &k.registers, &k.spill_bytes,
                  &k.shared_bytes, &size, &sum) != 5 ||
      size == 0 || size > (64ull << 20))
    return reject();
  k.cubin.resize(size);
  if (!in.read(k.cubin.data(), static_cast<std::streamsize>(size)) || in.peek() != EOF) return reject();
  if (fnv1a(k.cubin.data(), k.cubin.size()) != sum) return reject();
  k.key = key;
  return k;
}

// Written atomically, so that a reader never sees half a file; errors leave none (the
// kernel is only compiled again next time).
void write_cached(const std::string& path, const GeneratedKernel& k) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return;
  std::ostringstream head;
  head << kFileHeader << '\n' << k.key << '\n';
  head << "registers=" << k.registers << " spill=" << k.spill_bytes << " smem=" << k.shared_bytes
       << " bytes=" << k.cubin.size() << " fnv=" << hex(fnv1a(k.cubin.data(), k.cubin.size())) << '\n';
  const std::string text = head.str();
  try {
    write_file_atomically(path, [&](const WriteBytes& write) {
      write(std::as_bytes(std::span(text)));
      write(std::as_bytes(std::span(k.cubin)));
    });
  } catch (const Error&) {
    return;
  }
  counters().files_written += 1;
}

#define SEAM_NVRTC_CHECK(expr)                                                                       \
  do {                                                                                               \
    nvrtcResult seam_r_ = (expr);                                                                    \
    if (seam_r_ != NVRTC_SUCCESS) fail(__FILE__, ":", __LINE__, ": ", #expr, " failed: ", nvrtcGetErrorString(seam_r_)); \
  } while (0)

}  // namespace

namespace {

// NVRTC's options for an architecture (the strings live as long as the process).
//  177: a variable declared but not read (an op's expression may ignore x, y or p);
//  550: a temp set but not read (a program's value only another op reads, in a lane
//       whose outputs come from elsewhere).
std::vector<const char*> compile_options(int arch) {
  static std::mutex mu;
  static auto* names = new std::map<int, std::string>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = names->find(arch);
  if (it == names->end())
    it = names->emplace(arch, "-arch=sm_" + std::to_string(arch) + (arch == 90 ? "a" : "")).first;
  return {it->second.c_str(), "-Xptxas=-v", "--std=c++17", "-default-device", "--diag-suppress=177,550"};
}

// What else decides the cubin: the compiler's version and options.
std::string compiler_tag(int arch) {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) major = minor = -1;
  std::string t = "nvrtc" + std::to_string(major) + "." + std::to_string(minor);
  for (const char* o : compile_options(arch)) t += std::string(" ") + o;
  return t;
}

}  // namespace

std::string EwSignature::key() const {
  const char* walk = layout == EwLayout::columns ? " columns"
                     : layout == EwLayout::rows  ? " rows"
                     : layout == EwLayout::norm  ? " norm"
                                                 : "";
  std::string s = "ew sm" + std::to_string(arch) + walk +
                  (layout == EwLayout::norm ? " row" + std::to_string(row_values) : std::string()) + " vec" + std::to_string(vec) + (idx32 ? " i32" : " i64") +
                  " strided=";
  for (bool b : strided) s += b ? '1' : '0';
  s += " in=";
  for (int k = 0; k < inputs(); ++k) s += (k ? "," : "") + std::string(dtype_name(in_dtype(k)));
  s += " out=";
  const int outputs = static_cast<int>(EwProgram::cached(program).outputs.size());
  for (int j = 0; j < outputs; ++j) s += (j ? "," : "") + std::string(dtype_name(out_dtype(j)));
  if (vec == 4) {
    s += " splat=";
    for (size_t k = 0; k < strided.size(); ++k) s += strided[k] && k < splat.size() && splat[k] ? '1' : '0';
  }
  // The source's hash too: a kernel cached by an earlier version of this generator (or of
  // ew_math.h, or of ops.def's expressions, or built by another compiler or with other
  // options) is not this signature's kernel.
  const std::string src = ew_source(*this) + kEwMathSource + kPhiloxSource + compiler_tag(arch);
  return s + " source=" + hex(fnv1a(src.data(), src.size())) + " program=" + program;
}

namespace {

// The statements reading every input at index-space element e into i<k>.
std::string loads(const EwSignature& s) {
  std::string o;
  for (int k = 0; k < s.inputs(); ++k) {
    const std::string n = std::to_string(k);
    const std::string at = s.strided[static_cast<size_t>(k)] ? "seam_off(args, " + n + ", e)" : std::string("e");
    o += "    const T i" + n + " = " + load_expr(s.in_dtype(k), "args.in[" + n + "]", at) + ";\n";
  }
  return o;
}

// The statements reading every input as a float4 v<k> at index-space element `at` (a
// multiple of 4): full inputs at `at`, broadcast ones at their own offset, or one value
// for the four lanes where constant along the innermost dim; then the lanes i<k>_<x..w>.
// A 16-bit input's four values are one 8-byte load.
std::string vec_loads(const EwSignature& s, const std::string& at) {
  std::ostringstream o;
  for (int k = 0; k < s.inputs(); ++k) {
    const std::string n = std::to_string(k);
    const DType t = s.in_dtype(k);
    const std::string in = "args.in[" + n + "]";
    const std::string off = "seam_off(args, " + n + ", " + at + ")";
    const bool strided = s.strided[static_cast<size_t>(k)];
    if (strided && static_cast<size_t>(k) < s.splat.size() && s.splat[static_cast<size_t>(k)]) {
      o << "    const float s" << n << " = " << load_expr(t, in, off) << ";\n"
        << "    const float4 v" << n << " = make_float4(s" << n << ", s" << n << ", s" << n << ", s" << n << ");\n";
      continue;
    }
    const std::string ptr = "((const " + ctype(t) + "*)" + in + " + " + (strided ? off : at) + ")";
    if (t == DType::f32)
      o << "    const float4 v" << n << " = *reinterpret_cast<const float4*>" << ptr << ";\n";
    else
      o << "    const float4 v" << n << " = seam_unpack_" << half_name(t) << "(*reinterpret_cast<const uint2*>" << ptr
        << ");\n";
  }
  return o.str();
}

// Stores the float4 r<j> at element `at` (a multiple of 4) of output j.
std::string vec_store(const EwSignature& s, int j, const std::string& at) {
  const DType t = s.out_dtype(j);
  const std::string r = "r" + std::to_string(j);
  const std::string ptr = "((" + ctype(t) + "*)args.out[" + std::to_string(j) + "] + " + at + ")";
  if (t == DType::f32) return "    *reinterpret_cast<float4*>" + ptr + " = " + r + ";\n";
  return "    *reinterpret_cast<uint2*>" + ptr + " = seam_pack_" + half_name(t) + "(" + r + ");\n";
}

constexpr const char* kLanes[] = {"x", "y", "z", "w"};

// The kernel of a program ending in reductions (layout columns or rows): every element of
// the index space visited once, stored outputs written, reduced ones summed in double.
void reducing_kernel(std::ostringstream& o, const EwSignature& s, const EwProgram& p) {
  const bool cols = s.layout == EwLayout::columns;
  std::vector<int> red;  // the reduced outputs, in output order
  for (size_t j = 0; j < p.outputs.size(); ++j)
    if (p.reduce[j] != EwReduce::none) red.push_back(static_cast<int>(j));
  const int nred = static_cast<int>(red.size());
  o << "__device__ __forceinline__ I seam_dims(int n, const long long* size, const long long* st, I i) {\n"
       "  if (n == 1) return i * (I)st[0];\n"
       "  I off = 0;\n"
       "  for (int d = 0; d < n; ++d) {\n"
       "    const I q = i / (I)size[d];\n"
       "    off += (i - q * (I)size[d]) * (I)st[d];\n"
       "    i = q;\n"
       "  }\n"
       "  return off;\n}\n";
  // A block's sum v for reduced output j (the r-th) at kept element o: stored in j's
  // dtype, or a chunk's partial.
  auto put = [&](int r, const std::string& at, const std::string& v) {
    const int j = red[static_cast<size_t>(r)];
    return "  if (gridDim.y == 1) " +
           store_stmt(s.out_dtype(j), "args.out[" + std::to_string(j) + "]", at,
                      "(float)(" + v + " * args.scale[" + std::to_string(j) + "])") +
           "  else args.partial[((long long)blockIdx.y * " + std::to_string(nred) + " + " + std::to_string(r) +
           ") * args.kept + " + at + "] = " + v + ";\n";
  };
  // With vec 4 (columns only) each thread takes four neighbouring kept elements: float4
  // loads and stores, four sums per reduced output.
  const bool v4 = cols && s.vec == 4;
  const std::vector<std::string> lanes = v4 ? std::vector<std::string>{"_x", "_y", "_z", "_w"} : std::vector<std::string>{""};
  const int nl = static_cast<int>(lanes.size());
  o << "extern \"C\" __global__ void __launch_bounds__(256) seam_fused_ew(const EwArgs args) {\n";
  o << counters_stmt(p);
  if (cols) {
    o << "  __shared__ double seam_sh[" << nred * nl << "][8][33];\n";
    o << "  const I o = ((I)blockIdx.x * 32 + threadIdx.x) * " << nl << ";\n";
    o << "  const int step = 8, lane = threadIdx.y;\n";
  } else {
    o << "  const I o = (I)blockIdx.x * 8 + (threadIdx.x >> 5);\n";
    o << "  const int step = 32, lane = threadIdx.x & 31;\n";
  }
  o << "  const I j0 = (I)blockIdx.y * (I)args.chunk;\n";
  o << "  const I j1 = j0 + (I)args.chunk < (I)args.len ? j0 + (I)args.chunk : (I)args.len;\n";
  for (int r = 0; r < nred; ++r)
    for (auto& l : lanes) o << "  double acc" << r << l << " = 0;\n";
  o << "  if (o < (I)args.kept) {\n";
  o << "   const I base = seam_dims(args.kept_rank, args.kept_size, args.kept_st, o);\n";
  o << "#pragma unroll 4\n";
  o << "   for (I j = j0 + lane; j < j1; j += step) {\n";
  o << "    const I e = base + seam_dims(args.red_rank, args.red_size, args.red_st, j);\n";
  if (v4) {
    o << vec_loads(s, "e");
    for (size_t j = 0; j < p.outputs.size(); ++j)
      if (p.reduce[j] == EwReduce::none) o << "    float4 r" << j << ";\n";
    for (int l = 0; l < 4; ++l) {
      const std::string sfx = lanes[static_cast<size_t>(l)];
      o << "   {\n";
      for (int k = 0; k < s.inputs(); ++k) o << "    const T i" << k << sfx << " = v" << k << "." << kLanes[l] << ";\n";
      o << body(p, sfx, "e + " + std::to_string(l));
      for (size_t j = 0, r = 0; j < p.outputs.size(); ++j) {
        const std::string t = "t" + std::to_string(p.outputs[j]) + sfx;
        if (p.reduce[j] == EwReduce::none) o << "    r" << j << "." << kLanes[l] << " = " << t << ";\n";
        else o << "    acc" << r++ << sfx << " += (double)" << t << ";\n";
      }
      o << "   }\n";
    }
    for (size_t j = 0; j < p.outputs.size(); ++j)
      if (p.reduce[j] == EwReduce::none) o << vec_store(s, static_cast<int>(j), "e");
  } else {
    o << loads(s) << body(p, "", "e");
    for (size_t j = 0, r = 0; j < p.outputs.size(); ++j) {
      const std::string t = "t" + std::to_string(p.outputs[j]);
      if (p.reduce[j] == EwReduce::none)
        o << "    " << store_stmt(s.out_dtype(static_cast<int>(j)), "args.out[" + std::to_string(j) + "]", "e", t);
      else o << "    acc" << r++ << " += (double)" << t << ";\n";
    }
  }
  o << "   }\n  }\n";
  if (cols) {
    for (int r = 0; r < nred; ++r)
      for (int l = 0; l < nl; ++l)
        o << "  seam_sh[" << r * nl + l << "][threadIdx.y][threadIdx.x] = acc" << r << lanes[static_cast<size_t>(l)] << ";\n";
    o << "  __syncthreads();\n  if (threadIdx.y != 0 || o >= (I)args.kept) return;\n";
    for (int r = 0; r < nred; ++r)
      for (int l = 0; l < nl; ++l) {
        o << "  {\n    double v = 0;\n    for (int y = 0; y < 8; ++y) v += seam_sh[" << r * nl + l << "][y][threadIdx.x];\n";
        o << put(r, "(o + " + std::to_string(l) + ")", "v") << "  }\n";
      }
  } else {
    for (int r = 0; r < nred; ++r)
      o << "  for (int d = 16; d > 0; d >>= 1) acc" << r << " += __shfl_down_sync(0xffffffffu, acc" << r << ", d);\n";
    o << "  if (lane != 0 || o >= (I)args.kept) return;\n";
    for (int r = 0; r < nred; ++r) o << put(r, "o", "acc" + std::to_string(r));
  }
  o << "}\n";
}

// The kernel of a program ending in a layer norm: a warp per row, as layer_norm's kernel
// (src/backend/cuda/norm.cu) with the same formulas. The first pass computes the program
// along the row, stores its stored outputs and sums the value to normalize; then the
// centred sum of squares, and y. Rows of up to 1024 stay in registers between the passes
// (row_values a lane, unrolled); longer ones are written to an f32 y and read back by the
// lane that wrote them, or, with a 16-bit y (which would round the value), computed
// again in each pass from inputs the first pass brought into the caches. Gamma, beta and
// every output are read and written in their own dtypes; the statistics are float sums.
void norm_kernel(std::ostringstream& o, const EwSignature& s, const EwProgram& p) {
  size_t jy = 0;
  while (p.reduce[jy] != EwReduce::ln_y) ++jy;
  char eps[40];
  std::snprintf(eps, sizeof eps, "%.17g", p.ln_eps);
  const int n = s.row_values;
  const std::string ty = "t" + std::to_string(p.outputs[jy]);
  // The passes: "for each column c of the row this lane owns", with k its register slot.
  const std::string each = n > 0 ? "#pragma unroll\n   for (int k = 0; k < " + std::to_string(n) +
                                       "; ++k) {\n    const I c = seam_lane + 32 * k;\n    if (c >= seam_dim) break;\n"
                                 : "   for (I c = seam_lane; c < seam_dim; c += 32) {\n";
  const DType ydt = s.out_dtype(static_cast<int>(jy));
  const std::string y = "args.out[" + std::to_string(jy) + "]", at = "seam_r * seam_dim + c";
  const bool recompute = n == 0 && ydt != DType::f32;
  const std::string value = n > 0 ? "seam_v[k]" : recompute ? ty : load_expr(ydt, y, at);
  const std::string again = recompute ? "    const I e = " + at + ";\n" + loads(s) + body(p, "", "e") : std::string();
  o << "extern \"C\" __global__ void __launch_bounds__(256) seam_fused_ew(const EwArgs args) {\n";
  o << counters_stmt(p);
  o << "  const int seam_lane = threadIdx.x & 31;\n";
  o << "  const I seam_rows = (I)args.kept, seam_dim = (I)args.len;\n";
  o << "  for (I seam_r = (I)blockIdx.x * 8 + (threadIdx.x >> 5); seam_r < seam_rows; seam_r += (I)gridDim.x * 8) {\n";
  if (n > 0) o << "   float seam_v[" << n << "];\n";
  o << "   float seam_s = 0.f;\n";
  o << each << "    const I e = seam_r * seam_dim + c;\n";
  // A stored output that is the value to normalize itself (the residual sum, kept for
  // the backward) is written in the second pass, from registers: stores among the first
  // pass's loads would hold them back (the compiler cannot tell they do not alias).
  auto later = [&](size_t j) { return n > 0 && p.outputs[j] == p.outputs[jy]; };
  o << loads(s) << body(p, "", "e");
  for (size_t j = 0; j < p.outputs.size(); ++j)
    if (p.reduce[j] == EwReduce::none && !later(j))
      o << "    "
        << store_stmt(s.out_dtype(static_cast<int>(j)), "args.out[" + std::to_string(j) + "]", "e",
                      "t" + std::to_string(p.outputs[j]));
  if (n > 0) o << "    seam_v[k] = " << ty << ";\n";
  else if (!recompute) o << "    " << store_stmt(ydt, y, at, ty);
  o << "    seam_s += " << ty << ";\n   }\n";
  o << "   for (int d = 16; d > 0; d >>= 1) seam_s += __shfl_xor_sync(0xffffffffu, seam_s, d);\n";
  o << "   const float seam_mean = seam_s / (float)seam_dim;\n";
  o << "   float seam_sq = 0.f;\n";
  o << each << again << "    const float d = " << value << " - seam_mean;\n    seam_sq += d * d;\n";
  for (size_t j = 0; j < p.outputs.size(); ++j)
    if (p.reduce[j] == EwReduce::none && later(j))
      o << "    " << store_stmt(s.out_dtype(static_cast<int>(j)), "args.out[" + std::to_string(j) + "]", at, value);
  o << "   }\n";
  o << "   for (int d = 16; d > 0; d >>= 1) seam_sq += __shfl_xor_sync(0xffffffffu, seam_sq, d);\n";
  o << "   const float seam_rstd = (float)(1.0 / sqrt((double)(seam_sq / (float)seam_dim) + " << eps << "));\n";
  const std::string gamma = load_expr(s.in_dtype(p.ln_gamma), "args.in[" + std::to_string(p.ln_gamma) + "]", "c");
  const std::string beta = load_expr(s.in_dtype(p.ln_beta), "args.in[" + std::to_string(p.ln_beta) + "]", "c");
  o << each << again << "    "
    << store_stmt(ydt, y, at, "fmaf((" + value + " - seam_mean) * seam_rstd, " + gamma + ", " + beta + ")") << "   }\n";
  o << "   if (seam_lane == 0) {\n    "
    << store_stmt(s.out_dtype(static_cast<int>(jy + 1)), "args.out[" + std::to_string(jy + 1) + "]", "seam_r", "seam_mean")
    << "    "
    << store_stmt(s.out_dtype(static_cast<int>(jy + 2)), "args.out[" + std::to_string(jy + 2) + "]", "seam_r", "seam_rstd")
    << "   }\n  }\n}\n";
}

}  // namespace

std::string ew_source(const EwSignature& s) {
  const EwProgram& p = EwProgram::cached(s.program);
  const int inputs = s.inputs(), outputs = static_cast<int>(p.outputs.size());
  SEAM_ASSERT(inputs <= kEwMaxInputs && outputs <= kEwMaxOutputs && p.inputs <= inputs);
  SEAM_ASSERT(p.reduces() == (s.layout == EwLayout::columns || s.layout == EwLayout::rows));
  SEAM_ASSERT(p.normalizes() == (s.layout == EwLayout::norm));
  SEAM_ASSERT((s.in_dtypes.empty() || static_cast<int>(s.in_dtypes.size()) == inputs) &&
              (s.out_dtypes.empty() || static_cast<int>(s.out_dtypes.size()) == outputs));
  std::vector<DType> used = s.in_dtypes;  // what needs conversions
  used.insert(used.end(), s.out_dtypes.begin(), s.out_dtypes.end());
  for (const EwInstr& in : p.code)
    if (in.op == Op::cast) used.push_back(in.dtype);
  std::ostringstream o;
  o << "// fused_elementwise: " << s.program << "\n";
  o << "#include \"ew_math.h\"\nusing namespace seam_ew;\ntypedef float T;\n";
  if (p.draws()) o << "typedef unsigned int uint32_t;\ntypedef unsigned long long uint64_t;\n#include \"philox.h\"\n";
  o << half_helpers(used, s.arch);
  o << "struct EwArgs {\n  const void* in[" << kEwMaxInputs << "];\n  void* out[" << kEwMaxOutputs
    << "];\n  long long n, nvec;\n  int rank;\n  long long size[" << kEwMaxDims << "];\n  long long st["
    << kEwMaxInputs << "][" << kEwMaxDims << "];\n  int kept_rank, red_rank;\n  long long kept_size[" << kEwMaxDims
    << "], kept_st[" << kEwMaxDims << "], red_size[" << kEwMaxDims << "], red_st[" << kEwMaxDims
    << "];\n  long long kept, len, chunk;\n  double* partial;\n  double scale[" << kEwMaxOutputs
    << "];\n  const void* counters;\n};\n";
  // Index arithmetic in I: 32-bit divisions cost a fraction of 64-bit ones.
  o << (s.idx32 ? "typedef unsigned int I;\n" : "typedef long long I;\n");
  o << "__device__ __forceinline__ I seam_off(const EwArgs& g, int k, I e) {\n"
       "  I off = 0;\n"
       "  for (int d = 0; d < g.rank; ++d) {\n"
       "    const I q = e / (I)g.size[d];\n"
       "    off += (e - q * (I)g.size[d]) * (I)g.st[k][d];\n"
       "    e = q;\n"
       "  }\n"
       "  return off;\n}\n";
  if (s.layout == EwLayout::norm) {
    norm_kernel(o, s, p);
    return o.str();
  }
  if (s.layout != EwLayout::elementwise) {
    reducing_kernel(o, s, p);
    return o.str();
  }
  o << "extern \"C\" __global__ void __launch_bounds__(256) seam_fused_ew(const EwArgs args) {\n";
  o << counters_stmt(p);
  o << "  const I stride = (I)gridDim.x * blockDim.x;\n";
  o << "  const I first = (I)blockIdx.x * blockDim.x + threadIdx.x;\n";
  if (s.vec == 4) {
    o << "  for (I v = first; v < (I)args.nvec; v += stride) {\n";
    o << vec_loads(s, "v * 4");
    for (int j = 0; j < outputs; ++j) o << "    float4 r" << j << ";\n";
    for (int lane = 0; lane < 4; ++lane) {
      const std::string l = std::string("_") + kLanes[lane];
      o << "  {\n";
      for (int k = 0; k < inputs; ++k) o << "    const T i" << k << l << " = v" << k << "." << kLanes[lane] << ";\n";
      o << body(p, l, "v * 4 + " + std::to_string(lane));
      for (int j = 0; j < outputs; ++j)
        o << "    r" << j << "." << kLanes[lane] << " = t" << p.outputs[static_cast<size_t>(j)] << l << ";\n";
      o << "  }\n";
    }
    for (int j = 0; j < outputs; ++j) o << vec_store(s, j, "v * 4");
    o << "  }\n";
  }
  o << "  for (I e = (I)args.nvec * 4 + first; e < (I)args.n; e += stride) {\n";
  o << loads(s) << body(p, "", "e");
  for (int j = 0; j < outputs; ++j)
    o << "    " << store_stmt(s.out_dtype(j), "args.out[" + std::to_string(j) + "]", "e",
                              "t" + std::to_string(p.outputs[static_cast<size_t>(j)]));
  o << "  }\n}\n";
  return o.str();
}

GeneratedKernel compile_ew(const EwSignature& s) {
  const std::string src = ew_source(s);
  const auto t0 = std::chrono::steady_clock::now();
  nvrtcProgram prog = nullptr;
  const char* headers[] = {kEwMathSource, kPhiloxSource};
  const char* header_names[] = {"ew_math.h", "philox.h"};
  SEAM_NVRTC_CHECK(nvrtcCreateProgram(&prog, src.c_str(), "seam_ew.cu", 2, headers, header_names));
  struct Destroy {
    nvrtcProgram& p;
    ~Destroy() { nvrtcDestroyProgram(&p); }
  } destroy{prog};
  const std::vector<const char*> opts = compile_options(s.arch);
  const nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());
  size_t log_size = 0;
  SEAM_NVRTC_CHECK(nvrtcGetProgramLogSize(prog, &log_size));
  std::string log(log_size, '\0');
  if (log_size) SEAM_NVRTC_CHECK(nvrtcGetProgramLog(prog, log.data()));
  if (r != NVRTC_SUCCESS)
    fail("NVRTC could not compile the fused kernel for '", s.program, "': ", nvrtcGetErrorString(r), "\n", log,
         "\nsource:\n", src);
  GeneratedKernel k;
  k.key = s.key();
  size_t size = 0;
  SEAM_NVRTC_CHECK(nvrtcGetCUBINSize(prog, &size));
  k.cubin.resize(size);
  SEAM_NVRTC_CHECK(nvrtcGetCUBIN(prog, k.cubin.data()));
  // "ptxas info : Used 24 registers, ..." and "... 0 bytes spill stores, 0 bytes spill loads"
  // (the largest, should the report name more than one function).
  k.registers = k.spill_bytes = -1;
  for (size_t at = log.find("Used "); at != std::string::npos; at = log.find("Used ", at + 1)) {
    char* end = nullptr;
    const long r = std::strtol(log.c_str() + at + 5, &end, 10);
    if (end != log.c_str() + at + 5 && std::strncmp(end, " registers", 10) == 0)
      k.registers = std::max(k.registers, static_cast<int>(r));
  }
  // "... used 1 barriers, 2112 bytes smem, ..." (absent when the kernel has none)
  auto before = [&](const char* what, int& to) {
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) {
      size_t start = log.rfind(',', at);
      start = start == std::string::npos ? 0 : start + 1;
      to = std::max(to, std::atoi(log.c_str() + start));
    }
  };
  before("bytes spill stores", k.spill_bytes);
  k.shared_bytes = 0;
  before("bytes smem", k.shared_bytes);
  k.log = log;
  k.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  counters().compiled += 1;
  return k;
}

std::string EwSignature::hash() const {
  const std::string k = key();
  return hex(fnv1a(k.data(), k.size()));
}

std::string kernel_cache_file(const EwSignature& s) {
  const std::string dir = cache_dir();
  if (dir.empty()) return {};
  return dir + "/ew-" + s.hash() + ".cubin";
}

namespace {
std::mutex table_mu;
// Never destroyed: executables may be destroyed during static destruction.
auto* const table = new std::map<std::string, std::shared_ptr<GeneratedKernel>>;
}  // namespace

void forget_loaded_kernels() {
  std::lock_guard<std::mutex> lock(table_mu);
  table->clear();
}

std::shared_ptr<const GeneratedKernel> ew_kernel(const EwSignature& s) {
  const std::string key = s.key();
  std::lock_guard<std::mutex> lock(table_mu);
  if (auto it = table->find(key); it != table->end()) {
    counters().memory_hits += 1;
    return it->second;
  }
  const std::string path = kernel_cache_file(s);
  // The budget check reads the loaded function's own figures, whatever the compiler's log
  // (or a cache file written from it) said: a log without ptxas's lines would otherwise
  // leave them unknown.
  auto load = [](GeneratedKernel& k) {
    cudaLibrary_t lib = nullptr;
    cudaError_t e = cudaLibraryLoadData(&lib, k.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (e == cudaSuccess) e = cudaLibraryGetKernel(&k.kernel, lib, "seam_fused_ew");  // lives as long as the process
    cudaFuncAttributes attr{};
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(k.kernel));
    if (e != cudaSuccess) return e;
    k.registers = attr.numRegs;
    k.spill_bytes = static_cast<int>(attr.localSizeBytes);
    k.shared_bytes = static_cast<int>(attr.sharedSizeBytes);
    return cudaSuccess;
  };
  std::optional<GeneratedKernel> k = path.empty() ? std::nullopt : read_cached(path, key);
  if (k && load(*k) != cudaSuccess) {  // a cubin the driver refuses is not trusted either
    (void)cudaGetLastError();
    counters().rejected_files += 1;
    k.reset();
  }
  if (k) {
    counters().disk_hits += 1;
  } else {
    k = compile_ew(s);
    SEAM_CUDA_CHECK(load(*k));
    if (!path.empty()) write_cached(path, *k);
  }
  auto made = std::make_shared<GeneratedKernel>(std::move(*k));
  table->emplace(key, made);
  return made;
}

int resident_threads(int registers, int shared_bytes) {
  if (registers <= 0 || shared_bytes < 0) return 0;  // unknown figures never fit
  // Registers go to warps in units of 256 (8 per thread); blocks are whole.
  const int per_warp = ((registers * 32 + 255) / 256) * 256;
  const int by_regs = (65536 / per_warp) / 8;  // 8 warps a block
  const int by_smem = shared_bytes > 0 ? (228 * 1024) / (shared_bytes + 1024) : 8;  // + the 1 KB each block reserves
  return std::min({8, by_regs, by_smem}) * 256;
}

GeneratedKernel ew_kernel_info(const EwSignature& s) {
  // With a GPU, the loaded kernel (from this process's table, the disk or a compile);
  // without one nothing is ever loaded, so there is no table to look in first.
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return *ew_kernel(s);
  (void)cudaGetLastError();
  const std::string key = s.key();
  const std::string path = kernel_cache_file(s);
  if (std::optional<GeneratedKernel> k = path.empty() ? std::nullopt : read_cached(path, key)) {
    counters().disk_hits += 1;
    return *k;
  }
  GeneratedKernel k = compile_ew(s);
  if (!path.empty()) write_cached(path, k);
  return k;
}

KernelCacheStats kernel_cache_stats() {
  Counters& c = counters();
  return {c.compiled.load(), c.memory_hits.load(), c.disk_hits.load(), c.rejected_files.load(), c.files_written.load()};
}

}  // namespace seam::cuda
