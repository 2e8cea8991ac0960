// `seam train --nproc N`: the ranks of a data-parallel run on this host (src/dist/comm.h
// has what each rank does).
#pragma once
#include <string>
#include <vector>

namespace seam::dist {

// Runs `args` (a seam command line without the program name and without --nproc) as
// `ranks` processes on this host and returns their exit status. Through mpirun where this
// seam has MPI and mpirun is on the PATH (this process is replaced by it); else seam
// starts the ranks itself, meeting through a rendezvous folder (file_world), stops the
// others when one fails, passes SIGINT and SIGTERM on, and returns the first failure's
// status. SEAM_LAUNCH=fork picks the second way where both are possible. Fails, saying
// why, where more ranks are asked than the CPUs this process may run on.
int run_ranks(int ranks, const std::vector<std::string>& args);

// `argv` without `--nproc N` / `--nproc=N`, from argv[1] on.
std::vector<std::string> without_nproc(int argc, char** argv);

}  // namespace seam::dist
