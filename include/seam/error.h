// seam::Error is the one exception type seam throws for bad input: a model that does
// not type-check, a shape mismatch, an unknown attribute. Its message names the place
// (node, value, shapes) so that the caller can print it and exit non-zero.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace seam {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Builds a message from any streamable parts and throws it as seam::Error.
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  throw Error(s.str());
}

// For broken internal invariants (a bug in seam, not in the user's model).
#define SEAM_ASSERT(cond)                                                              \
  do {                                                                                 \
    if (!(cond)) ::seam::fail("internal error: ", #cond, " failed at ", __FILE__, ":", \
                              __LINE__);                                               \
  } while (0)

}  // namespace seam
