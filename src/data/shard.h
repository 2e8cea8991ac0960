// A rank's share of the data in a data-parallel run (src/dist).
#pragma once
#include <cstdint>
#include <memory>

#include "data/fashion_mnist.h"

namespace seam::data {

// Rank r of N's share of a split's batches: each global batch of B rows (the same batch
// on every rank: one seed, one order) gives rank r its rows [r B / N, (r + 1) B / N), and
// its padding rows where the batch ends in padding. Together the ranks see exactly the
// batches one process would see, so a data-parallel run can be held to a single-process
// run with the global batch. B must divide by N: every rank's step has one shape.
class RankShard : public Split {
 public:
  RankShard(std::unique_ptr<Split> global, int64_t global_batch, int rank, int world);
  int64_t batches_per_epoch() const override { return global_->batches_per_epoch(); }
  void start_epoch(int64_t epoch, int64_t first = 0) override { global_->start_epoch(epoch, first); }
  bool next(Batch& out) override;

 private:
  std::unique_ptr<Split> global_;
  int64_t batch_;
  int rank_, world_;
  Batch whole_;
};

}  // namespace seam::data
