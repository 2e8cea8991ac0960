// `seam train --nproc N`: the ranks of a data-parallel run on this host, started through
// mpirun (src/dist/comm.h has what each rank does).
#pragma once
#include <string>
#include <vector>

namespace seam::dist {

// Replaces this process by `mpirun -np ranks` running `args` (a seam command line without
// the program name and without --nproc) on this host; the exit status is mpirun's, which
// is the ranks'. Fails, saying why, where this seam has no MPI, mpirun is missing, or more
// ranks are asked than the CPUs this process may run on (each rank wants a core of its own).
[[noreturn]] void exec_ranks(int ranks, const std::vector<std::string>& args);

// `argv` without `--nproc N` / `--nproc=N`, from argv[1] on.
std::vector<std::string> without_nproc(int argc, char** argv);

}  // namespace seam::dist
