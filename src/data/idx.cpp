// IDX reading and writing through zlib (gzopen reads plain files transparently too).
#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>

#include "seam/dtype.h"
#include "seam/error.h"

namespace seam::data {

namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads exactly n bytes; returns how many were available.
size_t read_some(gzFile f, uint8_t* dst, size_t n, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
    int r = gzread(f, dst + got, chunk);
    if (r < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      fail(path, ": corrupt compressed data (", msg ? msg : "zlib error", ")");
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

}  // namespace

IdxArray read_idx(const std::string& path, int rank) {
  if (!std::filesystem::exists(path)) fail(path, ": no such file");
  GzFile f(gzopen(path.c_str(), "rb"));
  if (!f) fail(path, ": cannot open");
  gzbuffer(f.get(), 1 << 20);
  uint8_t head[4];
  if (read_some(f.get(), head, 4, path) != 4) fail(path, ": truncated: no IDX header");
  if (head[0] != 0 || head[1] != 0) fail(path, ": not an IDX file (bad magic number)");
  if (head[2] != 0x08) fail(path, ": IDX element type 0x", std::hex, int{head[2]}, " is not unsigned byte (0x08)");
  if (head[3] != rank) fail(path, ": IDX has ", int{head[3]}, " dimensions, expected ", rank);
  IdxArray a;
  for (int d = 0; d < rank; ++d) {
    uint8_t b[4];
    if (read_some(f.get(), b, 4, path) != 4) fail(path, ": truncated: header ends in dimension ", d);
    int64_t dim = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3];
    if (dim <= 0 || dim > (1 << 28)) fail(path, ": implausible dimension ", dim);
    a.dims.push_back(dim);
  }
  const std::optional<int64_t> count = checked_numel(a.dims);
  if (!count) fail(path, ": IDX dimensions ", shape_str(a.dims), " multiply past 64 bits");
  const auto total = static_cast<uint64_t>(*count);
  if (total > (uint64_t{1} << 34)) fail(path, ": implausible size: IDX dimensions ", shape_str(a.dims), " make ", total, " bytes");
  // The header is only a promise, so a corrupt one must not make the reader allocate
  // more than the file holds: a plain file is measured first; a gzip stream's size is
  // known only by inflating it, so its buffer grows as the data arrives.
  if (gzdirect(f.get())) {
    const uint64_t header = 4 + 4 * static_cast<uint64_t>(rank);
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) fail(path, ": cannot get the file size: ", ec.message());
    const uint64_t holds = size > header ? size - header : 0;
    if (holds < total) fail(path, ": truncated: the header promises ", total, " bytes of data, the file holds ", holds);
    a.bytes.reserve(total);
  }
  while (a.bytes.size() < total) {
    // Each read asks for at most as much as has arrived so far: allocation stays within
    // twice the data read, and the vector's growth keeps the copying linear.
    const size_t at = a.bytes.size(), want = std::min<uint64_t>(total - at, std::max<uint64_t>(at, 1 << 16));
    a.bytes.resize(at + want);
    const size_t got = read_some(f.get(), a.bytes.data() + at, want, path);
    if (got != want)
      fail(path, ": truncated: the header promises ", total, " bytes of data, the file holds ", at + got);
  }
  uint8_t extra;
  if (read_some(f.get(), &extra, 1, path) != 0) fail(path, ": unexpected data after the ", total, " bytes the header promises");
  return a;
}

void write_idx_gz(const std::string& path, const std::vector<int64_t>& dims, const std::vector<uint8_t>& bytes) {
  GzFile f(gzopen(path.c_str(), "wb"));
  if (!f) fail(path, ": cannot create");
  std::vector<uint8_t> head{0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (int64_t d : dims)
    for (int s = 24; s >= 0; s -= 8) head.push_back(static_cast<uint8_t>(d >> s));
  if (gzwrite(f.get(), head.data(), static_cast<unsigned>(head.size())) != static_cast<int>(head.size()) ||
      (!bytes.empty() && gzwrite(f.get(), bytes.data(), static_cast<unsigned>(bytes.size())) != static_cast<int>(bytes.size())))
    fail(path, ": write failed");
}

}  // namespace seam::data
