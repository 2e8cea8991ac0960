// One libFuzzer target per reader (readers.h): built by tools/fuzz.sh as
// seam_fuzz_<target>, with SEAM_FUZZ_TARGET naming the reader. The build runs under
// AddressSanitizer and UndefinedBehaviorSanitizer; a reader may only accept the bytes or
// throw seam::Error.
#include <cstddef>
#include <cstdint>
#include <span>

#include "readers.h"
#include "seam/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    seam::fuzz::read_as(SEAM_FUZZ_TARGET, std::span(data, size));
  } catch (const seam::Error&) {
  }
  return 0;
}
