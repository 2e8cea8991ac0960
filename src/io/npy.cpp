// NumPy .npy files (src/io/npy.h). The header is a Python dict literal, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }, padded with spaces to a
// multiple of 64 bytes with the magic and lengths before it.
#include "io/npy.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/file.h"

namespace seam::io {

namespace {

constexpr char kMagic[] = "\x93NUMPY";

// The quoted value of `key` in the header dict ("" if absent).
std::string dict_value(const std::string& h, const std::string& key) {
  const size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) return "";
  size_t v = h.find(':', k);
  if (v == std::string::npos) return "";
  ++v;
  while (v < h.size() && h[v] == ' ') ++v;
  if (v >= h.size()) return "";
  if (h[v] == '\'') {
    const size_t end = h.find('\'', v + 1);
    return end == std::string::npos ? "" : h.substr(v + 1, end - v - 1);
  }
  if (h[v] == '(') {
    const size_t end = h.find(')', v);
    return end == std::string::npos ? "" : h.substr(v, end - v + 1);
  }
  size_t end = v;
  while (end < h.size() && h[end] != ',' && h[end] != '}') ++end;
  return h.substr(v, end - v);
}

}  // namespace

HostTensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open the file");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.compare(0, 6, kMagic, 6) != 0) fail(path, ": not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(path, ": truncated header");
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    start = 12;
  } else {
    fail(path, ": .npy format version ", major, " (seam reads 1 to 3)");
  }
  if (start + header_len > bytes.size()) fail(path, ": the header runs past the end of the file");
  const std::string h = bytes.substr(start, header_len);
  const std::string descr = dict_value(h, "descr"), order = dict_value(h, "fortran_order"),
                    shape_text = dict_value(h, "shape");
  if (order != "False") fail(path, ": Fortran-ordered arrays are not supported (save it C-ordered)");
  if (shape_text.empty() || shape_text.front() != '(') fail(path, ": no shape in the header");
  Shape shape;
  {
    std::string inner = shape_text.substr(1, shape_text.size() - 2);
    std::stringstream ss(inner);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.find_first_not_of(' ') == std::string::npos) continue;
      long long d = -1;
      try {
        d = std::stoll(item);
      } catch (const std::exception&) {
        fail(path, ": the shape ", shape_text, " is not a tuple of integers");
      }
      if (d <= 0) fail(path, ": the shape ", shape_text, " has a dimension seam cannot hold (", d, ")");
      shape.push_back(d);
    }
  }
  struct Kind {
    const char* descr;
    DType dtype;
    size_t bytes;
  };
  static const Kind kinds[] = {{"<f4", DType::f32, 4}, {"<f8", DType::f64, 8}, {"<f2", DType::f16, 2},
                               {"<i4", DType::i32, 4}, {"<i8", DType::i32, 8}, {"|u1", DType::u8, 1},
                               {"|b1", DType::u8, 1}};
  const Kind* kind = nullptr;
  for (const Kind& k : kinds)
    if (descr == k.descr) kind = &k;
  if (!kind) fail(path, ": element type '", descr, "' (seam reads <f4, <f8, <f2, <i4, <i8, |u1 and |b1)");
  const size_t n = static_cast<size_t>(numel(shape));
  const size_t data = start + header_len;
  if (bytes.size() - data < n * kind->bytes)
    fail(path, ": ", bytes.size() - data, " bytes of data for ", shape_str(shape), " of ", descr);
  HostTensor t{"", TensorType{kind->dtype, shape}, std::vector<std::byte>(n * dtype_size(kind->dtype))};
  if (kind->bytes == dtype_size(kind->dtype)) {
    std::memcpy(t.data.data(), bytes.data() + data, t.data.size());
  } else {  // int64 into i32
    for (size_t i = 0; i < n; ++i) {
      int64_t v;
      std::memcpy(&v, bytes.data() + data + 8 * i, 8);
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
        fail(path, ": element ", i, " is ", v, ", outside the 32-bit integers seam keeps int64 in");
      const auto w = static_cast<int32_t>(v);
      std::memcpy(t.data.data() + 4 * i, &w, 4);
    }
  }
  return t;
}

void write_npy(const std::string& path, const HostTensor& t) {
  const char* descr = nullptr;
  switch (t.type.dtype) {
    case DType::f32: descr = "<f4"; break;
    case DType::f64: descr = "<f8"; break;
    case DType::f16: descr = "<f2"; break;
    case DType::i32: descr = "<i4"; break;
    case DType::u8: descr = "|u1"; break;
    case DType::bf16: fail(path, ": NumPy has no bfloat16 (cast the output to f32 first)");
  }
  std::string shape = "(";  // (), (n,), (a, b, c)
  for (size_t i = 0; i < t.type.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.type.shape[i]);
  shape += t.type.shape.size() == 1 ? ",)" : ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out(kMagic, 6);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  write_file_atomically(path, std::as_bytes(std::span(out)));
}

}  // namespace seam::io
