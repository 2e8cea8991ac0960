// Samples from .npy arrays (src/data/arrays.h).
#include "data/arrays.h"

#include <algorithm>
#include <cstring>

#include "io/npy.h"
#include "seam/error.h"

namespace seam::data {

namespace {

std::string dims_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// The file's values as i32, each checked to fit (int64 files are read into i32 already).
std::vector<int32_t> as_ints(const HostTensor& t, const std::string& path) {
  std::vector<int32_t> v(static_cast<size_t>(t.type.numel()));
  if (t.type.dtype == DType::i32) {
    std::memcpy(v.data(), t.data.data(), v.size() * sizeof(int32_t));
  } else if (t.type.dtype == DType::u8) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(t.data[i]);
  } else {
    fail(path, ": holds ", dtype_name(t.type.dtype), "; labels and token ids are integers");
  }
  return v;
}

std::vector<float> as_floats(const HostTensor& t, const std::string& path) {
  std::vector<float> v(static_cast<size_t>(t.type.numel()));
  if (t.type.dtype == DType::f32) {
    std::memcpy(v.data(), t.data.data(), v.size() * sizeof(float));
  } else if (t.type.dtype == DType::f64) {
    const auto* d = reinterpret_cast<const double*>(t.data.data());
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(d[i]);
  } else {
    fail(path, ": holds ", dtype_name(t.type.dtype), "; the model takes float samples (float32 or float64)");
  }
  return v;
}

// The array's shape less its first dim must be `want` (or hold as many values, for a
// sample given flat).
int64_t check_rows(const HostTensor& t, const std::string& path, const std::vector<int64_t>& want, const char* what) {
  const Shape& s = t.type.shape;
  int64_t per = 1, want_per = 1;
  for (int64_t d : want) want_per *= d;
  for (size_t i = 1; i < s.size(); ++i) per *= s[i];
  if (s.empty() || per != want_per)
    fail(path, ": holds ", t.type.str(), "; ", what, " must be [N", want.empty() ? "]" : ", " + dims_str(want).substr(1));
  return s[0];
}

}  // namespace

ArraySet load_arrays(const std::string& x_path, const std::string& y_path, const std::vector<int64_t>& sample,
                     bool ids, const std::vector<int64_t>& labels, int64_t classes) {
  const HostTensor x = io::read_npy(x_path), y = io::read_npy(y_path);
  ArraySet a;
  a.n = check_rows(x, x_path, sample, "the samples");
  const int64_t ny = check_rows(y, y_path, labels, "the labels");
  if (ny != a.n) fail(y_path, ": holds ", ny, " labels but ", x_path, " holds ", a.n, " samples");
  if (a.n == 0) fail(x_path, ": holds no samples");
  a.x_per = x.type.numel() / a.n;
  a.y_per = y.type.numel() / a.n;
  if (ids) a.ids = as_ints(x, x_path);
  else a.x = as_floats(x, x_path);
  a.y = as_ints(y, y_path);
  for (size_t i = 0; i < a.y.size(); ++i)
    if (a.y[i] != -100 && (a.y[i] < 0 || a.y[i] >= classes))
      fail(y_path, ": label ", a.y[i], " at ", i, " is not a class id in [0, ", classes, ") nor -100 (ignored)");
  for (size_t i = 0; i < a.ids.size(); ++i)
    if (a.ids[i] < 0) fail(x_path, ": token id ", a.ids[i], " at ", i, " is negative");
  return a;
}

ArrayBatches::ArrayBatches(const ArraySet& set, std::vector<int64_t> indices, int64_t batch, bool train,
                           uint64_t seed, int32_t pad_label)
    : set_(set), indices_(std::move(indices)), batch_(batch), train_(train), seed_(seed), pad_(pad_label) {
  if (batch_ < 1) fail("batch size must be >= 1, got ", batch_);
  if (train_ && samples() < batch_)
    fail("a batch of ", batch_, " needs at least that many samples; this split has ", samples());
}

int64_t ArrayBatches::batches_per_epoch() const {
  return train_ ? samples() / batch_ : (samples() + batch_ - 1) / batch_;
}

void ArrayBatches::start_epoch(int64_t epoch, int64_t first) {
  if (train_) {
    order_ = permutation(samples(), seed_, static_cast<uint64_t>(epoch));
  } else {
    order_.resize(indices_.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int64_t>(i);
  }
  next_ = first;
}

bool ArrayBatches::next(Batch& out) {
  if (next_ >= batches_per_epoch()) return false;
  const int64_t begin = next_ * batch_, rows = std::min(batch_, samples() - begin);
  const bool ids = !set_.ids.empty();
  const auto xp = static_cast<size_t>(set_.x_per), yp = static_cast<size_t>(set_.y_per);
  const auto B = static_cast<size_t>(batch_);
  out.x.assign(ids ? 0 : B * xp, 0.0f);
  out.ids.assign(ids ? B * xp : 0, 0);
  out.y.assign(B * yp, pad_);
  out.rows = rows;
  out.index = next_;
  for (int64_t r = 0; r < rows; ++r) {
    const auto k = static_cast<size_t>(indices_[static_cast<size_t>(order_[static_cast<size_t>(begin + r)])]);
    const auto row = static_cast<size_t>(r);
    if (ids) std::copy_n(set_.ids.begin() + static_cast<std::ptrdiff_t>(k * xp), xp, out.ids.begin() + static_cast<std::ptrdiff_t>(row * xp));
    else std::copy_n(set_.x.begin() + static_cast<std::ptrdiff_t>(k * xp), xp, out.x.begin() + static_cast<std::ptrdiff_t>(row * xp));
    std::copy_n(set_.y.begin() + static_cast<std::ptrdiff_t>(k * yp), yp, out.y.begin() + static_cast<std::ptrdiff_t>(row * yp));
  }
  ++next_;
  return true;
}

}  // namespace seam::data
