// The classic convolution API's algorithm cache (conv_cache.h).
#include "backend/cuda/conv_cache.h"

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/cudnn_util.h"
#include "common/file.h"

namespace seam::cuda {

namespace {

// ---------------------------------------------------------------------------------------
// Parsing one cache line, strictly

template <class T>
bool parse_num(std::string_view s, T& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

// "name=v1,v2,..." with exactly n integers.
bool parse_list(std::string_view tok, std::string_view name, int64_t* out, int n) {
  if (tok.size() <= name.size() + 1 || tok.substr(0, name.size()) != name || tok[name.size()] != '=') return false;
  std::string_view rest = tok.substr(name.size() + 1);
  for (int i = 0; i < n; ++i) {
    size_t comma = rest.find(',');
    if ((i + 1 < n) != (comma != std::string_view::npos)) return false;
    if (!parse_num(rest.substr(0, comma), out[i])) return false;
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return rest.empty();
}

bool parse_word(std::string_view tok, std::string_view name, std::string_view& out) {
  if (tok.size() <= name.size() + 1 || tok.substr(0, name.size()) != name || tok[name.size()] != '=') return false;
  out = tok.substr(name.size() + 1);
  return true;
}

std::optional<std::pair<std::string, ConvChoice>> parse_line(const std::string& line) {
  std::vector<std::string_view> tok;
  std::string_view rest(line);
  while (!rest.empty()) {
    size_t sp = rest.find(' ');
    std::string_view t = rest.substr(0, sp);
    if (t.empty()) return std::nullopt;  // canonical lines have single spaces, no padding
    tok.push_back(t);
    rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
    if (sp != std::string_view::npos && rest.empty()) return std::nullopt;
  }
  // 14 tokens; 13 for a line written before the layout token (see the top of the file).
  if (tok.size() != 13 && tok.size() != 14) return std::nullopt;
  const bool has_layout = tok.size() == 14;
  ConvKey k;
  int p = -1;
  for (int i = 0; i < 3; ++i)
    if (tok[0] == kPassName[i]) p = i;
  if (p < 0) return std::nullopt;
  k.pass = static_cast<Pass>(p);
  std::string_view dtype, math;
  if (!parse_list(tok[1], "x", k.x, 4) || !parse_list(tok[2], "w", k.w, 4) || !parse_list(tok[3], "y", k.y, 4) ||
      !parse_list(tok[4], "stride", k.stride, 2) || !parse_list(tok[5], "pad", k.pad, 2) ||
      !parse_list(tok[6], "dil", k.dil, 2) || !parse_list(tok[7], "groups", &k.groups, 1) ||
      !parse_word(tok[8], "dtype", dtype) || !parse_word(tok[9], "math", math))
    return std::nullopt;
  k.dtype = std::string(dtype);
  int m = -1;
  for (int i = 0; i < 3; ++i)
    if (math == kMathName[i]) m = i;
  if (m < 0) return std::nullopt;
  k.math = static_cast<Math>(m);
  size_t t = 10;  // the first token after the key
  if (has_layout) {
    std::string_view layout;
    if (!parse_word(tok[10], "layout", layout) || (layout != "nchw" && layout != "nhwc")) return std::nullopt;
    k.nhwc = layout == "nhwc";
    t = 11;
  }
  if (!k.valid()) return std::nullopt;
  int64_t algo = -1, algo_math = -1;
  uint64_t ws = 0;
  std::string_view ws_text;
  if (!parse_list(tok[t], "algo", &algo, 1) || !parse_list(tok[t + 1], "algo_math", &algo_math, 1) ||
      !parse_word(tok[t + 2], "ws", ws_text) || !parse_num(ws_text, ws))
    return std::nullopt;
  if (algo < 0 || algo >= algo_count(k.pass) || !valid_math(algo_math)) return std::nullopt;
  if (k.math == Math::fma && algo_math != CUDNN_FMA_MATH) return std::nullopt;  // never TF32 where it was not allowed
  // The key must be written exactly as this build writes it (no leading zeros, '+' signs);
  // an old line as builds before the layout token wrote it. Either is kept under the key
  // with the token, which is how it is saved again.
  const std::string want_prefix = k.str(has_layout) + " ";
  if (line.compare(0, want_prefix.size(), want_prefix) != 0) return std::nullopt;
  return std::make_pair(k.str(),
                        ConvChoice{static_cast<int>(algo), static_cast<cudnnMathType_t>(algo_math), static_cast<size_t>(ws)});
}

std::string format_line(const std::string& key, const ConvChoice& c) {
  return key + " algo=" + std::to_string(c.algo) + " algo_math=" + std::to_string(static_cast<int>(c.math)) +
         " ws=" + std::to_string(c.workspace);
}

// ---------------------------------------------------------------------------------------
// The process-wide cache, one store per GPU name and cuDNN version

std::filesystem::path cache_dir() { return cache_root(); }

class ConvAlgoCache {
 public:
  static ConvAlgoCache& instance() {
    static ConvAlgoCache c;
    return c;
  }

  std::optional<ConvChoice> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    Store& s = store();
    auto it = s.entries.find(key);
    if (it == s.entries.end()) return std::nullopt;
    return it->second;
  }

  void remember(const std::string& key, const ConvChoice& c) {
    std::lock_guard<std::mutex> lock(mu_);
    Store& s = store();
    s.entries[key] = c;
    save(s);
  }

 private:
  struct Store {
    std::string header;
    std::filesystem::path path;  // empty: memory only
    std::map<std::string, ConvChoice> entries;
  };

  // The store of the current device under the cache folder the environment names now
  // (as the GEMM and kernel caches, so that a process can point it elsewhere); read from
  // disk on first use.
  Store& store() {
    int dev = 0;
    SEAM_CUDA_CHECK(cudaGetDevice(&dev));
    auto named = gpu_names_.find(dev);
    if (named == gpu_names_.end()) {
      cudaDeviceProp prop{};
      SEAM_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
      named = gpu_names_.emplace(dev, cache_name_part(prop.name)).first;
    }
    const std::string& gpu = named->second;
    const std::string ver = std::to_string(cudnnGetVersion());
    const std::filesystem::path dir = cache_dir();
    const std::filesystem::path path = dir.empty() ? dir : dir / ("conv-" + gpu + "-cudnn" + ver + ".txt");
    const std::string id = std::to_string(dev) + " " + path.string();
    auto it = stores_.find(id);
    if (it != stores_.end()) return it->second;
    Store s;
    s.header = "# seam cudnn conv algorithms v1 gpu=" + gpu + " cudnn=" + ver;
    s.path = path;
    load(s, s.entries);
    return stores_.emplace(id, std::move(s)).first->second;
  }

  // Adds the valid entries of the file to `into` (those already there win). A missing
  // file, a wrong header or a bad line costs only re-measuring.
  static void load(const Store& s, std::map<std::string, ConvChoice>& into) {
    if (s.path.empty()) return;
    std::ifstream in(s.path);
    if (!in) return;
    std::string line;
    if (!std::getline(in, line) || line != s.header) return;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      if (auto e = parse_line(line)) into.emplace(std::move(e->first), e->second);
    }
  }

  // Writes every entry (ours, plus any another process saved meanwhile) atomically, so
  // readers and other writers never see half a file.
  void save(Store& s) {
    if (s.path.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(s.path.parent_path(), ec);
    if (ec) return warn(s, "cannot create " + s.path.parent_path().string() + ": " + ec.message());
    load(s, s.entries);
    std::string text = s.header + '\n';
    for (auto& [key, c] : s.entries) text += format_line(key, c) + '\n';
    try {
      write_file_atomically(s.path.string(), std::as_bytes(std::span(text)));
    } catch (const Error& e) {
      warn(s, e.what());
    }
  }

  void warn(const Store&, const std::string& what) {
    if (warned_) return;
    warned_ = true;
    std::fprintf(stderr, "seam: the cuDNN convolution algorithm cache is not saved (%s)\n", what.c_str());
  }

  std::mutex mu_;
  std::map<std::string, Store> stores_;  // by device and file
  std::map<int, std::string> gpu_names_;
  bool warned_ = false;
};

}  // namespace

std::optional<ConvChoice> cached_conv_choice(const std::string& key) { return ConvAlgoCache::instance().find(key); }

void remember_conv_choice(const std::string& key, const ConvChoice& c) { ConvAlgoCache::instance().remember(key, c); }

}  // namespace seam::cuda
