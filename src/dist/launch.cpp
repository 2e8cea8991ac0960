#include "dist/launch.h"

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "dist/comm.h"
#include "seam/error.h"

namespace seam::dist {

namespace {

std::vector<char*> c_args(std::vector<std::string>& line) {
  std::vector<char*> v;
  for (std::string& s : line) v.push_back(s.data());
  v.push_back(nullptr);
  return v;
}

bool on_path(const char* program) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  for (const char *p = path, *end; *p; p = *end ? end + 1 : end) {
    end = std::strchr(p, ':');
    if (!end) end = p + std::strlen(p);
    if (access((std::string(p, end) + "/" + program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

[[noreturn]] void exec_mpirun(int ranks, const std::string& self, const std::vector<std::string>& args) {
  std::vector<std::string> line{"mpirun", "-np", std::to_string(ranks)};
  // OpenMPI refuses root without this; asking for ranks here is the user's explicit choice.
  if (geteuid() == 0) line.push_back("--allow-run-as-root");
  line.push_back(self);
  line.insert(line.end(), args.begin(), args.end());
  std::vector<char*> cargs = c_args(line);
  execvp("mpirun", cargs.data());
  fail("--nproc ", ranks, ": cannot start mpirun (", std::strerror(errno), ")");
}

std::vector<pid_t> g_children;  // for the signal handler: the ranks still running
extern "C" void pass_signal_on(int sig) {
  for (pid_t p : g_children)
    if (p > 0) kill(p, sig);
}

// The exit status a shell would report for a waited-for process.
int status_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

int fork_ranks(int ranks, const std::string& self, const std::vector<std::string>& args) {
  std::string dir = (std::filesystem::temp_directory_path() / "seam-ranks-XXXXXX").string();
  if (!mkdtemp(dir.data())) fail("--nproc: cannot make a rendezvous folder in ", dir, ": ", std::strerror(errno));
  g_children.assign(static_cast<size_t>(ranks), 0);
  struct sigaction sa {}, old_int {}, old_term {};
  sa.sa_handler = pass_signal_on;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  std::fflush(nullptr);
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) fail("--nproc: fork: ", std::strerror(errno));
    if (pid == 0) {
      setenv("SEAM_RANK", std::to_string(r).c_str(), 1);
      setenv("SEAM_LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("SEAM_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      setenv("SEAM_RENDEZVOUS", dir.c_str(), 1);
      std::vector<std::string> line{self};
      line.insert(line.end(), args.begin(), args.end());
      std::vector<char*> cargs = c_args(line);
      execv(self.c_str(), cargs.data());
      std::_Exit(127);
    }
    g_children[static_cast<size_t>(r)] = pid;
  }
  int code = 0, left = ranks;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  while (left > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    if (pid == 0) {  // stopping, and some rank still runs: give it time, then kill it
      if (std::chrono::steady_clock::now() > stop_deadline) pass_signal_on(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    int rank = -1;
    for (int r = 0; r < ranks; ++r)
      if (g_children[static_cast<size_t>(r)] == pid) rank = r, g_children[static_cast<size_t>(r)] = 0;
    if (rank < 0) continue;
    --left;
    const int c = status_code(status);
    if (c != 0 && !stopping) {
      // A rank that failed leaves the others waiting in its next collective: stop them.
      std::fprintf(stderr, "seam: rank %d of %d %s %d; stopping the other ranks\n", rank, ranks,
                   WIFEXITED(status) ? "exited with status" : "was killed by signal",
                   WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      code = c;
      stopping = true;
      // Ranks waiting for it in a collective stop at once (file_world watches for this).
      std::FILE* f = std::fopen((dir + "/abort").c_str(), "w");
      if (f) std::fclose(f);
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      pass_signal_on(SIGTERM);
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return code;
}

}  // namespace

int run_ranks(int ranks, const std::vector<std::string>& args) {
  if (ranks < 1) fail("--nproc ", ranks, ": at least 1");
  if (launched_as_rank()) fail("--nproc ", ranks, ": this process is already one of several ranks");
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  if (ranks > cpus)
    fail("--nproc ", ranks, ": this process may run on ", cpus, " CPU core(s), and each rank takes one (use --nproc ",
         cpus, " or fewer, or mpirun with its own placement)");
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) fail("--nproc: cannot find this program's path (/proc/self/exe): ", ec.message());
  const char* how = std::getenv("SEAM_LAUNCH");
  const bool fork_wanted = how && std::strcmp(how, "fork") == 0;
  if (how && *how && !fork_wanted && std::strcmp(how, "mpirun") != 0)
    fail("SEAM_LAUNCH=", how, ": mpirun or fork");
  if (!fork_wanted && have_mpi() && on_path("mpirun")) exec_mpirun(ranks, self, args);
  if (how && std::strcmp(how, "mpirun") == 0)
    fail("--nproc ", ranks, ": SEAM_LAUNCH=mpirun, but ", have_mpi() ? "mpirun is not on the PATH" : "this seam has no MPI");
  return fork_ranks(ranks, self, args);
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
