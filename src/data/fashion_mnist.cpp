// Loading and batching MNIST-format image data.
#include "data/fashion_mnist.h"

#include <algorithm>
#include <filesystem>

#include "data/idx.h"
#include "seam/error.h"

namespace seam::data {

const char* default_fashion_mnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

namespace {

ImageSet load_split(const std::string& dir, const std::string& prefix, int64_t classes) {
  std::string images = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  std::string labels = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  IdxArray im = read_idx(images, 3);
  IdxArray lb = read_idx(labels, 1);
  if (im.dims[0] != lb.dims[0])
    fail(images, " holds ", im.dims[0], " images but ", labels, " holds ", lb.dims[0], " labels");
  for (size_t i = 0; i < lb.bytes.size(); ++i)
    if (lb.bytes[i] >= classes) fail(labels, ": label ", int{lb.bytes[i]}, " of sample ", i, " is not below ", classes);
  return {im.dims[0], im.dims[1], im.dims[2], std::move(im.bytes), std::move(lb.bytes)};
}

}  // namespace

ImageData load_image_data(const std::string& dir, int64_t classes) {
  const char* files[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                         "t10k-labels-idx1-ubyte.gz"};
  for (const char* f : files)
    if (!std::filesystem::exists(dir + "/" + f))
      fail("Fashion-MNIST not found: ", dir, std::filesystem::is_directory(dir) ? " has no " + std::string(f) : " does not exist",
           ". Install it with `sudo apt-get install dataset-fashion-mnist` (files in ", default_fashion_mnist_dir(),
           "), or pass --data DIR with the four IDX files");
  ImageData d;
  d.classes = classes;
  d.train = load_split(dir, "train", classes);
  d.test = load_split(dir, "t10k", classes);
  if (d.train.rows != d.test.rows || d.train.cols != d.test.cols)
    fail(dir, ": train images are ", d.train.rows, "x", d.train.cols, ", test images ", d.test.rows, "x", d.test.cols);
  return d;
}

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t draw_below(uint64_t& state, uint64_t n) {
  // Multiply-shift maps a 64-bit draw to [0, n) without modulo bias worth noting here.
  return static_cast<uint64_t>((static_cast<unsigned __int128>(splitmix64(state)) * n) >> 64);
}

std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  uint64_t s = seed * 0xD1B54A32D192ED03ull + stream;
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(draw_below(s, static_cast<uint64_t>(i + 1)));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

BatchLoader::BatchLoader(const ImageSet& set, std::vector<int64_t> indices, Options o)
    : set_(set), indices_(std::move(indices)), o_(o) {
  if (o_.batch < 1) fail("batch size must be >= 1, got ", o_.batch);
  if (o_.augment.crop_padding < 0) fail("augment.crop_padding must be >= 0, got ", o_.augment.crop_padding);
  if (o_.drop_last && samples() < o_.batch)
    fail("a batch of ", o_.batch, " needs at least that many samples; this split has ", samples());
}

BatchLoader::~BatchLoader() { stop_worker(); }

int64_t BatchLoader::batches_per_epoch() const {
  return o_.drop_last ? samples() / o_.batch : (samples() + o_.batch - 1) / o_.batch;
}

void BatchLoader::stop_worker() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  stop_ = false;
}

namespace {

// One image through the augmentation: src (rows x cols, pixel values) into dst
// (normalized), with the draws of `state`. Pixels from the padding are black (0).
void augmented(const uint8_t* src, int64_t rows, int64_t cols, const Augment& a, uint64_t state, float scale,
               float shift, float* dst) {
  const int64_t span = 2 * a.crop_padding + 1;
  const auto draw = [&](int64_t n) { return static_cast<int64_t>(draw_below(state, static_cast<uint64_t>(n))); };
  // The window's top-left corner in the padded image, as an offset into the original.
  const int64_t oy = draw(span) - a.crop_padding, ox = draw(span) - a.crop_padding;
  const bool flip = a.horizontal_flip && draw(2) == 1;
  for (int64_t y = 0; y < rows; ++y)
    for (int64_t x = 0; x < cols; ++x) {
      const int64_t sy = y + oy, sx = (flip ? cols - 1 - x : x) + ox;
      const bool inside = sy >= 0 && sy < rows && sx >= 0 && sx < cols;
      dst[y * cols + x] = (inside ? static_cast<float>(src[sy * cols + sx]) : 0.0f) * scale - shift;
    }
}

}  // namespace

void BatchLoader::fill(Batch& b, const std::vector<int64_t>& order, int64_t epoch, int64_t index) const {
  const int64_t px = set_.pixels();
  const int64_t begin = index * o_.batch;
  const int64_t rows = std::min(o_.batch, samples() - begin);
  b.x.assign(static_cast<size_t>(o_.batch * px), 0.0f);
  b.y.assign(static_cast<size_t>(o_.batch), o_.pad_label);
  b.rows = rows;
  b.index = index;
  const float scale = 1.0f / (255.0f * o_.normalize.stddev), shift = o_.normalize.mean / o_.normalize.stddev;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t k = indices_[static_cast<size_t>(order[static_cast<size_t>(begin + r)])];
    const uint8_t* src = set_.images.data() + k * px;
    float* dst = b.x.data() + r * px;
    if (o_.augment.any()) {
      // A stream per (seed, epoch, position), apart from the shuffle's.
      uint64_t state = (o_.seed * 0xD1B54A32D192ED03ull + static_cast<uint64_t>(epoch)) * 0x9E3779B97F4A7C15ull +
                       static_cast<uint64_t>(begin + r) + 0xA5A5A5A5ull;
      augmented(src, set_.rows, set_.cols, o_.augment, state, scale, shift, dst);
    } else {
      for (int64_t p = 0; p < px; ++p) dst[p] = static_cast<float>(src[p]) * scale - shift;
    }
    b.y[static_cast<size_t>(r)] = set_.labels[static_cast<size_t>(k)];
  }
  // Padding rows are zeros in pixel space, like an empty image.
  for (int64_t r = rows; r < o_.batch; ++r)
    std::fill_n(b.x.data() + r * px, px, -shift);
}

void BatchLoader::start_epoch(int64_t epoch, int64_t first) {
  stop_worker();
  std::vector<int64_t> order;
  if (o_.shuffle) {
    order = permutation(samples(), o_.seed, static_cast<uint64_t>(epoch));
  } else {
    order.resize(indices_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    ready_.clear();
    done_ = false;
  }
  const int64_t total = batches_per_epoch();
  worker_ = std::thread([this, order = std::move(order), epoch, first, total] {
    for (int64_t i = first; i < total; ++i) {
      Batch b;
      fill(b, order, epoch, i);
      std::unique_lock<std::mutex> l(mu_);
      // Stay at most two batches ahead of the trainer.
      cv_.wait(l, [&] { return stop_ || ready_.size() < 2; });
      if (stop_) return;
      ready_.push_back(std::move(b));
      cv_.notify_all();
    }
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    cv_.notify_all();
  });
}

bool BatchLoader::next(Batch& out) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return !ready_.empty() || done_; });
  if (ready_.empty()) return false;
  out = std::move(ready_.front());
  ready_.pop_front();
  cv_.notify_all();
  return true;
}

}  // namespace seam::data
