#include "dist/launch.h"

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "dist/comm.h"
#include "seam/error.h"

namespace seam::dist {

void exec_ranks(int ranks, const std::vector<std::string>& args) {
  if (ranks < 1) fail("--nproc ", ranks, ": at least 1");
  if (!have_mpi()) fail("--nproc ", ranks, ": this seam was built without MPI (install libopenmpi-dev and rebuild)");
  if (launched_as_rank()) fail("--nproc ", ranks, ": this process is already a rank of an MPI launch");
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  if (ranks > cpus)
    fail("--nproc ", ranks, ": this process may run on ", cpus, " CPU core(s), and each rank takes one (use --nproc ",
         cpus, " or fewer, or mpirun with its own placement)");
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) fail("--nproc: cannot find this program's path (/proc/self/exe): ", ec.message());
  std::vector<std::string> line{"mpirun", "-np", std::to_string(ranks)};
  // OpenMPI refuses root without this; asking for ranks here is the user's explicit choice.
  if (geteuid() == 0) line.push_back("--allow-run-as-root");
  line.push_back(self);
  line.insert(line.end(), args.begin(), args.end());
  std::vector<char*> cargs;
  for (std::string& s : line) cargs.push_back(s.data());
  cargs.push_back(nullptr);
  execvp("mpirun", cargs.data());
  fail("--nproc ", ranks, ": cannot start mpirun (", std::strerror(errno), "); install openmpi-bin");
}

std::vector<std::string> without_nproc(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nproc") {
      ++i;
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0) continue;
    out.push_back(a);
  }
  return out;
}

}  // namespace seam::dist
