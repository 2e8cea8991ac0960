// Element types and static shapes. Every value in a seam graph has a dtype and a fully
// known shape when it is created; a plan is compiled for exactly those shapes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace seam {

// f64 exists for the reference backend and gradient checks; models train in f32 or
// lower precision.
enum class DType : uint8_t { f32, f64, bf16, f16, i32, u8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
bool is_float(DType t);
std::optional<DType> parse_dtype(std::string_view name);

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& s);
std::string shape_str(const Shape& s);
// Normalizes a possibly negative axis against a rank, or returns -1 if out of range.
int normalize_axis(int64_t axis, size_t rank);

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  int64_t numel() const { return seam::numel(shape); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::string str() const;  // e.g. "f32[128,784]"
  bool operator==(const TensorType&) const = default;
};

}  // namespace seam
