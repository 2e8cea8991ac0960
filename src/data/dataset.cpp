// Opening a model's data as splits: images from IDX files, token windows from token files.
#include "data/dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "seam/error.h"

namespace seam::data {

TokenBatches::TokenBatches(const TokenFile& f, int64_t batch, int64_t block, bool train, uint64_t seed,
                           const std::string& what, int32_t pad_label)
    : f_(f), windows_(f, batch, block, seed, what), train_(train), pad_(pad_label) {}

int64_t TokenBatches::samples() const {
  const auto targets = static_cast<int64_t>(f_.tokens.size()) - 1;  // tokens with a successor
  const int64_t T = windows_.block();
  return train_ ? std::max<int64_t>(1, targets / T) : (targets + T - 1) / T;
}

int64_t TokenBatches::batches_per_epoch() const {
  const int64_t B = windows_.batch();
  return train_ ? std::max<int64_t>(1, samples() / B) : (samples() + B - 1) / B;
}

void TokenBatches::start_epoch(int64_t epoch, int64_t first) {
  epoch_ = epoch;
  next_ = first;
}

bool TokenBatches::next(Batch& out) {
  if (next_ >= batches_per_epoch()) return false;
  const int64_t B = windows_.batch(), T = windows_.block();
  out.x.clear();
  out.index = next_;
  if (train_) {
    windows_.fill(static_cast<uint64_t>(epoch_ * batches_per_epoch() + next_), out.ids, out.y);
    out.rows = B;
  } else {
    const auto n = static_cast<int64_t>(f_.tokens.size());
    out.ids.assign(static_cast<size_t>(B * T), 0);
    out.y.assign(static_cast<size_t>(B * T), pad_);
    out.rows = std::min(B, samples() - next_ * B);
    for (int64_t r = 0; r < out.rows; ++r) {
      const int64_t start = (next_ * B + r) * T;
      for (int64_t t = 0; t < T && start + t + 1 < n; ++t) {
        const auto i = static_cast<size_t>(r * T + t);
        out.ids[i] = f_.tokens[static_cast<size_t>(start + t)];
        out.y[i] = f_.tokens[static_cast<size_t>(start + t + 1)];
      }
    }
  }
  ++next_;
  return true;
}

namespace {

std::vector<int64_t> first_n(int64_t n, int64_t limit) {
  const int64_t k = limit > 0 ? std::min(n, limit) : n;
  std::vector<int64_t> v(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// Moves a seeded share (o.val_split) of the training indices to the validation split.
void hold_out(std::vector<int64_t>& train_idx, std::vector<int64_t>& val_idx, const DataOptions& o) {
  if (o.val_split <= 0) return;
  auto perm = permutation(static_cast<int64_t>(train_idx.size()), o.seed, ~uint64_t{0});
  auto nval = static_cast<size_t>(static_cast<double>(train_idx.size()) * o.val_split);
  std::vector<int64_t> kept;
  for (size_t i = 0; i < perm.size(); ++i) (i < nval ? val_idx : kept).push_back(train_idx[static_cast<size_t>(perm[i])]);
  train_idx = std::move(kept);
}

// The mean and standard deviation of the pixels (in [0, 1]) of the given images.
Normalize pixel_statistics(const ImageSet& s, const std::vector<int64_t>& idx) {
  double sum = 0, sq = 0;
  const int64_t px = s.pixels();
  for (int64_t i : idx)
    for (int64_t p = 0; p < px; ++p) {
      const double v = s.images[static_cast<size_t>(i * px + p)] / 255.0;
      sum += v, sq += v * v;
    }
  const double n = static_cast<double>(px) * static_cast<double>(std::max<size_t>(idx.size(), 1));
  const double mean = sum / n, var = std::max(sq / n - mean * mean, 0.0);
  return {static_cast<float>(mean), static_cast<float>(var > 0 ? std::sqrt(var) : 1.0)};
}

}  // namespace

Dataset open_images(const std::string& dir, const DataOptions& o) {
  Dataset d;
  d.images = std::make_shared<ImageData>(load_image_data(dir));
  const ImageData& data = *d.images;
  d.classes = data.classes;
  // Training indices (optionally a seeded validation split held out of them).
  std::vector<int64_t> train_idx = first_n(data.train.n, o.limit_train), val_idx;
  hold_out(train_idx, val_idx, o);
  const Normalize norm = pixel_statistics(data.train, train_idx);
  d.train_samples = static_cast<int64_t>(train_idx.size());
  d.describe = std::to_string(train_idx.size()) + " training images from " + dir;
  const BatchLoader::Options eval{.batch = o.batch, .shuffle = false, .drop_last = false, .normalize = norm};
  d.train = std::make_unique<BatchLoader>(data.train, train_idx,
                                          BatchLoader::Options{.batch = o.batch, .shuffle = true, .drop_last = true,
                                                               .seed = o.seed, .normalize = norm, .augment = o.augment});
  d.test = std::make_unique<BatchLoader>(data.test, first_n(data.test.n, o.limit_test), eval);
  if (!val_idx.empty()) d.val = std::make_unique<BatchLoader>(data.train, val_idx, eval);
  return d;
}

Dataset open_arrays(const ArraySources& a, const DataOptions& o) {
  Dataset d;
  d.classes = a.classes;
  d.tokens = a.ids;
  d.train_arrays = std::make_shared<ArraySet>(load_arrays(a.x, a.y, a.sample, a.ids, a.labels, a.classes));
  const ArraySet& train = *d.train_arrays;
  d.sample_labels = train.y_per;
  std::vector<int64_t> train_idx = first_n(train.n, o.limit_train), val_idx;
  hold_out(train_idx, val_idx, o);
  d.train_samples = static_cast<int64_t>(train_idx.size());
  d.describe = std::to_string(train_idx.size()) + " training samples from " + a.x;
  d.train = std::make_unique<ArrayBatches>(train, train_idx, o.batch, true, o.seed);
  if (!val_idx.empty()) d.val = std::make_unique<ArrayBatches>(train, val_idx, o.batch, false, o.seed);
  if (!a.test_x.empty()) {
    d.test_arrays = std::make_shared<ArraySet>(load_arrays(a.test_x, a.test_y, a.sample, a.ids, a.labels, a.classes));
    d.test = std::make_unique<ArrayBatches>(*d.test_arrays, first_n(d.test_arrays->n, o.limit_test), o.batch, false,
                                            o.seed);
  }
  if (!d.val && !d.test)
    fail(a.x, ": nothing to evaluate on: give data.arrays its test_x and test_y, or data.val_split");
  return d;
}

Dataset open_tokens(const std::string& dir, int64_t block, const DataOptions& o) {
  namespace fs = std::filesystem;
  const std::string train = (fs::path(dir) / "train.tok").string(), val = (fs::path(dir) / "val.tok").string();
  if (!fs::exists(train) || !fs::exists(val))
    fail(dir, ": no train.tok and val.tok here; make them from text with `seam tokenize FILE... --out ", dir,
         "` (docs/data.md)");
  Dataset d;
  d.tokens = true;
  d.sample_labels = block;
  d.train_tokens = std::make_shared<TokenFile>(read_tokens(train));
  d.val_tokens = std::make_shared<TokenFile>(read_tokens(val));
  // The ids the corpus holds, which a model must cover (its files' vocabularies may be
  // wider: a byte-level file of ASCII text holds no id above 127).
  for (const TokenFile* f : {d.train_tokens.get(), d.val_tokens.get()})
    for (uint16_t t : f->tokens) d.classes = std::max<int64_t>(d.classes, int64_t{t} + 1);
  auto tr = std::make_unique<TokenBatches>(*d.train_tokens, o.batch, block, true, o.seed, train);
  auto va = std::make_unique<TokenBatches>(*d.val_tokens, o.batch, block, false, o.seed, val);
  d.train_samples = tr->samples();
  d.describe = std::to_string(d.train_tokens->tokens.size()) + " training tokens from " + train;
  d.train = std::move(tr);
  d.val = std::move(va);
  return d;
}

}  // namespace seam::data
