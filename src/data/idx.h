// IDX files (the MNIST family's format), optionally gzip-compressed, read with zlib and
// validated: magic number, element type, dimensions, and the exact payload size.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace seam::data {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> bytes;  // unsigned bytes, row-major
};

// Reads an IDX file of unsigned bytes (type code 0x08) with `rank` dimensions. Throws
// seam::Error naming the file and what is wrong: missing, not gzip/IDX, wrong magic,
// truncated, trailing data.
IdxArray read_idx(const std::string& path, int rank);

// Writes an IDX file of unsigned bytes, gzip-compressed (used by tests and tools).
void write_idx_gz(const std::string& path, const std::vector<int64_t>& dims, const std::vector<uint8_t>& bytes);

}  // namespace seam::data
