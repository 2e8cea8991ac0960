// The batch loader: seeded order, padding of the last batch, and train-time augmentation
// (random crops of the padded image, left-right flips) that is a function of the seed,
// the epoch and the position, so that resumed runs see the same images.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "data/dataset.h"
#include "data/fashion_mnist.h"
#include "data/shard.h"
#include "io/model_file.h"
#include "seam/error.h"

namespace seam::data {
namespace {

// Images whose every pixel is distinct within an image (so a crop's offset and a flip
// can be read back from the result) and whose label is their index.
ImageSet distinct_images(int64_t n, int64_t rows, int64_t cols) {
  ImageSet s{n, rows, cols, {}, {}};
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t p = 0; p < rows * cols; ++p) s.images.push_back(static_cast<uint8_t>(1 + (p * 7 + k) % 250));
    s.labels.push_back(static_cast<uint8_t>(k));
  }
  return s;
}

std::vector<int64_t> all(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(i);
  return v;
}

// The pixel values (0-255) of a served, normalized image.
std::vector<float> pixels(const Batch& b, int64_t row, int64_t px, const Normalize& nz) {
  std::vector<float> v;
  for (int64_t p = 0; p < px; ++p) v.push_back((b.x[static_cast<size_t>(row * px + p)] * nz.stddev + nz.mean) * 255.0f);
  return v;
}

// The transform (dy, dx, flip) within the padding that maps src to got, or none.
std::optional<std::tuple<int64_t, int64_t, bool>> transform_of(const std::vector<float>& got, const uint8_t* src,
                                                                int64_t rows, int64_t cols, int64_t pad) {
  for (int64_t oy = -pad; oy <= pad; ++oy)
    for (int64_t ox = -pad; ox <= pad; ++ox)
      for (bool flip : {false, true}) {
        bool same = true;
        for (int64_t y = 0; y < rows && same; ++y)
          for (int64_t x = 0; x < cols && same; ++x) {
            const int64_t sy = y + oy, sx = (flip ? cols - 1 - x : x) + ox;
            const float want = sy >= 0 && sy < rows && sx >= 0 && sx < cols ? src[sy * cols + sx] : 0.0f;
            same = std::abs(got[static_cast<size_t>(y * cols + x)] - want) < 1e-3f;
          }
        if (same) return std::tuple{oy, ox, flip};
      }
  return std::nullopt;
}

TEST(Loader, AugmentedImagesAreCropsAndFlipsOfTheirSourceAndCoverEveryOffset) {
  const int64_t n = 64, rows = 6, cols = 5, pad = 2;
  const ImageSet set = distinct_images(n, rows, cols);
  BatchLoader::Options o{.batch = 16, .shuffle = true, .drop_last = true, .seed = 3};
  o.augment = {.crop_padding = pad, .horizontal_flip = true};
  BatchLoader loader(set, all(n), o);
  std::set<std::tuple<int64_t, int64_t, bool>> seen;
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    loader.start_epoch(epoch);
    Batch b;
    while (loader.next(b))
      for (int64_t r = 0; r < b.rows; ++r) {
        const int64_t k = b.y[static_cast<size_t>(r)];
        const auto t = transform_of(pixels(b, r, rows * cols, o.normalize), set.images.data() + k * rows * cols, rows,
                                    cols, pad);
        ASSERT_TRUE(t) << "epoch " << epoch << " row " << r << ": not a crop or flip of image " << k;
        seen.insert(*t);
      }
  }
  // 256 draws over 5 x 5 offsets x 2 flips: every one of the 50 appears (a missing one
  // would mean a biased or clipped draw).
  EXPECT_EQ(seen.size(), 50u);
}

TEST(Loader, AugmentationDependsOnSeedEpochAndPositionOnly) {
  const ImageSet set = distinct_images(40, 8, 8);
  BatchLoader::Options o{.batch = 8, .shuffle = true, .drop_last = true, .seed = 5};
  o.augment = {.crop_padding = 3, .horizontal_flip = true};
  auto epoch_of = [&](const BatchLoader::Options& opt, int64_t epoch, int64_t first) {
    BatchLoader l(set, all(40), opt);
    l.start_epoch(epoch, first);
    std::vector<float> xs;
    Batch b;
    while (l.next(b)) xs.insert(xs.end(), b.x.begin(), b.x.end());
    return xs;
  };
  const auto a = epoch_of(o, 1, 0);
  EXPECT_EQ(a, epoch_of(o, 1, 0));
  // Resuming at batch 2 serves what batches 2.. were.
  const auto resumed = epoch_of(o, 1, 2);
  EXPECT_EQ(resumed, std::vector<float>(a.begin() + 2 * 8 * 64, a.end()));
  EXPECT_NE(a, epoch_of(o, 2, 0));
  BatchLoader::Options other = o;
  other.seed = 6;
  EXPECT_NE(a, epoch_of(other, 1, 0));
  // Without augmentation the images are served as they are.
  BatchLoader::Options plain = o;
  plain.augment = {};
  BatchLoader l(set, all(40), plain);
  l.start_epoch(0);
  Batch b;
  ASSERT_TRUE(l.next(b));
  const int64_t k = b.y[0];
  const auto got = pixels(b, 0, 64, plain.normalize);
  for (int64_t p = 0; p < 64; ++p) EXPECT_NEAR(got[static_cast<size_t>(p)], set.images[static_cast<size_t>(k * 64 + p)], 1e-3);
}

