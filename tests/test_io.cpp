// Reading and writing files: sizes from a file's header can neither overflow nor make a
// reader allocate more than the file holds, and checkpoints are replaced atomically and
// durably, whatever fails and however many writers race.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <span>
#include <sstream>
#include <thread>

#include "common/file.h"
#include "data/idx.h"
#include "bench/bench.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "seam/dtype.h"
#include "seam/error.h"

namespace fs = std::filesystem;

// The largest single allocation this thread may make, 0 for no limit. Replacing the
// global operator new is how a test sees that a reader sized its buffer by the data that
// arrived rather than by what a header promised: a promise of gigabytes fails here at
// once instead of exhausting the machine.
namespace {
thread_local size_t g_alloc_cap = 0;
}

// GCC sees malloc's memory freed through operator delete and warns, not knowing both are
// replaced together.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  if (g_alloc_cap != 0 && n > g_alloc_cap) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace {

struct AllocationCap {
  explicit AllocationCap(size_t bytes) { g_alloc_cap = bytes; }
  ~AllocationCap() { g_alloc_cap = 0; }
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The message of the seam::Error that f throws; fails the test if it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const seam::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no seam::Error thrown";
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (part) << "' not in: " << (text)

class Io : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("seam_io_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir, ec);
  }

  // Files under dir whose names say they are temporaries of an atomic write.
  std::vector<std::string> temporaries() const {
    std::vector<std::string> r;
    for (auto& e : fs::recursive_directory_iterator(dir))
      if (e.path().filename().string().find(".tmp") != std::string::npos) r.push_back(e.path().string());
    return r;
  }

  // An uncompressed IDX file of unsigned bytes: the header, then `data`.
  fs::path write_plain_idx(const std::string& name, const std::vector<uint32_t>& dims, const std::string& data) {
    std::string b{'\0', '\0', '\x08', static_cast<char>(dims.size())};
    for (uint32_t d : dims)
      for (int s = 24; s >= 0; s -= 8) b += static_cast<char>(d >> s);
    std::ofstream(dir / name, std::ios::binary) << b << data;
    return dir / name;
  }

  // A safetensors file with the given JSON header and `data` bytes after it.
  fs::path write_raw_safetensors(const std::string& name, std::string header, const std::string& data) {
    header.append((8 - header.size() % 8) % 8, ' ');
    std::string len(8, '\0');
    for (int i = 0; i < 8; ++i) len[static_cast<size_t>(i)] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
    std::ofstream(dir / name, std::ios::binary) << len << header << data;
    return dir / name;
  }
};

seam::HostTensor tensor(const std::string& name, seam::TensorType type, std::byte fill) {
  seam::HostTensor t;
  t.name = name;
  t.type = std::move(type);
  t.data.assign(t.type.bytes(), fill);
  return t;
}

seam::io::TensorFile one_tensor(const std::string& writer, size_t n, char fill) {
  seam::io::TensorFile f;
  f.metadata["writer"] = writer;
  f.tensors.push_back(tensor("w", {seam::DType::u8, {static_cast<int64_t>(n)}}, std::byte(fill)));
  return f;
}

// ---- sizes read from files ----

TEST_F(Io, IdxRoundTripsPlainAndGzipAcrossManyReads) {
  std::vector<uint8_t> px(3 * 300 * 400);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 7);
  seam::data::write_idx_gz((dir / "a.gz").string(), {3, 300, 400}, px);
  auto a = seam::data::read_idx((dir / "a.gz").string(), 3);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{3, 300, 400}));
  EXPECT_EQ(a.bytes, px);
  auto b = seam::data::read_idx(write_plain_idx("b", {3, 300, 400}, std::string(px.begin(), px.end())).string(), 3);
  EXPECT_EQ(b.bytes, px);
}

TEST_F(Io, IdxRejectsDimsWhoseProductOverflows) {
  // 2^28 * 2^28 * 2^8 is 2^64: unchecked, it wraps to 0 and an empty file passes.
  const std::string gz = (dir / "wrap.gz").string();
  seam::data::write_idx_gz(gz, {1 << 28, 1 << 28, 1 << 8}, {});
  std::string e = error_of([&] { seam::data::read_idx(gz, 3); });
  EXPECT_HAS(e, gz);
  EXPECT_HAS(e, "[268435456,268435456,256]");
  EXPECT_HAS(e, "64 bits");
  const std::string plain = write_plain_idx("wrap", {1 << 28, 1 << 28, 1 << 8}, "").string();
  EXPECT_HAS(error_of([&] { seam::data::read_idx(plain, 3); }), "64 bits");
}

