// The seam command line. `seam ops` lists every op; training commands build on the
// same library the C++ API uses.
#include <CLI/CLI.hpp>
#include <iostream>

#include "ops/registry.h"
#include "seam/seam.h"
#ifdef SEAM_HAS_CUDA
#include "backend/cuda/device.h"
#endif

namespace {

void print_version() {
  std::cout << "seam " << SEAM_VERSION << "\n";
#ifdef SEAM_HAS_CUDA
  std::string why;
  auto devs = seam::cuda::devices(&why);
  std::cout << "CUDA backend: built (runtime " << seam::cuda::runtime_version() / 1000 << "."
            << seam::cuda::runtime_version() % 1000 / 10 << ")\n";
  if (devs.empty()) std::cout << "  no GPU available: " << why << "\n";
  for (auto& d : devs)
    std::cout << "  GPU " << d.index << ": " << d.name << ", sm_" << d.compute_capability << ", "
              << d.multiprocessors << " SMs, " << d.memory_bytes / (1u << 20) << " MiB\n";
#else
  std::cout << "CUDA backend: not built\n";
#endif
}

void print_ops(bool with_grads) {
  for (int i = 0; i < seam::kNumOps; ++i) {
    auto op = static_cast<seam::Op>(i);
    const seam::OpDef& d = seam::op_def(op);
    std::string name = d.name;
    bool is_grad = name.find("_grad") != std::string::npos;
    if (is_grad && !with_grads) continue;
    std::cout << d.signature() << "\n    " << d.doc;
    if (!is_grad) std::cout << (d.grad ? "" : "  [no gradient]");
    if (d.view_of >= 0) std::cout << "  [view: no copy]";
    std::cout << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"seam: compiles a neural network's whole training step into one plan and runs it"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "print the version and the devices seam sees");
  auto* ops = app.add_subcommand("ops", "list every op with its signature");
  bool grads = false;
  ops->add_flag("--grads", grads, "include the gradient ops that autodiff inserts");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (version) {
      print_version();
      return 0;
    }
    if (*ops) {
      print_ops(grads);
      return 0;
    }
    std::cout << app.help();
    return 0;
  } catch (const seam::Error& e) {
    std::cerr << "seam: error: " << e.what() << "\n";
    return 1;
  }
}
