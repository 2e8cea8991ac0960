// libFuzzer target over the ONNX importer (tools/fuzz.sh): any bytes either import or
// fail with seam::Error; nothing else may escape, crash, leak or read out of bounds (the
// build runs under AddressSanitizer and UndefinedBehaviorSanitizer). An import that
// succeeds also goes through a CPU model's evaluation plan, which checks the graph again.
#include <cstddef>
#include <cstdint>
#include <span>

#include "io/onnx.h"
#include "seam/seam.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    seam::onnx::OnnxImport imp = seam::onnx::import_onnx_bytes(
        std::as_bytes(std::span(reinterpret_cast<const char*>(data), size)), "fuzz input");
    imp.graph.verify();
  } catch (const seam::Error&) {
  }
  return 0;
}
