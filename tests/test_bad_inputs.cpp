// Every bad input of tests/bad_inputs.json (the command line, model files, checkpoints,
// data and token files, ONNX and .npy files) given to the seam binary as a user would:
// each must exit with its status and print its message, exactly. docs/errors.md is the
// same table, rendered: the test fails when the two differ, and SEAM_UPDATE_DOCS=1
// rewrites the document from the cases.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_fixture.h"

namespace seam::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json cases() {
  std::ifstream in(SEAM_BAD_INPUTS);
  return json::parse(in);
}

std::string markdown_row(const json& c) {
  std::string msg = c["message"].get<std::string>();
  for (size_t at = 0; (at = msg.find('|', at)) != std::string::npos; at += 2) msg.replace(at, 1, "\\|");
  return "| " + c["input"].get<std::string>() + " | `seam " + c["args"].get<std::string>() + "` | " +
         std::to_string(c["exit"].get<int>()) + " | " + msg + " |\n";
}

std::string render(const json& all) {
  std::ostringstream s;
  s << "# Bad input and what seam says\n\n"
       "Each row is a test (tests/test_bad_inputs.cpp runs every case of tests/bad_inputs.json through the seam "
       "binary, with the files the case names, and compares the exit status and the last line of stderr with the "
       "table). Messages name the file, the place in it (line, layer, node, tensor) and what is wrong; usage errors "
       "exit with 2, other errors with 1.\n";
  std::string area;
  for (const json& c : all) {
    if (c["area"] != area) {
      area = c["area"].get<std::string>();
      s << "\n## " << area << "\n\n| input | command | exit | message |\n|---|---|---|---|\n";
    }
    s << markdown_row(c);
  }
  return s.str();
}

class BadInputs : public CliTest {};

TEST_F(BadInputs, EachGetsItsMessage) {
  const json all = cases();
  EXPECT_GE(all.size(), 40u);
  for (const json& c : all) {
    SCOPED_TRACE(c["input"].get<std::string>() + ": seam " + c["args"].get<std::string>());
    const fs::path here = dir / "case";
    fs::remove_all(here);
    fs::create_directories(here);
    for (const auto& [name, content] : c["files"].items()) {
      const fs::path p = here / name;
      fs::create_directories(p.parent_path());
      std::string text = content.get<std::string>();
      std::ofstream out(p, std::ios::binary);
      if (text.rfind("hex:", 0) == 0) {
        for (size_t i = 4; i + 1 < text.size(); i += 2) out.put(static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16)));
      } else {
        out << text;
      }
    }
    const CliResult r = run_in(here, c["args"].get<std::string>());
    EXPECT_EQ(r.code, c["exit"].get<int>()) << r.err;
    std::string last = r.err;
    while (!last.empty() && last.back() == '\n') last.pop_back();
    last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
    EXPECT_EQ(last, c["message"].get<std::string>());
  }
}

TEST(BadInputsDoc, IsTheTableOfTheCases) {
  const std::string want = render(cases());
  if (std::getenv("SEAM_UPDATE_DOCS")) {
    std::ofstream(SEAM_ERRORS_DOC) << want;
    return;
  }
  std::ifstream in(SEAM_ERRORS_DOC);
  std::stringstream have;
  have << in.rdbuf();
  EXPECT_EQ(have.str(), want) << "docs/errors.md differs from tests/bad_inputs.json: SEAM_UPDATE_DOCS=1 rewrites it";
}

}  // namespace
}  // namespace seam::testing
