// Samples held in NumPy arrays (data.arrays of a model file): x [N, sample...] and labels
// y [N] or [N, labels...], served as batches in a seeded order like the image loader's.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/fashion_mnist.h"

namespace seam::data {

// One split's arrays, checked against each other. x is f32 (float32 and float64 files)
// or i32 token ids (integer files); y is i32 class ids, each in [0, classes) or -100
// (left out of the loss and the accuracy).
struct ArraySet {
  int64_t n = 0;
  int64_t x_per = 0, y_per = 0;  // values a sample has of x and of y
  std::vector<float> x;
  std::vector<int32_t> ids;      // x when it holds token ids
  std::vector<int32_t> y;
};

// Reads x_path and y_path (.npy). `sample` and `ids` say what the model takes (its input
// shape less the batch dim, and whether it is token ids), `labels` the label shape a
// sample has (its logits' less the batch and class dims); `classes` bounds the labels.
ArraySet load_arrays(const std::string& x_path, const std::string& y_path, const std::vector<int64_t>& sample,
                     bool ids, const std::vector<int64_t>& labels, int64_t classes);

// Fixed-size batches of a subset of an ArraySet. Training shuffles each epoch by (seed,
// epoch) and drops the last partial batch; evaluation serves in order and pads the last
// batch with zeros labelled `pad_label`, so that every sample counts once.
class ArrayBatches : public Split {
 public:
  ArrayBatches(const ArraySet& set, std::vector<int64_t> indices, int64_t batch, bool train, uint64_t seed,
               int32_t pad_label = -100);
  int64_t batches_per_epoch() const override;
  void start_epoch(int64_t epoch, int64_t first = 0) override;
  bool next(Batch& out) override;
  int64_t samples() const { return static_cast<int64_t>(indices_.size()); }

 private:
  const ArraySet& set_;
  std::vector<int64_t> indices_, order_;
  int64_t batch_;
  bool train_;
  uint64_t seed_;
  int32_t pad_;
  int64_t next_ = 0;
};

}  // namespace seam::data
