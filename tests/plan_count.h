// How many steps of a plan run an op: for tests that check what a pass made.
#pragma once
#include "seam/plan.h"

namespace seam::testing {

inline int count(const Plan& p, Op op) {
  int n = 0;
  for (auto& s : p.steps) n += s.op == op;
  return n;
}

}  // namespace seam::testing
