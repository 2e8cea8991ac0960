#include "data/shard.h"

#include <algorithm>

#include "seam/error.h"

namespace seam::data {

namespace {

// Rows [begin, end) of a batch's rows of `per` values each.
template <class T>
void take_rows(const std::vector<T>& all, int64_t batch, int64_t begin, int64_t end, std::vector<T>& out,
               const char* what) {
  if (all.empty()) return out.clear();
  if (static_cast<int64_t>(all.size()) % batch)
    fail("rank shard: a batch's ", what, " holds ", all.size(), " values, not a whole number of its ", batch, " rows");
  const int64_t per = static_cast<int64_t>(all.size()) / batch;
  out.assign(all.begin() + begin * per, all.begin() + end * per);
}

}  // namespace

RankShard::RankShard(std::unique_ptr<Split> global, int64_t global_batch, int rank, int world)
    : global_(std::move(global)), batch_(global_batch), rank_(rank), world_(world) {
  if (world < 1 || rank < 0 || rank >= world) fail("rank shard: rank ", rank, " of ", world);
  if (global_batch < 1 || global_batch % world)
    fail("rank shard: the batch of ", global_batch, " does not divide among ", world,
         " ranks (each rank's step takes the same number of rows)");
}

bool RankShard::next(Batch& out) {
  if (!global_->next(whole_)) return false;
  const int64_t per = batch_ / world_, begin = rank_ * per, end = begin + per;
  take_rows(whole_.x, batch_, begin, end, out.x, "inputs");
  take_rows(whole_.ids, batch_, begin, end, out.ids, "token ids");
  take_rows(whole_.y, batch_, begin, end, out.y, "labels");
  out.rows = std::clamp<int64_t>(whole_.rows - begin, 0, per);
  out.index = whole_.index;
  return true;
}

}  // namespace seam::data
