// Token files (src/data/tokens.h).
#include "data/tokens.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "seam/error.h"
#include "common/file.h"

namespace seam::data {

namespace {

constexpr char kMagic[4] = {'S', 'T', 'O', 'K'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 24;

template <class T>
T load_le(const unsigned char* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  return v;
}

template <class T>
void store_le(std::vector<std::byte>& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
}

void check_ids(const TokenFile& f, const std::string& path) {
  if (f.vocab < 1 || f.vocab > 65536)
    fail("token file '", path, "': vocabulary ", f.vocab, " is outside 1..65536");
  for (size_t i = 0; i < f.tokens.size(); ++i)
    if (f.tokens[i] >= f.vocab)
      fail("token file '", path, "': token ", i, " is ", f.tokens[i], ", not below the vocabulary of ", f.vocab);
}

}  // namespace

TokenFile read_tokens(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("token file '", path, "': cannot open it: ", std::strerror(errno));
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < kHeader)
    fail("token file '", path, "': ", bytes.size(), " bytes, shorter than the ", kHeader, "-byte header");
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) fail("token file '", path, "': the magic is not \"STOK\"");
  const uint32_t version = load_le<uint32_t>(bytes.data() + 4);
  if (version != kVersion) fail("token file '", path, "': version ", version, ", this build reads ", kVersion);
  TokenFile f;
  f.vocab = load_le<uint32_t>(bytes.data() + 8);
  const uint64_t count = load_le<uint64_t>(bytes.data() + 16);
  const uint64_t body = bytes.size() - kHeader;
  if (count > body / 2 || body != 2 * count)
    fail("token file '", path, "': the header says ", count, " tokens, the body holds ", body,
         " bytes (2 a token): truncated or with trailing data");
  f.tokens.resize(count);
  for (uint64_t i = 0; i < count; ++i) f.tokens[i] = load_le<uint16_t>(bytes.data() + kHeader + 2 * i);
  check_ids(f, path);
  return f;
}

void write_tokens(const std::string& path, const TokenFile& f) {
  check_ids(f, path);
  std::vector<std::byte> out;
  out.reserve(kHeader + 2 * f.tokens.size());
  for (char c : kMagic) out.push_back(static_cast<std::byte>(c));
  store_le<uint32_t>(out, kVersion);
  store_le<uint32_t>(out, f.vocab);
  store_le<uint32_t>(out, 0);
  store_le<uint64_t>(out, f.tokens.size());
  for (uint16_t t : f.tokens) store_le<uint16_t>(out, t);
  write_file_atomically(path, out);
}

TokenFile byte_tokens(const std::string& text) {
  TokenFile f;
  f.vocab = 256;
  f.tokens.reserve(text.size());
  for (char c : text) f.tokens.push_back(static_cast<unsigned char>(c));
  return f;
}

TokenizeCounts tokenize_files(const std::vector<std::string>& files, const std::string& out_dir, double val_fraction) {
  if (!(val_fraction > 0 && val_fraction < 1)) fail("tokenize: the validation fraction ", val_fraction, " is not in (0, 1)");
  if (files.empty()) fail("tokenize: no input files");
  std::string text;
  for (const std::string& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("tokenize: cannot read '", path, "': ", std::strerror(errno));
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) fail("tokenize: reading '", path, "' failed");
  }
  const auto val = static_cast<size_t>(static_cast<double>(text.size()) * val_fraction);
  if (val < 1 || val >= text.size())
    fail("tokenize: ", text.size(), " bytes leave ", val, " for validation at fraction ", val_fraction,
         ": each split needs at least one token");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) fail("tokenize: cannot create the folder '", out_dir, "': ", ec.message());
  const std::filesystem::path dir(out_dir);
  const size_t train = text.size() - val;
  write_tokens((dir / "train.tok").string(), byte_tokens(text.substr(0, train)));
  write_tokens((dir / "val.tok").string(), byte_tokens(text.substr(train)));
  return {train, val};
}

TokenWindows::TokenWindows(const TokenFile& f, int64_t batch, int64_t block, uint64_t seed, const std::string& what)
    : f_(f), batch_(batch), block_(block), seed_(seed) {
  if (batch < 1 || block < 1) fail(what, ": batch ", batch, " and block size ", block, " must be at least 1");
  if (static_cast<int64_t>(f.tokens.size()) < block + 1)
    fail(what, ": a block of ", block, " tokens and its targets need ", block + 1, " tokens, the corpus has ",
         f.tokens.size());
}

void TokenWindows::fill(uint64_t step, std::vector<int32_t>& x, std::vector<int32_t>& y) const {
  const size_t n = static_cast<size_t>(batch_ * block_);
  x.resize(n);
  y.resize(n);
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32), static_cast<uint32_t>(step),
                    static_cast<uint32_t>(step >> 32)};
  std::mt19937_64 rng(seq);
  const auto last = static_cast<uint64_t>(f_.tokens.size()) - static_cast<uint64_t>(block_) - 1;
  for (int64_t b = 0; b < batch_; ++b) {
    // Uniform over [0, last] without the modulo bias of rng() % (last + 1).
    const uint64_t s = std::uniform_int_distribution<uint64_t>(0, last)(rng);
    for (int64_t t = 0; t < block_; ++t) {
      x[static_cast<size_t>(b * block_ + t)] = f_.tokens[s + static_cast<uint64_t>(t)];
      y[static_cast<size_t>(b * block_ + t)] = f_.tokens[s + static_cast<uint64_t>(t) + 1];
    }
  }
}

}  // namespace seam::data
