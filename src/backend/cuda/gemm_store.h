// The GEMM cache's records and their file (src/backend/cuda/gemm.h): the algorithm found
// for each GEMM key and the variant picked for each step key, kept in memory for the
// process and on disk per GPU and cuBLASLt version, with the statistics that
// gemm_cache_stats reports. Internal to the CUDA backend.
#pragma once
#include <cublasLt.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace seam::cuda {

// The key: every property of a GEMM that the choice of algorithm may depend on, as
// name=value fields in a fixed order. The same text is the in-memory key and the line
// prefix on disk. type and dtype: the cudaDataType_t of A/B and of C/D (a bias or gelu aux
// has D's type, see gemm.h).

constexpr std::array<const char*, 24> kKeyNames = {
    "ta",   "tb",    "m",       "n",   "k",     "lda",  "ldb", "ldc", "batch", "sa",    "sb",  "sc",
    "type", "dtype", "compute", "epi", "auxld", "bias", "aa",  "ab",  "ad",    "abias", "aaux", "beta"};
constexpr size_t kKeyFields = kKeyNames.size();
using KeyValues = std::array<int64_t, kKeyFields>;

inline std::string key_text(const KeyValues& v) {
  std::string s;
  for (size_t i = 0; i < kKeyFields; ++i) {
    if (i) s += ' ';
    s += kKeyNames[i];
    s += '=';
    s += std::to_string(v[i]);
  }
  return s;
}

struct Counters {
  std::atomic<int64_t> tuned{0}, memory_hits{0}, disk_hits{0}, rejected{0}, malformed_lines{0}, files_written{0},
      variants_timed{0}, variant_hits{0};
};
Counters& counters();

// Cache entries and the process-wide tables, one per cache file.

struct Entry {
  cublasLtMatmulAlgo_t algo{};
  uint64_t workspace = 0;  // bytes the algorithm needs
  int64_t ns = 0;          // measured time of one run (informational)
  bool checked = false;    // chosen or verified in this process (false: as read from disk)
};

// Which of a step's equivalent variants was fastest (choose_variant).
struct Pick {
  std::string use;  // the variant's name
  int64_t ns = 0;   // its measured time (informational)
};

struct Tables {
  std::map<std::string, Entry> entries;
  std::map<std::string, Pick> picks;
};

struct Store : Tables {
  std::mutex mu;
  std::string path;    // empty: memory only
  std::string header;  // first line of the file
  bool dirty = false;  // learned something the file does not hold
};

struct DeviceId {
  std::string name;
  int major = 0, minor = 0, sms = 0;
};

// This process's GPU, and the cache file and header line for it.
DeviceId current_device();
std::string file_path(const DeviceId& d);
std::string header_line(const DeviceId& d);
// One word: letters, digits and _-.:=/ (a pick's key and variant name).
bool is_word(std::string_view w);
// Writes a store's new records to its file (merged with what the file gained meanwhile).
void save(Store& s);
// The process-wide store of one cache file, read from it the first time.
std::shared_ptr<Store> store_for(const std::string& path, const std::string& header);

}  // namespace seam::cuda
