// The fuzzed readers (tests/fuzz/readers.h).
#include "readers.h"

#include <unistd.h>

#include <fstream>

#include "data/idx.h"
#include "data/tokens.h"
#include "io/model_file.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "seam/seam.h"
#ifdef SEAM_HAS_ONNX
#include "io/onnx.h"
#endif

namespace seam::fuzz {

const std::vector<std::string>& targets() {
  static const std::vector<std::string> t = {"onnx", "model_file", "safetensors", "idx", "tokens", "npy"};
  return t;
}

namespace {

// The bytes in a file of this process's own (readers take paths).
std::string as_file(const std::string& target, std::span<const uint8_t> bytes) {
  const std::string path = "/tmp/seam_fuzz_" + std::to_string(::getpid()) + "." + target;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

}  // namespace

void read_as(const std::string& target, std::span<const uint8_t> bytes) {
  if (target == "onnx") {
#ifdef SEAM_HAS_ONNX
    onnx::OnnxImport imp = onnx::import_onnx_bytes(std::as_bytes(bytes), "fuzz input");
    imp.graph.verify();
#endif
    return;
  }
  if (target == "model_file") {
    // A model file that parses is built at a small batch: its layers, nodes and shapes.
    io::ModelSpec spec = io::parse_model_json(std::string(bytes.begin(), bytes.end()), "fuzz input");
    io::build_graph(spec, 2).graph.verify();
    return;
  }
  const std::string path = as_file(target, bytes);
  if (target == "safetensors") {
    io::read_safetensors(path);
  } else if (target == "idx") {  // labels (rank 1), else images (rank 3)
    try {
      data::read_idx(path, 1);
    } catch (const Error&) {
      data::read_idx(path, 3);
    }
  } else if (target == "tokens") {
    data::read_tokens(path);
  } else if (target == "npy") {
    io::read_npy(path);
  } else {
    fail("no fuzz target '", target, "'");
  }
}

}  // namespace seam::fuzz
