// Token files (src/data/tokens.h): the format round trip, every refusal naming the file,
// the training windows, and `seam tokenize`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cli_fixture.h"
#include "data/tokens.h"
#include "seam/error.h"

namespace fs = std::filesystem;

namespace seam::testing {
namespace {

using data::TokenFile;

class Tokens : public CliTest {
 protected:
  std::string path(const std::string& name) const { return (dir / name).string(); }
  // The bytes of a token file written by write_tokens, for tests that damage them.
  std::string bytes_of(const TokenFile& f) {
    data::write_tokens(path("good.tok"), f);
    return slurp(dir / "good.tok");
  }
  void write_raw(const std::string& name, const std::string& bytes) {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
  std::string error_reading(const std::string& name) {
    try {
      data::read_tokens(path(name));
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }
};

TokenFile random_file(uint32_t vocab, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  TokenFile f;
  f.vocab = vocab;
  for (size_t i = 0; i < n; ++i) f.tokens.push_back(static_cast<uint16_t>(rng() % vocab));
  return f;
}

TEST_F(Tokens, RoundTripKeepsEveryIdAndTheVocabulary) {
  for (uint32_t vocab : {1u, 256u, 50304u, 65536u}) {
    const TokenFile f = random_file(vocab, 1001, vocab);
    data::write_tokens(path("t.tok"), f);
    const TokenFile g = data::read_tokens(path("t.tok"));
    EXPECT_EQ(g.vocab, vocab);
    EXPECT_EQ(g.tokens, f.tokens);
    EXPECT_EQ(fs::file_size(path("t.tok")), 24u + 2u * f.tokens.size());
  }
}

TEST_F(Tokens, TheLayoutIsTheDocumentedOne) {
  TokenFile f;
  f.vocab = 300;
  f.tokens = {1, 258};
  const std::string b = bytes_of(f);
  const std::string want("STOK\x01\0\0\0\x2c\x01\0\0\0\0\0\0\x02\0\0\0\0\0\0\0\x01\0\x02\x01", 28);
  EXPECT_EQ(b, want);
}

TEST_F(Tokens, ABadFileIsRefusedNamingTheFileAndTheProblem) {
  const std::string good = bytes_of(random_file(256, 10, 1));
  std::string bad = good;
  bad[0] = 'X';
  write_raw("magic.tok", bad);
  EXPECT_NE(error_reading("magic.tok").find("magic.tok': the magic is not \"STOK\""), std::string::npos)
      << error_reading("magic.tok");
  bad = good;
  bad[4] = 2;
  write_raw("version.tok", bad);
  EXPECT_NE(error_reading("version.tok").find("version 2, this build reads 1"), std::string::npos);
  write_raw("truncated.tok", good.substr(0, good.size() - 1));
  EXPECT_NE(error_reading("truncated.tok").find("the header says 10 tokens, the body holds 19 bytes"),
            std::string::npos)
      << error_reading("truncated.tok");
  write_raw("trailing.tok", good + "x");
  EXPECT_NE(error_reading("trailing.tok").find("the body holds 21 bytes"), std::string::npos);
  write_raw("short.tok", good.substr(0, 10));
  EXPECT_NE(error_reading("short.tok").find("shorter than the 24-byte header"), std::string::npos);
  bad = good;
  bad[24 + 2 * 7] = static_cast<char>(0x00);
  bad[24 + 2 * 7 + 1] = static_cast<char>(0x01);  // id 256 at position 7
  write_raw("beyond.tok", bad);
  EXPECT_NE(error_reading("beyond.tok").find("token 7 is 256, not below the vocabulary of 256"), std::string::npos)
      << error_reading("beyond.tok");
  bad = good;
  bad[8] = bad[9] = bad[10] = bad[11] = 0;
  write_raw("vocab.tok", bad);
  EXPECT_NE(error_reading("vocab.tok").find("vocabulary 0 is outside 1..65536"), std::string::npos);
  EXPECT_NE(error_reading("missing.tok").find("missing.tok': cannot open it"), std::string::npos);
}

TEST_F(Tokens, AWriteOfAnIdBeyondTheVocabularyFailsAndLeavesTheOldFile) {
  const TokenFile f = random_file(256, 5, 2);
  data::write_tokens(path("t.tok"), f);
  TokenFile g = f;
  g.tokens[3] = 256;
  try {
    data::write_tokens(path("t.tok"), g);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 3 is 256"), std::string::npos) << e.what();
  }
  EXPECT_EQ(data::read_tokens(path("t.tok")).tokens, f.tokens);
}

TEST(TokenWindows, TargetsAreTheNextTokensAndEachStepIsItsOwnDraw) {
  TokenFile f;
  f.vocab = 65536;
  for (int i = 0; i < 5000; ++i) f.tokens.push_back(static_cast<uint16_t>(i));  // id = position
  const data::TokenWindows w(f, 8, 64, 11, "test");
  std::vector<int32_t> x, y, x2, y2, x3, y3;
  w.fill(3, x, y);
  ASSERT_EQ(x.size(), 8u * 64u);
  bool starts_differ = false;
  for (int b = 0; b < 8; ++b) {
    const int32_t s = x[static_cast<size_t>(b * 64)];
    EXPECT_LE(s + 64, 4999);
    for (int t = 0; t < 64; ++t) {
      EXPECT_EQ(x[static_cast<size_t>(b * 64 + t)], s + t);
      EXPECT_EQ(y[static_cast<size_t>(b * 64 + t)], s + t + 1);
    }
    starts_differ = starts_differ || s != x[0];
  }
  EXPECT_TRUE(starts_differ);
  w.fill(3, x2, y2);  // the same step, the same windows, whatever ran before
  EXPECT_EQ(x2, x);
  w.fill(4, x3, y3);
  EXPECT_NE(x3, x);
  // Every start is reachable, the last one included: a corpus of exactly T + 1 tokens.
  TokenFile tight;
  tight.vocab = 256;
  tight.tokens.assign(65, 7);
  tight.tokens.back() = 9;
  const data::TokenWindows one(tight, 2, 64, 1, "test");
  one.fill(0, x, y);
  EXPECT_EQ(y.back(), 9);
}

TEST(TokenWindows, ACorpusShorterThanABlockIsAnError) {
  TokenFile f;
  f.vocab = 256;
  f.tokens.assign(64, 1);
  try {
    data::TokenWindows w(f, 2, 64, 1, "fortunes/train.tok");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fortunes/train.tok: a block of 64 tokens and its targets need 65 tokens, "
                                         "the corpus has 64"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Tokens, TokenizeSplitsTheTextFromItsEnd) {
  write_raw("a.txt", "Hello, ");
  write_raw("b.txt", "world! \xc3\xa9t\xc3\xa9\n");  // bytes, not characters
  const CliResult r = run("tokenize " + path("a.txt") + " " + path("b.txt") + " --out " + path("out") +
                          " --val-fraction 0.25");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("20 bytes"), std::string::npos) << r.out;
  const TokenFile train = data::read_tokens(path("out/train.tok")), val = data::read_tokens(path("out/val.tok"));
  EXPECT_EQ(train.vocab, 256u);
  ASSERT_EQ(val.tokens.size(), 5u);  // floor(20 * 0.25)
  std::string text;
  for (uint16_t t : train.tokens) text += static_cast<char>(t);
  for (uint16_t t : val.tokens) text += static_cast<char>(t);
  EXPECT_EQ(text, std::string("Hello, world! \xc3\xa9t\xc3\xa9\n"));
}

TEST_F(Tokens, TokenizeNamesAMissingFileAndWritesNothing) {
  write_raw("a.txt", "some text here");
  const CliResult r = run("tokenize " + path("a.txt") + " " + path("nope.txt") + " --out " + path("out"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("cannot read '" + path("nope.txt") + "'"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("out/train.tok")));
  const CliResult tiny = run("tokenize " + path("a.txt") + " --out " + path("out") + " --val-fraction 0.01");
  EXPECT_NE(tiny.code, 0);
  EXPECT_NE(tiny.err.find("each split needs at least one token"), std::string::npos) << tiny.err;
}

}  // namespace
}  // namespace seam::testing