TEST_F(Io, IdxHeaderAloneAllocatesNoMoreThanTheFileHolds) {
  // The header promises 16 GiB; the file holds 100 bytes.
  AllocationCap cap(1 << 20);
  const std::string plain = write_plain_idx("big", {1 << 14, 1 << 10, 1 << 10}, std::string(100, 'x')).string();
  std::string e = error_of([&] { seam::data::read_idx(plain, 3); });
  EXPECT_HAS(e, plain);
  EXPECT_HAS(e, "truncated: the header promises 17179869184 bytes of data, the file holds 100");
  const std::string gz = (dir / "big.gz").string();
  seam::data::write_idx_gz(gz, {1 << 14, 1 << 10, 1 << 10}, std::vector<uint8_t>(100, 1));
  e = error_of([&] { seam::data::read_idx(gz, 3); });
  EXPECT_HAS(e, gz);
  EXPECT_HAS(e, "the file holds 100");
}

TEST_F(Io, NumelAndBytesThrowNamingAShapeThatOverflows) {
  EXPECT_EQ(seam::numel({}), 1);
  EXPECT_EQ(seam::numel({3, 4}), 12);
  EXPECT_HAS(error_of([] { seam::numel({int64_t{1} << 32, int64_t{1} << 32}); }), "[4294967296,4294967296]");
  EXPECT_HAS(error_of([] { seam::numel({2, -3}); }), "[2,-3] has a negative dimension");
  // The count fits in int64, the byte size does not fit in size_t.
  seam::TensorType t{seam::DType::f32, {int64_t{1} << 62}};
  EXPECT_HAS(error_of([&] { (void)t.bytes(); }), "f32[4611686018427387904]");
  EXPECT_FALSE(t.checked_bytes());
  EXPECT_EQ(seam::checked_numel({int64_t{1} << 31, int64_t{1} << 31}).value_or(-1), int64_t{1} << 62);
}

TEST_F(Io, SafetensorsRejectsAShapeWhoseBytesOverflow) {
  // Unchecked, [2^62, 4] wraps to 0 elements and matches empty data_offsets.
  for (const char* shape : {"[4611686018427387904, 4]", "[4611686018427387904]"}) {
    const std::string p = write_raw_safetensors(
        "wrap.safetensors", std::string(R"({"w": {"dtype": "F32", "shape": )") + shape + R"(, "data_offsets": [0, 0]}})", "").string();
    std::string e = error_of([&] { seam::io::read_safetensors(p); });
    EXPECT_HAS(e, p);
    EXPECT_HAS(e, "tensor 'w'");
    EXPECT_HAS(e, "64 bits");
  }
}

TEST_F(Io, SafetensorsRejectsLengthsAndOffsetsOutsideTheFile) {
  std::string len(8, '\xff');
  std::ofstream(dir / "len.safetensors", std::ios::binary) << len << "{}";
  EXPECT_HAS(error_of([&] { seam::io::read_safetensors((dir / "len.safetensors").string()); }), "exceeds the file");
  const std::string p = write_raw_safetensors(
      "off.safetensors", R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [18446744073709551612, 0]}})", "abcd").string();
  EXPECT_HAS(error_of([&] { seam::io::read_safetensors(p); }), "outside the 4 data bytes");
  const std::string q = write_raw_safetensors(
      "neg.safetensors", R"({"w": {"dtype": "U8", "shape": [-4], "data_offsets": [0, 4]}})", "abcd").string();
  EXPECT_HAS(error_of([&] { seam::io::read_safetensors(q); }), "bad shape");
}

TEST_F(Io, ModelFileRejectsShapesWhoseBytesOverflow) {
  auto model = [](const std::string& input, const std::string& out) {
    return R"({"input": {"shape": )" + input + R"(}, "layers": [{"op": "linear", "name": "fc1", "out": )" + out +
           R"(}, {"op": "linear", "out": 10}]})";
  };
  std::string e = error_of([&] { seam::io::parse_model_json(model("[65536, 65536, 65536, 65536]", "8"), "big.json"); });
  EXPECT_HAS(e, "big.json: input.shape [65536,65536,65536,65536]");
  EXPECT_HAS(e, "fit in 64 bits");
  e = error_of([&] { seam::io::parse_model_json(model("[784]", "4611686018427387904"), "wide.json"); });
  EXPECT_HAS(e, "wide.json: layer 0 ('fc1') linear");
  EXPECT_HAS(e, "fit in 64 bits");
  // A reshape's known dims multiply past 64 bits (they wrapped to 0, then divided by it).
  e = error_of([&] {
    seam::io::parse_model_json(
        R"({"input": {"shape": [16]}, "layers": [{"op": "reshape", "shape": [-1, 4294967296, 4294967296]}]})",
        "reshape.json");
  });
  EXPECT_HAS(e, "reshape.json: layer 0");
  EXPECT_HAS(e, "fit in 64 bits");
}

