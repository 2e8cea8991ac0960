// The seam binary run as a user runs it, its output captured, in a fresh folder per test:
// for the CLI tests (test_cli.cpp, test_numerics.cpp).
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace seam::testing {

struct CliResult {
  int code;
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class CliTest : public ::testing::Test {
 protected:
  std::filesystem::path dir;
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() /
          ("seam_cli_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  CliResult run(const std::string& args) { return run_in(std::filesystem::path(), args); }
  // The same from the folder `cwd` (empty: the test's own), so that relative paths in
  // the arguments and the messages read as a user's would.
  CliResult run_in(const std::filesystem::path& cwd, const std::string& args) {
    const std::filesystem::path out = dir / "stdout.txt", err = dir / "stderr.txt";
    const std::string cmd = (cwd.empty() ? "" : "cd '" + cwd.string() + "' && ") + std::string(SEAM_CLI_PATH) + " " + args +
                            " >" + out.string() + " 2>" + err.string();
    const int status = std::system(cmd.c_str());
    return {WEXITSTATUS(status), slurp(out), slurp(err)};
  }
};

}  // namespace seam::testing
