// The safetensors format: 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, string metadata under "__metadata__", then the
// raw data. Files are written to a temporary name and renamed, so a crash or a full disk
// never leaves a half-written file under the real name.
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "seam/model.h"

namespace seam::io {

using NamedTensor = HostTensor;

struct TensorFile {
  std::map<std::string, std::string> metadata;
  std::vector<NamedTensor> tensors;
  const NamedTensor* find(const std::string& name) const;
};

void write_safetensors(const std::string& path, const TensorFile& file);
// Validates the whole file (header JSON, dtypes, shapes, byte ranges that tile the data
// exactly) before returning; throws seam::Error naming the file and the problem.
TensorFile read_safetensors(const std::string& path);

}  // namespace seam::io
