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
// bf16 or f16: stored in 16 bits, computed in f32.
inline bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }
// What values of a float dtype are computed in: f32 for the 16-bit types, else the dtype.
inline DType compute_dtype(DType t) { return is_half(t) ? DType::f32 : t; }
std::optional<DType> parse_dtype(std::string_view name);

using Shape = std::vector<int64_t>;
// The element count; throws seam::Error naming the shape when a dim is negative or the
// product does not fit int64, so that a shape from a file can never wrap to a small size.
int64_t numel(const Shape& s);
// The same count, or nullopt where numel would throw: for readers of files, which name
// the file and field in their own message.
std::optional<int64_t> checked_numel(const Shape& s);
std::string shape_str(const Shape& s);
// Normalizes a possibly negative axis against a rank, or returns -1 if out of range.
int normalize_axis(int64_t axis, size_t rank);

// The order of a 4-d value's elements in memory. plain: row-major over its shape, which is
// NCHW for an image batch and [C_out, C_in, kh, kw] for a filter. nhwc: the shape itself
// is written in memory order, [N, H, W, C] ([C_out, kh, kw, C_in] for a filter), and the
// value stands for the NCHW tensor whose channels are its last dim. Assigned by the
// layout pass (src/passes/layout.h) and by Graph::add from each node's operands; ops that
// care read their `layout` attribute, never this tag.
enum class DataLayout : uint8_t { plain, nhwc };

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  DataLayout layout = DataLayout::plain;
  int64_t numel() const { return seam::numel(shape); }
  size_t bytes() const;  // throws seam::Error naming the type when it overflows size_t
  std::optional<size_t> checked_bytes() const;  // nullopt on a negative dim or overflow
  std::string str() const;  // e.g. "f32[128,784]", "bf16[256,32,32,64]nhwc"
  bool operator==(const TensorType&) const = default;
};

}  // namespace seam