TEST(Loader, ANegativeCropPaddingIsRefused) {
  const ImageSet set = distinct_images(8, 4, 4);
  BatchLoader::Options o{.batch = 4};
  o.augment = {.crop_padding = -1};
  try {
    BatchLoader l(set, all(8), o);
    ADD_FAILURE() << "a negative crop padding was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("crop_padding must be >= 0, got -1"), std::string::npos) << e.what();
  }
}

TEST(Loader, ModelFileAugmentationIsCheckedAndNamed) {
  const std::string head = R"({"input": {"shape": [1, 28, 28]}, "layers": [{"op": "flatten"},
      {"op": "linear", "name": "fc", "out": 10}], )";
  const io::ModelSpec s =
      io::parse_model_json(head + R"("data": {"augment": {"crop_padding": 2, "horizontal_flip": true}}})", "m.json");
  EXPECT_EQ(s.crop_padding, 2);
  EXPECT_TRUE(s.horizontal_flip);
  auto error_of = [&](const std::string& data) {
    try {
      io::parse_model_json(head + data + "}", "m.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(R"("data": {"augment": {"crop_padding": -1}})").find("crop_padding must be >= 0"),
            std::string::npos);
  EXPECT_NE(error_of(R"("data": {"augment": {"flip": true}})").find("'flip'"), std::string::npos)
      << error_of(R"("data": {"augment": {"flip": true}})");
  const std::string flat = R"({"input": {"shape": [784]}, "layers": [{"op": "linear", "name": "fc", "out": 10}],
      "data": {"augment": {"horizontal_flip": true}}})";
  try {
    io::parse_model_json(flat, "flat.json");
    ADD_FAILURE() << "a flat input took an image augmentation";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[channels, height, width]"), std::string::npos) << e.what();
  }
}

TEST(Loader, RankShardsTogetherServeTheGlobalBatchesRowForRow) {
  // 4 ranks of a shuffled, augmented training split (batch 16) and of an evaluation split
  // whose last batch ends in padding (50 images in batches of 16): for every batch, the
  // ranks' rows in rank order are the single loader's rows, inputs and labels, and the
  // real rows add up.
  const int64_t n = 50, rows = 6, cols = 5, world = 4;
  const ImageSet set = distinct_images(n, rows, cols);
  for (bool train : {true, false}) {
    SCOPED_TRACE(train ? "training" : "evaluation");
    BatchLoader::Options o{.batch = 16, .shuffle = train, .drop_last = train, .seed = 9};
    if (train) o.augment = {.crop_padding = 1, .horizontal_flip = true};
    BatchLoader whole(set, all(n), o);
    std::vector<std::unique_ptr<RankShard>> ranks;
    for (int r = 0; r < world; ++r)
      ranks.push_back(std::make_unique<RankShard>(std::make_unique<BatchLoader>(set, all(n), o), 16, r, world));
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      whole.start_epoch(epoch);
      for (auto& s : ranks) s->start_epoch(epoch);
      Batch want, part;
      int64_t batches = 0;
      while (whole.next(want)) {
        Batch got;
        for (auto& s : ranks) {
          ASSERT_TRUE(s->next(part));
          EXPECT_EQ(part.index, want.index);
          EXPECT_EQ(part.y.size(), 4u);
          got.x.insert(got.x.end(), part.x.begin(), part.x.end());
          got.y.insert(got.y.end(), part.y.begin(), part.y.end());
          got.rows += part.rows;
        }
        EXPECT_EQ(got.x, want.x) << "batch " << want.index;
        EXPECT_EQ(got.y, want.y) << "batch " << want.index;
        EXPECT_EQ(got.rows, want.rows) << "batch " << want.index;
        ++batches;
      }
      for (auto& s : ranks) EXPECT_FALSE(s->next(part));
      EXPECT_EQ(batches, train ? 3 : 4);
    }
  }
  EXPECT_THROW(RankShard(std::make_unique<BatchLoader>(set, all(n), BatchLoader::Options{.batch = 10}), 10, 0, 4),
               Error);
  EXPECT_THROW(RankShard(std::make_unique<BatchLoader>(set, all(n), BatchLoader::Options{.batch = 8}), 8, 4, 4),
               Error);
}

// A split may still be reading its data on a thread until its destructor joins it, so a
// Dataset's data outlives its splits: every split sees its data alive when it is
// destroyed. With a loader mid-epoch, the sanitized suite also sees no read of freed
// images.
TEST(Loader, ADatasetsSplitsGoBeforeTheDataTheyRead) {
  struct Watch : Split {
    std::weak_ptr<ImageData> data;
    bool* alive;
    Watch(std::weak_ptr<ImageData> d, bool* a) : data(std::move(d)), alive(a) {}
    ~Watch() override { *alive = !data.expired(); }
    int64_t batches_per_epoch() const override { return 0; }
    void start_epoch(int64_t, int64_t) override {}
    bool next(Batch&) override { return false; }
  };
  bool train_alive = false, val_alive = false;
  {
    Dataset d;
    d.images = std::make_shared<ImageData>();
    d.images->train = distinct_images(2048, 28, 28);
    BatchLoader::Options o;
    o.batch = 1024;
    o.augment.crop_padding = 4, o.augment.horizontal_flip = true;
    auto loader = std::make_unique<BatchLoader>(d.images->train, all(2048), o);
    loader->start_epoch(0);  // its thread fills batches while d is destroyed
    d.test = std::move(loader);
    d.train = std::make_unique<Watch>(d.images, &train_alive);
    d.val = std::make_unique<Watch>(d.images, &val_alive);
  }
  EXPECT_TRUE(train_alive);
  EXPECT_TRUE(val_alive);
}

}  // namespace
}  // namespace seam::data
