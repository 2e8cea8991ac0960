// Token files: a corpus as 16-bit token ids, and the windows a language model trains on.
//
// Format (little-endian), version 1:
//   bytes  0-3   magic "STOK"
//   bytes  4-7   uint32 version (1)
//   bytes  8-11  uint32 vocab: every id is below it (1..65536)
//   bytes 12-15  uint32 reserved (0)
//   bytes 16-23  uint64 count of tokens
//   then count uint16 ids, and nothing after them.
// A reader refuses a wrong magic, another version, a vocabulary out of range, a body
// shorter or longer than the count says, and an id at or beyond the vocabulary, naming the
// file (and the token's position).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace seam::data {

struct TokenFile {
  uint32_t vocab = 0;
  std::vector<uint16_t> tokens;
};

TokenFile read_tokens(const std::string& path);
// Written atomically (a temporary file, synced and renamed); fails naming the path, or an
// id at or beyond `vocab` before anything is written.
void write_tokens(const std::string& path, const TokenFile& f);

// Byte-level tokens of text: one id per byte (vocabulary 256).
TokenFile byte_tokens(const std::string& text);

// seam tokenize: the files' bytes, concatenated in the order given, as byte-level tokens;
// the last `val_fraction` of them (0 < val_fraction < 1, each split at least one token)
// go to <out_dir>/val.tok, the rest to <out_dir>/train.tok. Fails naming a file it cannot
// read, or the fraction, before writing anything.
struct TokenizeCounts {
  uint64_t train = 0, val = 0;
};
TokenizeCounts tokenize_files(const std::vector<std::string>& files, const std::string& out_dir, double val_fraction);

// Training windows of T tokens and their next-token targets: window b of batch `step`
// starts at a position drawn uniformly from [0, count - T - 1] by a generator seeded from
// (seed, step), so a run is the same whatever came before it; x[b, t] = tokens[s + t] and
// y[b, t] = tokens[s + t + 1], as int32. Fails if the corpus has fewer than T + 1 tokens.
// It reads the TokenFile it is given, which must outlive it (a corpus is not copied).
class TokenWindows {
 public:
  TokenWindows(const TokenFile& f, int64_t batch, int64_t block, uint64_t seed, const std::string& what);
  void fill(uint64_t step, std::vector<int32_t>& x, std::vector<int32_t>& y) const;
  int64_t batch() const { return batch_; }
  int64_t block() const { return block_; }

 private:
  const TokenFile& f_;
  int64_t batch_, block_;
  uint64_t seed_;
};

}  // namespace seam::data
