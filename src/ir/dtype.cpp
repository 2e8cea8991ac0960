// Element types and shapes.
#include "seam/dtype.h"

#include <cmath>

#include "seam/error.h"

namespace seam {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::u8: return 1;
  }
  SEAM_ASSERT(false);
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  SEAM_ASSERT(false);
}

bool is_float(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::u8})
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

std::optional<int64_t> checked_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

int64_t numel(const Shape& s) {
  if (auto n = checked_numel(s)) return *n;
  for (int64_t d : s)
    if (d < 0) fail("shape ", shape_str(s), " has a negative dimension");
  fail("shape ", shape_str(s), " has more elements than fit in 64 bits");
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

int normalize_axis(int64_t axis, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) return -1;
  return static_cast<int>(axis < 0 ? axis + r : axis);
}

std::optional<size_t> TensorType::checked_bytes() const {
  auto n = checked_numel(shape);
  size_t b;
  if (!n || __builtin_mul_overflow(static_cast<size_t>(*n), dtype_size(dtype), &b)) return std::nullopt;
  return b;
}

size_t TensorType::bytes() const {
  if (auto b = checked_bytes()) return *b;
  numel();  // names a negative dim or an element count that overflows
  fail("tensor ", str(), " has more bytes than fit in 64 bits");
}

std::string TensorType::str() const {
  return std::string(dtype_name(dtype)) + shape_str(shape) + (layout == DataLayout::nhwc ? "nhwc" : "");
}

}  // namespace seam
