// The data a model file trains on, whatever its source: Fashion-MNIST-style images (IDX
// files) or a corpus of token files (train.tok, val.tok; src/data/tokens.h), opened as a
// training split in a seeded order and evaluation splits served in order, padded so that
// every sample counts once.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "data/arrays.h"
#include "data/fashion_mnist.h"
#include "data/tokens.h"

namespace seam::data {

// Token windows as batches. Training: each epoch is as many windows as the corpus has
// tokens (count - 1) / (batch * T) batches, each drawn by TokenWindows at step
// epoch * batches_per_epoch + index, so a resumed run sees the same windows. Evaluation:
// the corpus cut into consecutive windows of T, each token predicted once; the last
// window's missing targets, and the rows of the last batch past the corpus, carry
// `pad_label` (the loss leaves them out). Batches are cheap to make (B * T copies), so
// they are made when asked for.
class TokenBatches : public Split {
 public:
  TokenBatches(const TokenFile& f, int64_t batch, int64_t block, bool train, uint64_t seed, const std::string& what,
               int32_t pad_label = -100);
  int64_t batches_per_epoch() const override;
  void start_epoch(int64_t epoch, int64_t first = 0) override;
  bool next(Batch& out) override;
  // Training windows in an epoch, or evaluation windows in all.
  int64_t samples() const;

 private:
  const TokenFile& f_;
  TokenWindows windows_;
  bool train_;
  int32_t pad_;
  int64_t epoch_ = 0, next_ = 0;
};

struct Dataset {
  std::string describe;  // for the run's first line
  int64_t classes = 0;   // images: their classes; tokens: 1 + the largest id in the files
  int64_t sample_labels = 1;  // labels a sample carries: 1 (an image) or T (a window)
  bool tokens = false;
  int64_t train_samples = 0;  // what a checkpoint is checked against
  // The data the splits read, declared first so that it outlives them: a split's
  // destructor joins the thread that may still be reading it.
  std::shared_ptr<ImageData> images;
  std::shared_ptr<TokenFile> train_tokens, val_tokens;
  std::shared_ptr<ArraySet> train_arrays, test_arrays;
  std::unique_ptr<Split> train, val, test;  // val or test may be absent
};

struct DataOptions {
  int64_t batch = 128;
  uint64_t seed = 0;
  // Images: a share of the training images held out as the validation split, the first
  // N training and test images only (0: all), and train-time augmentation.
  double val_split = 0;
  int64_t limit_train = 0, limit_test = 0;
  Augment augment;
};

// The four IDX files of `dir`; normalized by the training images' own mean and standard
// deviation.
Dataset open_images(const std::string& dir, const DataOptions& o);
// Arrays from .npy files (src/data/arrays.h): x and y for training (a val_split held out
// of them as for images), test_x and test_y, when given, for the test split.
struct ArraySources {
  std::string x, y, test_x, test_y;
  std::vector<int64_t> sample, labels;  // per sample: the input's shape and the labels'
  bool ids = false;                     // x holds token ids
  int64_t classes = 0;
};
Dataset open_arrays(const ArraySources& a, const DataOptions& o);
// dir/train.tok and dir/val.tok, as windows of `block` tokens. Fails naming the folder
// and the command that makes the files when they are missing.
Dataset open_tokens(const std::string& dir, int64_t block, const DataOptions& o);

}  // namespace seam::data
