// Small helpers the CPU and GPU tests share.
#pragma once
#include <cstring>
#include <vector>

#include "seam/plan.h"

namespace seam::testing {

// How many steps of a plan run an op: for tests that check what a pass made.
inline int count(const Plan& p, Op op) {
  int n = 0;
  for (auto& s : p.steps) n += s.op == op;
  return n;
}

// The bytes of a vector of values, for set_input and write_param.
template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace seam::testing
