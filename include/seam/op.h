// The Op enum, generated from ops.def so that adding an op cannot miss its name.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace seam {

enum class Op : uint16_t {
#define SEAM_OP(name) name,
#define SEAM_UNARY(name, ...) name, name##_grad,
#define SEAM_BINARY(name, ...) name, name##_grad_a, name##_grad_b,
#include "seam/ops.def"
};

inline constexpr int kNumOps = 0
#define SEAM_OP(name) +1
#define SEAM_UNARY(name, ...) +2
#define SEAM_BINARY(name, ...) +3
#include "seam/ops.def"
    ;

const char* op_name(Op op);
std::optional<Op> parse_op(std::string_view name);

}  // namespace seam