// ---- atomic, durable writes ----

TEST_F(Io, CheckpointRoundTripKeepsTensorsAndMetadata) {
  seam::io::TensorFile f = one_tensor("a", 1000, 'a');
  f.tensors.push_back(tensor("v", {seam::DType::f32, {2, 3}}, std::byte{7}));
  const std::string p = (dir / "ck.safetensors").string();
  seam::io::write_safetensors(p, f);
  seam::io::write_safetensors(p, f);  // replacing an existing file works the same
  auto r = seam::io::read_safetensors(p);
  EXPECT_EQ(r.metadata, f.metadata);
  ASSERT_EQ(r.tensors.size(), 2u);
  for (auto& t : f.tensors) {
    const seam::HostTensor* got = r.find(t.name);
    ASSERT_NE(got, nullptr) << t.name;
    EXPECT_EQ(got->type, t.type);
    EXPECT_EQ(got->data, t.data);
  }
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(Io, AtomicWriteIntoAMissingDirectoryNamesThePathAndLeavesNoTemporary) {
  const std::string p = (dir / "nowhere" / "ck.safetensors").string();
  std::string e = error_of([&] { seam::io::write_safetensors(p, one_tensor("a", 10, 'a')); });
  EXPECT_HAS(e, p);
  EXPECT_HAS(e, "No such file or directory");
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(Io, AtomicWriteBelowARegularFileFailsEvenForRoot) {
  std::ofstream(dir / "file") << "x";
  const std::string p = (dir / "file" / "ck.safetensors").string();
  std::string e = error_of([&] { seam::write_file_atomically(p, std::as_bytes(std::span("data", 4))); });
  EXPECT_HAS(e, p);
  EXPECT_HAS(e, "Not a directory");
  EXPECT_EQ(slurp(dir / "file"), "x");
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(Io, AtomicWriteIntoAReadOnlyDirectoryNamesThePath) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root, which may write into a read-only directory";
  fs::create_directories(dir / "ro");
  fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  const std::string p = (dir / "ro" / "ck.safetensors").string();
  std::string e = error_of([&] { seam::io::write_safetensors(p, one_tensor("a", 10, 'a')); });
  EXPECT_HAS(e, p);
  EXPECT_HAS(e, "Permission denied");
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(Io, AtomicWriteOverADirectoryRemovesItsTemporary) {
  // The temporary is written, then the rename fails: it must not be left behind.
  fs::create_directories(dir / "ck.safetensors" / "inside");
  const std::string p = (dir / "ck.safetensors").string();
  std::string e = error_of([&] { seam::io::write_safetensors(p, one_tensor("a", 10, 'a')); });
  EXPECT_HAS(e, p);
  EXPECT_TRUE(fs::is_directory(dir / "ck.safetensors" / "inside"));
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(Io, FailedWriteLeavesTheExistingCheckpointUntouched) {
  const std::string p = (dir / "ck.safetensors").string();
  seam::io::write_safetensors(p, one_tensor("old", 100, 'o'));
  const std::string old = slurp(p);
  // A disk that fills up mid-write: the file size limit applies to root too.
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* saved_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string e = error_of([&] { seam::io::write_safetensors(p, one_tensor("new", 1 << 20, 'n')); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, saved_handler);
  EXPECT_HAS(e, p);
  EXPECT_HAS(e, "File too large");
  EXPECT_EQ(slurp(p), old);
  EXPECT_TRUE(temporaries().empty());
  // A producer that gives up halfway leaves the file as it was too.
  EXPECT_THROW(seam::write_file_atomically(p,
                                           [](const seam::WriteBytes& put) {
                                             put(std::as_bytes(std::span("partial", 7)));
                                             throw std::runtime_error("stopped");
                                           }),
               std::runtime_error);
  EXPECT_EQ(slurp(p), old);
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(Io, TwoWritersNeverLeaveATornOrMixedCheckpoint) {
  const std::string p = (dir / "ck.safetensors").string();
  constexpr size_t kBytes = 256 << 10;
  seam::io::write_safetensors(p, one_tensor("a", kBytes, 'a'));
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::string first_failure;
  std::mutex m;
  auto record = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    if (failures++ == 0) first_failure = what;
  };
  // Each reading is whole and of one writer: its metadata and every data byte agree.
  auto check = [&](const seam::io::TensorFile& f) {
    const std::string w = f.metadata.count("writer") ? f.metadata.at("writer") : "?";
    if (f.tensors.size() != 1 || f.tensors[0].data.size() != kBytes || (w != "a" && w != "b")) return record("bad file of writer " + w);
    for (std::byte b : f.tensors[0].data)
      if (b != std::byte(w[0])) return record("data of writer " + w + " mixed with the other's");
  };
  auto writer = [&](char c) {
    const seam::io::TensorFile f = one_tensor(std::string(1, c), kBytes, c);
    try {
      for (int i = 0; i < 40; ++i) seam::io::write_safetensors(p, f);
    } catch (const std::exception& e) {
      record(e.what());
    }
  };
  std::thread reader([&] {
    while (!stop) {
      try {
        check(seam::io::read_safetensors(p));
      } catch (const std::exception& e) {
        record(e.what());
      }
    }
  });
  std::thread wa(writer, 'a'), wb(writer, 'b');
  wa.join();
  wb.join();
  stop = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0) << first_failure;
  // The final file is byte for byte what one of the two writers wrote.
  seam::io::write_safetensors((dir / "a.ref").string(), one_tensor("a", kBytes, 'a'));
  seam::io::write_safetensors((dir / "b.ref").string(), one_tensor("b", kBytes, 'b'));
  const std::string final_file = slurp(p);
  EXPECT_TRUE(final_file == slurp(dir / "a.ref") || final_file == slurp(dir / "b.ref"));
  EXPECT_TRUE(temporaries().empty());
}

}  // namespace

namespace seam {

// examples/resnet18_cifar.json (W5 of `seam bench`) is torchvision's resnet18 with 10
// classes: the same parameters under the same names and shapes, so that its weights map
// one to one onto PyTorch's state dict.
TEST(ModelFiles, Resnet18IsTorchvisionsResnet18) {
  const io::ModelSpec spec = io::parse_model_file(SEAM_EXAMPLES "/resnet18_cifar.json");
  EXPECT_EQ(spec.input_shape, (Shape{3, 32, 32}));
  EXPECT_EQ(spec.batch_size, 256);
  EXPECT_EQ(spec.optimizer.kind, OptimizerConfig::Kind::sgd);
  EXPECT_DOUBLE_EQ(spec.optimizer.momentum, 0.9);
  EXPECT_DOUBLE_EQ(spec.optimizer.weight_decay, 5e-4);
  const io::BuiltGraph b = io::build_graph(spec, 2);
  EXPECT_EQ(b.graph.value(b.logits).type.shape, (Shape{2, 10}));
  std::map<std::string, Shape> params;
  int64_t count = 0;
  for (ValueId id : b.graph.params()) {
    const Value& v = b.graph.value(id);
    params[v.name] = v.type.shape;
    count += v.type.numel();
  }
  EXPECT_EQ(count, 11181642);  // sum(p.numel() for p in resnet18(num_classes=10).parameters())
  EXPECT_EQ(params.size(), 62u);
  EXPECT_EQ(params["conv1.weight"], (Shape{64, 3, 7, 7}));
  EXPECT_EQ(params["layer1.0.conv1.weight"], (Shape{64, 64, 3, 3}));
  EXPECT_EQ(params["layer2.0.downsample.0.weight"], (Shape{128, 64, 1, 1}));
  EXPECT_EQ(params["layer2.0.downsample.1.weight"], (Shape{128}));
  EXPECT_EQ(params["layer4.1.bn2.bias"], (Shape{512}));
  EXPECT_EQ(params["fc.weight"], (Shape{10, 512}));
  EXPECT_EQ(params["fc.bias"], (Shape{10}));
  EXPECT_FALSE(params.count("conv1.bias"));  // torchvision's convolutions have no bias
  // `seam bench W5` runs this file as built into the binary.
  EXPECT_EQ(bench::resnet18_spec().json, spec.json);
}

}  // namespace seam

namespace seam {

// examples/fmnist_resnet.json: a residual CNN trained with augmentation.
TEST(ModelFiles, TheResidualFashionMnistExampleAugmentsItsTrainingImages) {
  const io::ModelSpec spec = io::parse_model_file(SEAM_EXAMPLES "/fmnist_resnet.json");
  EXPECT_EQ(spec.input_shape, (Shape{1, 28, 28}));
  EXPECT_EQ(spec.crop_padding, 2);
  EXPECT_TRUE(spec.horizontal_flip);
  const io::BuiltGraph b = io::build_graph(spec, 2);
  EXPECT_EQ(b.graph.value(b.logits).type.shape, (Shape{2, 10}));
  int adds = 0;
  for (const Node& n : b.graph.nodes()) adds += n.op == Op::add;
  EXPECT_EQ(adds, 6);  // one residual add per block
}

}  // namespace seam
