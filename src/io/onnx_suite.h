// The ONNX backend node tests (Debian's libonnx-testdata) through the importer:
// `seam onnx-suite`. Each test is pass (every output within the suite's tolerance), fail
// (a wrong value, or an error while running), refused (the importer names a form of a
// supported op it does not take: an attribute, a dtype, an asymmetric pad) or
// unsupported (an op type, or a domain, seam does not import).
#pragma once
#include <string>

#include "seam/model.h"

namespace seam::onnx {

struct SuiteOptions {
  std::string dir = "/usr/share/libonnx-testdata/data/node";
  Device device = Device::cpu;
  std::string filter;       // only tests whose folder name contains it
  std::string markdown;     // also write the table here
  bool verbose = false;     // a line for every test
  bool show_failures = true;  // a line for each fail and refused test
  double min_pass_percent = 0;  // exit 1 when fewer of the supported ops' tests pass
};

// Prints the per-op table and the totals; returns the process exit code.
int run_onnx_suite(const SuiteOptions& options);

}  // namespace seam::onnx
