// safetensors reading and writing.
#include "io/safetensors.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "common/file.h"
#include "seam/error.h"

namespace seam::io {

namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
  }
  return "?";
}

std::optional<DType> parse_st_dtype(const std::string& s) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::u8})
    if (s == st_dtype(t)) return t;
  return std::nullopt;
}

}  // namespace

const NamedTensor* TensorFile::find(const std::string& name) const {
  for (auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void write_safetensors(const std::string& path, const TensorFile& file) {
  nlohmann::ordered_json header;
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  size_t offset = 0;
  for (auto& t : file.tensors) {
    if (t.data.size() != t.type.bytes()) fail("tensor '", t.name, "' has ", t.data.size(), " bytes for ", t.type.str());
    header[t.name] = {{"dtype", st_dtype(t.type.dtype)}, {"shape", t.type.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the format recommends
  write_file_atomically(path, [&](const WriteBytes& put) {
    const uint64_t n = h.size();
    std::byte len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<std::byte>(n >> (8 * i));
    put(len);
    put(std::as_bytes(std::span(h)));
    for (auto& t : file.tensors) put(t.data);
  });
}

TensorFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (size < 8) fail(path, ": truncated: not a safetensors file");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (n > size - 8 || n > (uint64_t{100} << 20)) fail(path, ": truncated or corrupt: header length ", n, " exceeds the file");
  std::string h(n, '\0');
  in.read(h.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": corrupt header: ", e.what());
  }
  if (!header.is_object()) fail(path, ": corrupt header: not a JSON object");
  const uint64_t data_size = size - 8 - n;
  TensorFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, ": __metadata__ is not an object");
      for (auto& [k, s] : v.items()) {
        if (!s.is_string()) fail(path, ": metadata '", k, "' is not a string");
        file.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    auto bad = [&, tensor = name](const std::string& why) { fail(path, ": tensor '", tensor, "': ", why); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad("needs dtype, shape and data_offsets");
    auto dt = v["dtype"].is_string() ? parse_st_dtype(v["dtype"].get<std::string>()) : std::nullopt;
    if (!dt) bad("unsupported dtype " + v["dtype"].dump());
    NamedTensor t;
    t.name = name;
    t.type.dtype = *dt;
    if (!v["shape"].is_array()) bad("shape is not a list");
    for (auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) bad("bad shape " + v["shape"].dump());
      t.type.shape.push_back(d.get<int64_t>());
    }
    auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("bad data_offsets");
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_size) bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + ") outside the " + std::to_string(data_size) + " data bytes (truncated file?)");
    const std::optional<size_t> need = t.type.checked_bytes();
    if (!need) bad(t.type.str() + " has more bytes than fit in 64 bits");
    if (e - b != *need) bad(t.type.str() + " needs " + std::to_string(*need) + " bytes, offsets give " + std::to_string(e - b));
    t.data.resize(e - b);
    in.seekg(static_cast<std::streamoff>(8 + n + b));
    in.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(e - b));
    if (!in) bad("read failed");
    ranges.emplace_back(b, e);
    file.tensors.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (auto& [b, e] : ranges) {
    if (b != at) fail(path, ": corrupt: tensor data ranges overlap or leave gaps");
    at = e;
  }
  if (at != data_size) fail(path, ": corrupt: ", data_size - at, " bytes after the last tensor");
  return file;
}

}  // namespace seam::io
