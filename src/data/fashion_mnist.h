// Fashion-MNIST (or any MNIST-format image set) from its four IDX files, validated, and
// a batch loader that shuffles with a seed and prepares the next batch on a thread.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace seam::data {

struct ImageSet {
  int64_t n = 0, rows = 0, cols = 0;
  std::vector<uint8_t> images;  // n * rows * cols
  std::vector<uint8_t> labels;  // n, each < classes
  int64_t pixels() const { return rows * cols; }
};

struct ImageData {
  ImageSet train, test;
  int64_t classes = 10;
};

// The folder the Debian package dataset-fashion-mnist installs to.
const char* default_fashion_mnist_dir();

// Loads train-{images,labels}-idx?-ubyte.gz and t10k-* from `dir`. Throws seam::Error
// naming the file and the problem; a missing folder says how to install the data.
ImageData load_image_data(const std::string& dir, int64_t classes = 10);

// splitmix64: a tiny, portable generator for data order (std::shuffle's algorithm is
// not specified by the standard, so orders would differ between library versions).
uint64_t splitmix64(uint64_t& state);
// A draw in [0, n) from the next splitmix64 value.
uint64_t draw_below(uint64_t& state, uint64_t n);
// A permutation of [0, n) that depends only on (seed, stream).
std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t stream);

struct Normalize {
  float mean = 0.2860f, stddev = 0.3530f;  // Fashion-MNIST training-set statistics
};

// Train-time augmentation, as torchvision's RandomCrop(size, padding) and
// RandomHorizontalFlip(): each image is padded with `crop_padding` black pixels on every
// side and a window of its own size cut at a random offset, then mirrored left to right
// with probability 1/2. The draws are a function of (seed, epoch, position in the
// epoch), so a resumed run sees the same images.
struct Augment {
  int64_t crop_padding = 0;
  bool horizontal_flip = false;
  bool any() const { return crop_padding > 0 || horizontal_flip; }
};

struct Batch {
  std::vector<float> x;      // batch * pixels, normalized (images)
  std::vector<int32_t> ids;  // batch * T token ids (token windows; x is then empty)
  std::vector<int32_t> y;    // the labels (one a sample, or T); padding carries `pad_label`
  int64_t rows = 0;          // real rows (the rest is padding)
  int64_t index = 0;         // batch number within the epoch
};

// A stream of fixed-size batches, epoch by epoch: what the trainer reads, whatever the
// data (src/data/dataset.h).
class Split {
 public:
  virtual ~Split() = default;
  virtual int64_t batches_per_epoch() const = 0;
  // Starts serving epoch `epoch` from batch `first` (for resuming mid-epoch).
  virtual void start_epoch(int64_t epoch, int64_t first = 0) = 0;
  // The next batch of the epoch; false when the epoch is done.
  virtual bool next(Batch& out) = 0;
};

// Serves fixed-size batches of a subset of an ImageSet, in a seeded order per epoch, one
// batch ahead on a worker thread. The last partial batch is dropped (training) or
// padded with zero images labelled `pad_label` (evaluation, so every sample counts).
class BatchLoader : public Split {
 public:
  struct Options {
    int64_t batch = 128;
    bool shuffle = true;
    bool drop_last = true;
    uint64_t seed = 0;
    int32_t pad_label = -100;
    Normalize normalize;
    Augment augment;
  };
  BatchLoader(const ImageSet& set, std::vector<int64_t> indices, Options o);
  ~BatchLoader() override;
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  int64_t batches_per_epoch() const override;
  int64_t samples() const { return static_cast<int64_t>(indices_.size()); }
  void start_epoch(int64_t epoch, int64_t first = 0) override;
  bool next(Batch& out) override;

 private:
  void fill(Batch& b, const std::vector<int64_t>& order, int64_t epoch, int64_t index) const;
  void stop_worker();

  const ImageSet& set_;
  std::vector<int64_t> indices_;
  Options o_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  bool done_ = true, stop_ = false;
};

}  // namespace seam::data
