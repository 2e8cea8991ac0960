// Libraries seam loads only when a feature needs them (CUPTI for traces, NCCL for ranks),
// so that it neither links them nor fails to start where they are missing.
#pragma once
#include <dlfcn.h>

#include <string>
#include <type_traits>
#include <vector>

#include "seam/error.h"

namespace seam::cuda {

// The first of `paths` that loads; else fails naming `need`, every path tried and the
// environment variable `env` that names the file.
inline void* open_first(const std::vector<std::string>& paths, const std::string& need, const char* env) {
  for (const std::string& path : paths)
    if (void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
  std::string all;
  for (const std::string& p : paths) all += (all.empty() ? "" : ", ") + p;
  fail(need, ", not found; tried ", all, " (", env, "=FILE names it)");
}

// `f` set to the library's function `name`; fails naming `lib_name` where it is missing.
template <class F>
void load_symbol(void* lib, F& f, const char* name, const char* lib_name) {
  f = reinterpret_cast<std::remove_reference_t<F>>(dlsym(lib, name));
  if (!f) fail(lib_name, ": ", name, " is missing from the library loaded");
}

}  // namespace seam::cuda
