// The GEMM cache's records and their file (src/backend/cuda/gemm_store.h).
#include "backend/cuda/gemm_store.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/gemm.h"
#include "common/file.h"

namespace seam::cuda {

Counters& counters() {
  static Counters c;
  return c;
}

namespace {

std::string sanitize(const std::string& s) {
  std::string r;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
    r += ok ? c : '_';
  }
  return r.empty() ? "gpu" : r;
}

std::string cache_dir() { return cache_root(); }


template <class T>
bool parse_int(std::string_view s, T& out, int base = 10) {
  if (s.empty()) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), out, base);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// "name=value" with an integer value.
template <class T>
bool parse_field(std::string_view tok, const char* name, T& out) {
  const size_t n = std::char_traits<char>::length(name);
  if (tok.size() <= n + 1 || tok.compare(0, n, name) != 0 || tok[n] != '=') return false;
  return parse_int(tok.substr(n + 1), out);
}

std::vector<std::string_view> split_spaces(std::string_view line) {
  std::vector<std::string_view> t;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    if (j > i) t.push_back(line.substr(i, j - i));
    i = j;
  }
  return t;
}

// One line of the file: the key fields, algo=<8 words>, ws=, ns=. Anything else: false.
bool parse_line(std::string_view line, std::string& key, Entry& e) {
  auto t = split_spaces(line);
  if (t.size() != 1 + kKeyFields + 3 || t[0] != "gemm") return false;
  KeyValues v{};
  for (size_t i = 0; i < kKeyFields; ++i)
    if (!parse_field(t[1 + i], kKeyNames[i], v[i])) return false;
  std::string_view algo = t[1 + kKeyFields];
  if (algo.size() != 5 + 8 * 16 + 7 || algo.substr(0, 5) != "algo=") return false;
  for (size_t w = 0; w < 8; ++w) {
    std::string_view word = algo.substr(5 + w * 17, 16);
    for (char c : word)
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    if (!parse_int(word, e.algo.data[w], 16)) return false;
    if (w < 7 && algo[5 + w * 17 + 16] != ':') return false;
  }
  if (!parse_field(t[2 + kKeyFields], "ws", e.workspace)) return false;
  if (!parse_field(t[3 + kKeyFields], "ns", e.ns) || e.ns < 0) return false;
  if (e.workspace > kGemmWorkspaceBytes) return false;
  key = key_text(v);
  e.checked = false;
  return true;
}

// "pick <key> use=<variant> ns=<time>". Anything else: false.
bool parse_pick(std::string_view line, std::string& key, Pick& p) {
  auto t = split_spaces(line);
  if (t.size() != 4 || t[0] != "pick" || !is_word(t[1])) return false;
  if (t[2].size() < 5 || t[2].substr(0, 4) != "use=" || !is_word(t[2].substr(4))) return false;
  if (!parse_field(t[3], "ns", p.ns) || p.ns < 0) return false;
  key = std::string(t[1]);
  p.use = std::string(t[2].substr(4));
  return true;
}

std::string format_line(const std::string& key, const Entry& e) {
  std::string s = "gemm " + key + " algo=";
  char buf[24];
  for (size_t w = 0; w < 8; ++w) {
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(e.algo.data[w]));
    if (w) s += ':';
    s += buf;
  }
  s += " ws=" + std::to_string(e.workspace) + " ns=" + std::to_string(e.ns);
  return s;
}

// Reads the valid lines of a cache file; counts the lines it drops. A missing file is
// no error; a file with another header is dropped whole.
Tables read_file(const std::string& path, const std::string& header) {
  Tables out;
  if (path.empty()) return out;
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  if (ec) return out;
  constexpr uintmax_t kMaxFile = uintmax_t{16} << 20;
  std::ifstream in(path, std::ios::binary);
  if (!in) return out;
  int64_t dropped = 0;
  if (size > kMaxFile) {
    counters().malformed_lines += 1;
    return out;
  }
  std::string line;
  bool first = true, header_ok = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (first) {
      first = false;
      header_ok = line == header;
      if (!header_ok) ++dropped;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::string key;
    Entry e;
    Pick pk;
    if (header_ok && line.size() <= 4096 && parse_line(line, key, e)) {
      out.entries.emplace(key, e);  // the first line for a key wins
    } else if (header_ok && line.size() <= 4096 && parse_pick(line, key, pk)) {
      out.picks.emplace(key, pk);
    } else {
      ++dropped;
    }
  }
  counters().malformed_lines += dropped;
  return out;
}

}  // namespace

DeviceId current_device() {
  int dev = 0;
  SEAM_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  SEAM_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return {p.name, p.major, p.minor, p.multiProcessorCount};
}

std::string file_path(const DeviceId& d) {
  std::string dir = cache_dir();
  if (dir.empty()) return {};
  return dir + "/gemm-" + sanitize(d.name) + "-sm" + std::to_string(d.major) + std::to_string(d.minor) + "-" +
         std::to_string(d.sms) + "sm-lt" + std::to_string(cublasLtGetVersion()) + ".txt";
}

std::string header_line(const DeviceId& d) {
  return "# seam gemm algorithm cache v2; gpu " + d.name + "; sm_" + std::to_string(d.major) +
         std::to_string(d.minor) + " x" + std::to_string(d.sms) + "; cuBLASLt " +
         std::to_string(cublasLtGetVersion());
}

// A variant name or pick key: one word of letters, digits and _ , = . : -
bool is_word(std::string_view w) {
  if (w.empty() || w.size() > 512) return false;
  for (char c : w)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == ',' ||
          c == '=' || c == '.' || c == ':' || c == '-'))
      return false;
  return true;
}

// Writes the table (merged with entries the file gained meanwhile) atomically: readers
// and other writers never see half a file. Errors leave the old file (a cache that cannot
// be written is only a slower next start).
void save(Store& s) {
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.dirty || s.path.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(s.path).parent_path(), ec);
  if (ec) return;
  Tables file = read_file(s.path, s.header);
  for (auto& [key, e] : file.entries) s.entries.emplace(key, e);  // keeps ours
  for (auto& [key, p] : file.picks) s.picks.emplace(key, p);
  std::ostringstream out;
  out << s.header << '\n';
  out << "# gemm <key fields> algo=<cublasLtMatmulAlgo_t, 8 words in hex> ws=<workspace bytes> ns=<time>\n";
  for (auto& [key, e] : s.entries) out << format_line(key, e) << '\n';
  out << "# pick <step key> use=<fastest variant> ns=<its time>\n";
  for (auto& [key, p] : s.picks) out << "pick " << key << " use=" << p.use << " ns=" << p.ns << '\n';
  const std::string text = out.str();
  try {
    write_file_atomically(s.path, std::as_bytes(std::span(text)));
  } catch (const Error&) {
    return;
  }
  s.dirty = false;
  counters().files_written += 1;
}

// One table per cache file for the whole process (never destroyed: GemmCaches may be
// destroyed during static destruction).
std::shared_ptr<Store> store_for(const std::string& path, const std::string& header) {
  static std::mutex* mu = new std::mutex;
  static auto* stores = new std::map<std::string, std::shared_ptr<Store>>;
  std::lock_guard<std::mutex> lock(*mu);
  const std::string id = path.empty() ? "memory:" + header : path;
  auto it = stores->find(id);
  if (it != stores->end()) return it->second;
  auto s = std::make_shared<Store>();
  s->path = path;
  s->header = header;
  static_cast<Tables&>(*s) = read_file(path, header);
  stores->emplace(id, s);
  return s;
}

}  // namespace seam::cuda
