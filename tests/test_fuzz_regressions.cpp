// Every input fuzzing kept (tests/fuzz/regressions/<target>/, from tools/fuzz.sh) and the
// seed corpus (tests/fuzz/corpus/<target>/) through its reader: each is accepted or
// refused with a seam::Error, nothing else (in CI too, where the crashes they once were
// would show).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "fuzz/readers.h"
#include "seam/error.h"

namespace {

namespace fs = std::filesystem;

struct Replayed {
  int files = 0, accepted = 0;
};

Replayed replay(const std::string& target, const fs::path& dir) {
  Replayed r;
  if (!fs::exists(dir)) return r;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename() == "README") continue;
    ++r.files;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(e.path().string());
    try {
      seam::fuzz::read_as(target, std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
      ++r.accepted;
    } catch (const seam::Error&) {
    }
  }
  return r;
}

TEST(FuzzRegressions, EveryKeptInputIsAcceptedOrRefused) {
  for (const std::string& target : seam::fuzz::targets()) {
    const Replayed found = replay(target, fs::path(SEAM_FUZZ_DIR) / "regressions" / target);
    std::cout << "[ fuzz     ] " << target << ": " << found.files << " regression inputs\n";
  }
}

// The seeds are valid files of their kind (the ONNX ones are node tests, some of a form
// the importer refuses by name).
TEST(FuzzRegressions, TheSeedsAreRead) {
  for (const std::string& target : seam::fuzz::targets()) {
    const Replayed seeds = replay(target, fs::path(SEAM_FUZZ_DIR) / "corpus" / target);
    EXPECT_GT(seeds.files, 0) << target;
    if (target != "onnx") EXPECT_EQ(seeds.accepted, seeds.files) << target;
  }
}

}  // namespace
