// The readers of outside bytes that fuzzing covers (tools/fuzz.sh), each as one call on a
// buffer: the fuzz targets (fuzz_target.cpp) and the replay of the inputs fuzzing found
// (test_fuzz_regressions.cpp) share it. A reader must either accept the bytes or throw
// seam::Error; anything else (a crash, another exception, a sanitizer report) is a bug.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace seam::fuzz {

// onnx, model_file, safetensors, idx, tokens, npy
const std::vector<std::string>& targets();
// Runs the reader named `target` on the bytes (through a private temporary file for the
// readers that take a path).
void read_as(const std::string& target, std::span<const uint8_t> bytes);

}  // namespace seam::fuzz
