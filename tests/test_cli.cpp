// The seam command line end to end: training on small IDX data sets written here,
// exact resume, eval reproducing the reported accuracy, and every error path: a clear
// message, a non-zero exit, and nothing overwritten.
#include <gtest/gtest.h>

#include <cmath>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_fixture.h"
#include "data/idx.h"
#include "dist/comm.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace {

using Result = seam::testing::CliResult;
using seam::testing::slurp;

class Cli : public seam::testing::CliTest {
 protected:
  // A small 28x28, 10-class image set whose classes are learnable: class c lights up
  // row band c, with noise.
  fs::path make_data(int train = 512, int test = 128) {
    fs::path d = dir / "data";
    fs::create_directories(d);
    std::mt19937 rng(3);
    auto make = [&](const std::string& prefix, int n) {
      std::vector<uint8_t> img(static_cast<size_t>(n) * 784), lab(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        int c = static_cast<int>(rng() % 10);
        lab[static_cast<size_t>(i)] = static_cast<uint8_t>(c);
        for (int p = 0; p < 784; ++p) {
          int row = p / 28, v = static_cast<int>(rng() % 80);
          if (row / 3 == c) v += 150;
          img[static_cast<size_t>(i) * 784 + static_cast<size_t>(p)] = static_cast<uint8_t>(std::min(v, 255));
        }
      }
      seam::data::write_idx_gz((d / (prefix + "-images-idx3-ubyte.gz")).string(), {n, 28, 28}, img);
      seam::data::write_idx_gz((d / (prefix + "-labels-idx1-ubyte.gz")).string(), {n}, lab);
    };
    make("train", train);
    make("t10k", test);
    return d;
  }

  fs::path write(const std::string& name, const std::string& text) {
    fs::path p = dir / name;
    std::ofstream(p) << text;
    return p;
  }

  static std::vector<nlohmann::json> json_lines(const std::string& out) {
    std::vector<nlohmann::json> r;
    std::istringstream s(out);
    for (std::string line; std::getline(s, line);)
      if (!line.empty()) r.push_back(nlohmann::json::parse(line));
    return r;
  }
};

const char* kSmallMlp = R"({
  "name": "small", "input": {"shape": [784]},
  "layers": [{"op": "linear", "name": "fc1", "out": 32}, {"op": "relu"}, {"op": "dropout", "p": 0.1},
             {"op": "linear", "name": "fc2", "out": 10}],
  "optimizer": {"type": "adam", "lr": 0.003, "schedule": {"type": "cosine", "warmup_steps": 3}},
  "batch_size": 32, "epochs": 2, "seed": 4
})";

const char* kSmallCnn = R"({
  "name": "small_cnn", "input": {"shape": [1, 28, 28]},
  "nodes": [
    {"name": "c1", "op": "conv2d", "inputs": ["x"], "out": 4, "kernel": 3, "padding": 1},
    {"name": "b1", "op": "batch_norm", "inputs": ["c1"]},
    {"name": "r1", "op": "relu", "inputs": ["b1"]},
    {"name": "c2", "op": "conv2d", "inputs": ["r1"], "out": 4, "kernel": 3, "padding": 1},
    {"name": "res", "op": "add", "inputs": ["c2", "r1"]},
    {"name": "p", "op": "max_pool2d", "inputs": ["res"], "kernel": 4},
    {"name": "f", "op": "flatten", "inputs": ["p"]},
    {"name": "out", "op": "linear", "inputs": ["f"], "out": 10}
  ],
  "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": true},
  "batch_size": 16, "epochs": 2, "seed": 2
})";

}  // namespace

TEST_F(Cli, TrainsEvaluatesAndEvalReproducesTheAccuracy) {
  fs::path data = make_data();
  fs::path model = write("small.json", kSmallMlp);
  Result r = run("train " + model.string() + " --data " + data.string() + " --out " + (dir / "run").string() + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto lines = json_lines(r.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["event"], "done");
  double acc = lines.back()["test_accuracy"];
  EXPECT_GT(acc, 0.9) << r.out;
  EXPECT_TRUE(fs::exists(dir / "run" / "metrics.csv"));
  std::string csv = slurp(dir / "run" / "metrics.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3) << csv;  // header + 2 epochs

  Result e = run("eval " + model.string() + " --checkpoint " + (dir / "run" / "checkpoint.safetensors").string() +
                 " --data " + data.string() + " --json");
  ASSERT_EQ(e.code, 0) << e.err;
  auto ej = nlohmann::json::parse(e.out);
  EXPECT_EQ(ej["accuracy"].get<double>(), acc);
  EXPECT_EQ(ej["samples"], 128);
  int64_t total = 0;
  for (auto& row : ej["confusion"])
    for (auto& v : row) total += v.get<int64_t>();
  EXPECT_EQ(total, 128);
  // Without a model file, eval uses the model stored in the checkpoint.
  Result e2 = run("eval --checkpoint " + (dir / "run" / "checkpoint.safetensors").string() + " --data " + data.string());
  ASSERT_EQ(e2.code, 0) << e2.err;
  EXPECT_NE(e2.out.find("confusion matrix"), std::string::npos);
}

TEST_F(Cli, ResumedRunGivesTheBitwiseSameLossCurve) {
  fs::path data = make_data();
  for (const char* spec : {kSmallMlp, kSmallCnn}) {
    fs::path model = write("model.json", spec);
    std::string common = " --data " + data.string() + " --json --log-every 4";
    Result whole = run("train " + model.string() + common + " --out " + (dir / "whole").string());
    ASSERT_EQ(whole.code, 0) << whole.err;
    // Stop mid-epoch, then resume twice (once across the epoch boundary).
    Result a = run("train " + model.string() + common + " --out " + (dir / "parts").string() + " --max-steps 7");
    ASSERT_EQ(a.code, 0) << a.err;
    EXPECT_NE(a.err.find("--resume"), std::string::npos);
    std::string ck = (dir / "parts" / "checkpoint.safetensors").string();
    Result b = run("train " + model.string() + common + " --out " + (dir / "parts").string() + " --resume " + ck + " --max-steps 20");
    ASSERT_EQ(b.code, 0) << b.err;
    Result c = run("train" + common + " --out " + (dir / "parts").string() + " --resume " + ck);
    ASSERT_EQ(c.code, 0) << c.err;
    auto steps = [](const std::vector<nlohmann::json>& lines) {
      std::vector<std::string> s;
      for (auto& l : lines)
        if (l["event"] == "step" || l["event"] == "epoch") {
          nlohmann::json k = l;
          k.erase("seconds");
          k.erase("samples_per_second");
          s.push_back(k.dump());
        }
      return s;
    };
    auto ref = steps(json_lines(whole.out));
    std::vector<std::string> parts;
    for (auto* r : {&a, &b, &c})
      for (auto& s : steps(json_lines(r->out))) parts.push_back(s);
    ASSERT_EQ(ref.size(), parts.size());
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(ref[i], parts[i]) << "line " << i;
    auto t1 = seam::io::read_safetensors((dir / "whole" / "checkpoint.safetensors").string());
    auto t2 = seam::io::read_safetensors(ck);
    ASSERT_EQ(t1.tensors.size(), t2.tensors.size());
    for (size_t i = 0; i < t1.tensors.size(); ++i) EXPECT_EQ(t1.tensors[i].data, t2.tensors[i].data) << t1.tensors[i].name;
    fs::remove_all(dir / "whole");
    fs::remove_all(dir / "parts");
  }
}

// The step events carry the gradient norm the update computed, before clipping: with
// clipping at a norm the steps exceed, above the clip, and finite.
TEST_F(Cli, StepEventsCarryTheGradientNorm) {
  fs::path data = make_data();
  const std::string common = " --data " + data.string() + " --json --log-every 1 --max-steps 3 --device cpu";
  std::string clipped = kSmallMlp;
  const std::string lr = R"("lr": 0.003)";
  clipped.replace(clipped.find(lr), lr.size(), lr + R"(, "clip_norm": 1e-3)");
  Result r = run("train " + write("clipped.json", clipped).string() + common + " --out " + (dir / "a").string());
  ASSERT_EQ(r.code, 0) << r.err;
  int steps = 0;
  for (auto& l : json_lines(r.out))
    if (l["event"] == "step") {
      ASSERT_TRUE(l.contains("grad_norm")) << l.dump();
      const double norm = l["grad_norm"].get<double>();
      EXPECT_TRUE(std::isfinite(norm) && norm > 1e-3) << l.dump();
      ++steps;
    }
  EXPECT_EQ(steps, 3);
  fs::remove_all(dir / "a");
}

// --deterministic (ModelOptions::deterministic) fixes the GPU's algorithm picks; the
// CPU's steps repeat their bits with or without it, and the model file can ask for it.
TEST_F(Cli, DeterministicRunsGiveTheCpusSameBits) {
  fs::path data = make_data();
  fs::path model = write("model.json", kSmallMlp);
  const std::string common = " --data " + data.string() + " --json --log-every 1 --max-steps 6 --device cpu";
  Result plain = run("train " + model.string() + common + " --out " + (dir / "a").string());
  Result fixed = run("train " + model.string() + common + " --deterministic --out " + (dir / "b").string());
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(fixed.code, 0) << fixed.err;
  const auto a = seam::io::read_safetensors((dir / "a" / "checkpoint.safetensors").string());
  const auto b = seam::io::read_safetensors((dir / "b" / "checkpoint.safetensors").string());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) EXPECT_EQ(a.tensors[i].data, b.tensors[i].data) << a.tensors[i].name;
  std::string with_key = kSmallMlp;
  with_key.insert(with_key.find('{') + 1, "\"deterministic\": \"yes\", ");
  Result bad = run("train " + write("bad.json", with_key).string() + common);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("deterministic"), std::string::npos) << bad.err;
}

// --memory-budget: the budget the step was planned to and what it takes are printed at
// the start; a budget below the model's own buffers stops the run before any step.
TEST_F(Cli, AMemoryBudgetIsReportedAndOneTooSmallRefused) {
  fs::path data = make_data();
  fs::path model = write("model.json", kSmallMlp);
  const std::string common = " --data " + data.string() + " --max-steps 2 --device cpu --out " + (dir / "b").string();
  Result roomy = run("train " + model.string() + common + " --memory-budget 1");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  EXPECT_NE(roomy.out.find("seam: memory budget 1024.00 MiB: the model's buffers and the arena take "), std::string::npos)
      << roomy.out;
  Result tight = run("train " + model.string() + common + " --memory-budget 0.000001");
  EXPECT_EQ(tight.code, 1);
  EXPECT_NE(tight.err.find("compile: memory budget of 1.05 KiB: the model's own buffers"), std::string::npos) << tight.err;
}

// `seam --version` names what runs the CPU GEMMs. OpenBLAS's generic SSE3 kernels
// ("Prescott", its fallback for a CPU model it does not know) never run on a CPU with
// AVX2 and FMA: seam restarts itself with the kernels the CPU supports.
TEST_F(Cli, VersionNamesTheGemmKernelsAndNeverTheGenericOnesOnAnAvx2Cpu) {
  Result r = run("--version");
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t line = r.out.find("CPU GEMMs: ");
  ASSERT_NE(line, std::string::npos) << r.out;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const std::string gemms = r.out.substr(line, r.out.find('\n', line) - line);
  if (gemms.find("OpenBLAS") != std::string::npos && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      !std::getenv("OPENBLAS_CORETYPE")) {
    EXPECT_EQ(gemms.find("Prescott"), std::string::npos) << gemms;
  }
#endif
}

TEST_F(Cli, PlanPrintsStepsMemoryAndFlops) {
  Result r = run(std::string("plan ") + SEAM_EXAMPLES "/fmnist_cnn.json --batch 32");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("(training step, batch 32, cpu, f32)"), std::string::npos) << r.out;  // the file's precision
  Result tf = run(std::string("plan ") + SEAM_EXAMPLES "/fmnist_cnn.json --batch 32 --precision tf32");
  ASSERT_EQ(tf.code, 0) << tf.err;
  EXPECT_NE(tf.out.find("(training step, batch 32, cpu, tf32)"), std::string::npos) << tf.out;
  for (const char* s : {"conv2d", "conv2d_grad_weight", "batch_norm_grad", "@arena+", "arena peak", "parameters:", "flops per step", "adamw"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  Result ops = run("ops");
  ASSERT_EQ(ops.code, 0);
  EXPECT_NE(ops.out.find("conv2d(x, w, b?; stride=[1,1], padding=[0,0], dilation=[1,1], groups=1, layout=\"nchw\", activation=\"none\") -> y"), std::string::npos);
}

namespace {
struct ErrorCase {
  const char* name;
  std::string model;      // model file text ("" = the small MLP)
  std::string expect[2];  // fragments the message must contain
};
}  // namespace

TEST_F(Cli, ModelFileErrorsNameThePlace) {
  fs::path data = make_data(64, 32);
  std::vector<ErrorCase> cases = {
      {"malformed JSON", "{\n  \"name\": \"m\",\n  \"input\": {\"shape\": [784]},,\n}", {"model.json:3:", "malformed JSON"}},
      {"unknown op", R"({"input": {"shape": [784]}, "layers": [{"op": "lineer", "out": 10}]})", {"unknown op 'lineer'", "'linear'"}},
      {"unknown attribute", R"({"input": {"shape": [1,28,28]}, "layers": [{"op": "max_pool2d", "kernal": 2}, {"op": "flatten"}, {"op": "linear", "out": 10}]})",
       {"unknown key 'kernal'", "'kernel'"}},
      {"unknown top-level key", R"({"input": {"shape": [784]}, "layer": []})", {"unknown key 'layer'", "'layers'"}},
      {"shape mismatch", R"({"input": {"shape": [784]}, "nodes": [{"name": "a", "op": "linear", "inputs": ["x"], "out": 20},
                              {"name": "b", "op": "linear", "inputs": ["x"], "out": 30}, {"name": "s", "op": "add", "inputs": ["a", "b"]}]})",
       {"'a/linear' f32[128,20]", "'b/linear' f32[128,30]"}},
      {"wrong output size", R"({"input": {"shape": [784]}, "layers": [{"op": "linear", "out": 7}]})", {"must be [batch, ..., classes]", "f32[128,7]"}},
      {"bad optimizer", R"({"input": {"shape": [784]}, "layers": [{"op": "linear", "out": 10}], "optimizer": {"type": "adam", "betas": [0.9, 1.5]}})",
       {"optimizer", "beta2"}},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    fs::path model = write("model.json", c.model);
    fs::path out = dir / "out";
    Result r = run("train " + model.string() + " --data " + data.string() + " --out " + out.string());
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("seam: error:"), std::string::npos) << r.err;
    for (auto& e : c.expect) EXPECT_NE(r.err.find(e), std::string::npos) << "missing '" << e << "' in: " << r.err;
    EXPECT_FALSE(fs::exists(out)) << "an error must not create outputs";
  }
}

TEST_F(Cli, DataErrorsSayWhatIsWrong) {
  fs::path model = write("small.json", kSmallMlp);
  Result missing = run("train " + model.string() + " --out " + (dir / "o").string() + " --data " + (dir / "nowhere").string());
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.err.find("does not exist"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("apt-get install dataset-fashion-mnist"), std::string::npos) << missing.err;

  fs::path data = make_data(64, 32);
  fs::path images = data / "train-images-idx3-ubyte.gz";
  std::string good = slurp(images);
  // Truncated: the gzip stream is cut in the middle of the pixel data.
  std::ofstream(images, std::ios::binary) << good.substr(0, good.size() / 2);
  Result trunc = run("train " + model.string() + " --data " + data.string() + " --out " + (dir / "o").string());
  EXPECT_NE(trunc.code, 0);
  EXPECT_NE(trunc.err.find("train-images-idx3-ubyte.gz"), std::string::npos) << trunc.err;
  // Wrong magic number: a labels file where images belong.
  fs::copy_file(data / "train-labels-idx1-ubyte.gz", images, fs::copy_options::overwrite_existing);
  Result magic = run("train " + model.string() + " --data " + data.string() + " --out " + (dir / "o").string());
  EXPECT_NE(magic.code, 0);
  EXPECT_NE(magic.err.find("dimensions, expected 3"), std::string::npos) << magic.err;
  // Not gzip, not IDX at all.
  std::ofstream(images, std::ios::binary) << "hello";
  Result junk = run("train " + model.string() + " --data " + data.string() + " --out " + (dir / "o").string());
  EXPECT_NE(junk.code, 0);
  EXPECT_NE(junk.err.find("not an IDX file"), std::string::npos) << junk.err;
  // Counts that disagree between images and labels.
  seam::data::write_idx_gz(images.string(), {63, 28, 28}, std::vector<uint8_t>(63 * 784, 1));
  Result count = run("train " + model.string() + " --data " + data.string() + " --out " + (dir / "o").string());
  EXPECT_NE(count.code, 0);
  EXPECT_NE(count.err.find("63 images but"), std::string::npos) << count.err;
  EXPECT_FALSE(fs::exists(dir / "o"));
}

TEST_F(Cli, CheckpointErrorsLeaveEverythingAsItWas) {
  fs::path data = make_data(64, 32);
  fs::path model = write("small.json", kSmallMlp);
  Result ok = run("train " + model.string() + " --data " + data.string() + " --out " + (dir / "run").string() + " --epochs 1 --quiet");
  ASSERT_EQ(ok.code, 0) << ok.err;
  fs::path ck = dir / "run" / "checkpoint.safetensors";
  const std::string good = slurp(ck), csv = slurp(dir / "run" / "metrics.csv");

  auto expect_fail = [&](const std::string& args, const std::string& fragment) {
    Result r = run(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.err.find(fragment), std::string::npos) << "missing '" << fragment << "' in: " << r.err;
  };
  fs::path bad = dir / "bad.safetensors";
  std::ofstream(bad, std::ios::binary) << good.substr(0, good.size() - 100);
  expect_fail("train --data " + data.string() + " --out " + (dir / "run").string() + " --resume " + bad.string(), "truncated");
  std::string flipped = good;
  flipped[8] = 'X';  // breaks the JSON header
  std::ofstream(bad, std::ios::binary) << flipped;
  expect_fail("eval --checkpoint " + bad.string() + " --data " + data.string(), "corrupt header");
  // A checkpoint of another model: the message names the tensor and both shapes.
  std::string other = kSmallMlp;
  other.replace(other.find("\"out\": 32"), 9, "\"out\": 16");
  fs::path other_model = write("other.json", other);
  expect_fail("train " + other_model.string() + " --data " + data.string() + " --out " + (dir / "run").string() + " --resume " + ck.string(),
              "fc1.weight");
  expect_fail("eval " + other_model.string() + " --checkpoint " + ck.string() + " --data " + data.string(), "f32[32,784]");
  // Nothing was overwritten by any failure.
  EXPECT_EQ(slurp(ck), good);
  EXPECT_EQ(slurp(dir / "run" / "metrics.csv"), csv);
}

// A disk that fills while a checkpoint is written (a file-size limit stands in for it:
// it needs no privileges): the run stops with an error naming the checkpoint, and the
// previous checkpoint is still there, whole, and resumes.
TEST_F(Cli, ADiskThatFillsDuringACheckpointKeepsThePreviousOne) {
  fs::path data = make_data(64, 32);
  fs::path model = write("small.json", kSmallMlp);
  const std::string out = " --data " + data.string() + " --out " + (dir / "run").string() + " --quiet";
  Result ok = run("train " + model.string() + out + " --epochs 1");
  ASSERT_EQ(ok.code, 0) << ok.err;
  fs::path ck = dir / "run" / "checkpoint.safetensors";
  const std::string good = slurp(ck);
  ASSERT_GT(good.size(), size_t{200} << 10);  // larger than the limit below, in either block size
  // /bin/sh's ulimit -f counts 512- or 1024-byte blocks: 128 of them are at most 128 KiB.
  const std::string limited = "sh -c 'ulimit -f 128 && exec " + std::string(SEAM_CLI_PATH) + " train --resume " + ck.string() +
                              out + " --epochs 2' >" + (dir / "o.txt").string() + " 2>" + (dir / "e.txt").string();
  const int status = std::system(limited.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string err = slurp(dir / "e.txt");
  EXPECT_NE(err.find(ck.string()), std::string::npos) << err;
  EXPECT_NE(err.find("File too large"), std::string::npos) << err;
  EXPECT_EQ(slurp(ck), good);
  for (const auto& f : fs::directory_iterator(dir / "run")) {
    EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << f.path();
  }
  Result resumed = run("train --resume " + ck.string() + out + " --epochs 2");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
}

namespace {
struct UsageCase {
  std::string args;
  std::string expect;  // the message after "seam: error: "
};

// A usage error: status 2 and one line that starts with the expected message.
void expect_usage_error(const Result& r, const UsageCase& c) {
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("seam: error: " + c.expect, 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}
}  // namespace

// Every flag mistake of every command: one line saying what is wrong and what is allowed,
// and exit status 2.
TEST_F(Cli, FlagErrorsSayWhatIsAllowedOnOneLine) {
  std::vector<UsageCase> cases = {
      {"train --batch 0", "--batch must be a whole number >= 1, got 0"},
      {"train --epochs abc", "--epochs must be a whole number >= 1, got 'abc'"},
      {"train --epochs 2.5", "--epochs must be a whole number >= 1, got 2.5"},
      {"train --lr -0.5", "--lr must be a number >= 0, got -0.5"},
      {"train --lr fast", "--lr must be a number >= 0, got 'fast'"},
      {"train --seed -1", "--seed must be a whole number >= 0, got -1"},
      {"train --device gpu", "--device must be one of cpu, cuda, auto, got 'gpu'"},
      {"train --val-split 1", "--val-split must be a number from 0 to 0.99, got 1"},
      {"train --max-steps 0", "--max-steps must be a whole number >= 1, got 0"},
      {"train --limit-train x", "--limit-train must be a whole number >= 1, got 'x'"},
      {"train --log-every -2", "--log-every must be a whole number >= 1, got -2"},
      {"train --batch 99999999999999999999", "--batch must be a whole number from 1 to 9223372036854775807"},
      {"eval --checkpoint c --batch 0", "--batch must be a whole number >= 1, got 0"},
      {"eval --checkpoint c --limit-test 0", "--limit-test must be a whole number >= 1, got 0"},
      {"eval --checkpoint c --device tpu", "--device must be one of cpu, cuda, auto, got 'tpu'"},
      {"plan m.json --batch none", "--batch must be a whole number >= 1, got 'none'"},
      {"plan m.json --device gpu", "--device must be one of cpu, cuda, auto, got 'gpu'"},
      {"train --precision fp32", "--precision must be one of f32, tf32, bf16, f16, got 'fp32'"},
      {"plan m.json --precision half", "--precision must be one of f32, tf32, bf16, f16, got 'half'"},
      {"bench --precision TF32", "--precision must be one of f32, tf32, bf16, f16, got 'TF32'"},
      {"bench --steps 0", "--steps must be a whole number >= 1, got 0"},
      {"bench --repeats 3000000000", "--repeats must be a whole number from 1 to 2147483647"},
      {"bench --warmup -1", "--warmup must be a whole number >= 0, got -1"},
      {"bench --streams 17", "--streams must be a whole number from 1 to 16, got 17"},
      {"bench --fusion some", "--fusion must be one of all, epilogues, none, got 'some'"},
      {"bench --epilogue best", "--epilogue must be one of fastest, fused, split, split_t, got 'best'"},
      {"bench --device gpu", "--device must be one of cpu, cuda, auto, got 'gpu'"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.args);
    Result r = run(c.args);
    expect_usage_error(r, c);
    std::string sub = c.args.substr(0, c.args.find(' '));
    EXPECT_NE(r.err.find("see 'seam " + sub + " --help'"), std::string::npos) << r.err;
  }
}

// Unknown flags and commands, missing values and extra arguments exit with 2 (the nearest
// flag or command suggested); errors while running with 1.
TEST_F(Cli, UsageErrorsExitWithTwoAndRuntimeErrorsWithOne) {
  std::vector<UsageCase> cases = {
      {"train --epoch 3", "unknown flag '--epoch' for 'seam train'; did you mean '--epochs'?"},
      {"eval --checkpoint c --jsn", "unknown flag '--jsn' for 'seam eval'; did you mean '--json'?"},
      {"train --batch", "--batch needs a value"},
      {"train a.json b.json", "unexpected argument 'b.json'"},
      {"plan", "model is required"},
      {"trian", "unknown command 'trian'; did you mean 'train'?"},
      {"--bogus", "unknown flag '--bogus'"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.args);
    Result r = run(c.args);
    expect_usage_error(r, c);
    EXPECT_NE(r.err.find("--help'"), std::string::npos) << r.err;
  }
  // Failures while running keep status 1, apart from usage mistakes.
  Result model = run("plan " + (dir / "nowhere.json").string());
  EXPECT_EQ(model.code, 1);
  EXPECT_EQ(model.err.rfind("seam: error: ", 0), 0u) << model.err;
  Result data = run("train --data " + (dir / "nowhere").string() + " --out " + (dir / "o").string());
  EXPECT_EQ(data.code, 1);
  EXPECT_NE(data.err.find("does not exist"), std::string::npos) << data.err;
  Result help = run("train --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("--epochs"), std::string::npos);
}

// A short run on the real Fashion-MNIST (installed by tools/setup.sh): a broken trainer
// stays near 0.1; a working one passes 0.8 after two epochs on 20000 images.
// A learning rate that sends the weights to 1e30: from the second step on, every loss is
// NaN, every update is skipped, and the run stops at the first log point after the limit,
// naming the step, with no checkpoint of the broken weights.
TEST_F(Cli, TooManySkippedUpdatesInARowStopTheRun) {
  fs::path data = make_data();
  fs::path model = write("small.json", kSmallMlp);
  Result r = run("train " + model.string() + " --data " + data.string() + " --out " + (dir / "run").string() +
                 " --lr 1e30 --max-skipped-steps 5 --log-every 8 --quiet");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("seam: error: step 8: the last 7 updates were skipped, the loss or a gradient was not finite", 0), 0u)
      << r.err;
  EXPECT_FALSE(fs::exists(dir / "run" / "checkpoint.safetensors"));
}

TEST_F(Cli, FashionMnistShortRunLearns) {
  const char* fmnist = "/usr/share/datasets/fashion-mnist";
  ASSERT_TRUE(fs::exists(fs::path(fmnist) / "train-images-idx3-ubyte.gz"))
      << "Fashion-MNIST is missing: tools/setup.sh installs it (apt-get install dataset-fashion-mnist)";
  Result r = run(std::string("train ") + SEAM_EXAMPLES "/fmnist_mlp.json --epochs 2 --limit-train 20000 --limit-test 2000 --json --out " +
                 (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.err;
  auto lines = json_lines(r.out);
  double acc = lines.back()["test_accuracy"];
  std::printf("Fashion-MNIST short run: test accuracy %.4f\n", acc);
  EXPECT_GE(acc, 0.8);
}

TEST_F(Cli, BenchReportsATableAndCsv) {
  fs::path csv = dir / "bench.csv";
  Result r = run("bench W1 --device cpu --steps 2 --repeats 1 --warmup 1 --csv " + csv.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("ms/step"), std::string::npos) << r.out;
  std::string text = slurp(csv);
  EXPECT_EQ(text.rfind("framework,workload,variant", 0), 0u) << text;
  EXPECT_NE(text.find("seam,W1,eager,cpu,"), std::string::npos) << text;
  EXPECT_NE(text.find(",gemm_ms,precision,memory_mib,device_memory_mib,sm_mhz,watts,power_capped\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(",tf32,"), std::string::npos) << text;  // W1 says what it means: TF32 GEMMs
  // The memory it holds: W1's 784-1024-1024-10 MLP has 1.9 M parameters, 7.4 MiB in f32;
  // parameters, gradients, two moments and the arena hold more than three times that.
  // Then the driver's count of device memory (none on the CPU), and the GPU's clock, power
  // and power-capped share in the timed steps: empty without a GPU.
  std::string row = text.substr(text.find("seam,W1,"), text.find('\n', text.find("seam,W1,")) - text.find("seam,W1,"));
  ASSERT_TRUE(row.ends_with(",,,")) << row;
  row.resize(row.size() - 3);
  const size_t last = row.rfind(','), before = row.rfind(',', last - 1);
  const double mib = std::stod(row.substr(before + 1, last - before - 1));
  EXPECT_GT(mib, 3 * 7.4) << row;
  EXPECT_LT(mib, 1024) << row;
  EXPECT_EQ(row.substr(last + 1), "-1") << row;
  Result f32 = run("bench W1 --device cpu --steps 1 --repeats 1 --warmup 0 --precision f32 --csv " + csv.string());
  ASSERT_EQ(f32.code, 0) << f32.err;
  EXPECT_NE(slurp(csv).find(",f32,"), std::string::npos) << slurp(csv);
  Result bad = run("bench W9 --device cpu");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("W9"), std::string::npos) << bad.err;
  // A model file as the workload, without fusion, with the plan's kernel table.
  Result file = run("bench " + std::string(SEAM_EXAMPLES) + "/fmnist_mlp.json --device cpu --steps 1 --repeats 1 "
                    "--warmup 0 --fusion none --explain --csv " + csv.string());
  ASSERT_EQ(file.code, 0) << file.err;
  EXPECT_NE(file.out.find("fusion: "), std::string::npos) << file.out;
  EXPECT_NE(slurp(csv).find("seam,fmnist_mlp,eager+fusion-none,cpu,"), std::string::npos) << slurp(csv);
  // GEMM epilogues and the loss fused, no elementwise groups: its own CSV variant.
  Result epi = run("bench " + std::string(SEAM_EXAMPLES) + "/fmnist_mlp.json --device cpu --steps 1 --repeats 1 "
                   "--warmup 0 --fusion epilogues --csv " + csv.string());
  ASSERT_EQ(epi.code, 0) << epi.err;
  EXPECT_NE(slurp(csv).find("seam,fmnist_mlp,eager+fusion-epilogues,cpu,"), std::string::npos) << slurp(csv);
  Result missing = run("bench nowhere.json --device cpu");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.err.find("nowhere.json"), std::string::npos) << missing.err;
}

// seam step writes what a twin in another framework needs to check itself: the weights
// before, the batch, and after one update the weights, gradients, logits and loss.
TEST_F(Cli, StepWritesTheWeightsTheBatchAndTheResults) {
  const fs::path out = dir / "step";
  Result r = run(std::string("step ") + SEAM_EXAMPLES "/fmnist_cnn.json --batch 4 --device cpu --data-seed 3 --out " +
                 out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto info = nlohmann::json::parse(slurp(out / "step.json"));
  EXPECT_EQ(info["batch"], 4);
  EXPECT_EQ(info["precision"], "f32");
  const seam::io::TensorFile init = seam::io::read_safetensors((out / "init.safetensors").string());
  const seam::io::TensorFile batch = seam::io::read_safetensors((out / "batch.safetensors").string());
  const seam::io::TensorFile after = seam::io::read_safetensors((out / "after.safetensors").string());
  ASSERT_NE(batch.find("x"), nullptr);
  EXPECT_EQ(batch.find("x")->type.shape, (seam::Shape{4, 1, 28, 28}));
  EXPECT_EQ(batch.find("y")->type.dtype, seam::DType::i32);
  ASSERT_NE(after.find("loss"), nullptr);
  float loss = 0;
  std::memcpy(&loss, after.find("loss")->data.data(), 4);
  EXPECT_FLOAT_EQ(loss, info["loss"].get<float>());
  EXPECT_EQ(after.find("logits")->type.shape, (seam::Shape{4, 10}));
  // Every parameter has its gradient, and the update moved it; no optimizer moments.
  int params = 0;
  for (const auto& t : init.tensors) {
    EXPECT_EQ(t.name.rfind("optimizer.", 0), std::string::npos) << t.name;
    const auto* a = after.find(t.name);
    ASSERT_NE(a, nullptr) << t.name;
    if (const auto* g = after.find("grad/" + t.name)) {
      ++params;
      EXPECT_EQ(g->type, t.type) << t.name;
      EXPECT_NE(a->data, t.data) << t.name << " did not move";
    }
  }
  EXPECT_GT(params, 4);
  // The same seed gives the same batch and step; another seed another batch.
  Result again = run(std::string("step ") + SEAM_EXAMPLES "/fmnist_cnn.json --batch 4 --device cpu --data-seed 3 --out " +
                     (dir / "again").string());
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(slurp(dir / "again" / "after.safetensors"), slurp(out / "after.safetensors"));
  // --epilogue: how the GPU runs fused GEMM epilogues, recorded; the CPU's step is the same.
  EXPECT_EQ(info["epilogue"], "fastest");
  Result split = run(std::string("step ") + SEAM_EXAMPLES "/fmnist_cnn.json --batch 4 --device cpu --data-seed 3 " +
                     "--epilogue split --out " + (dir / "split").string());
  ASSERT_EQ(split.code, 0) << split.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(dir / "split" / "step.json"))["epilogue"], "split");
  EXPECT_EQ(slurp(dir / "split" / "after.safetensors"), slurp(out / "after.safetensors"));
  Result bad = run(std::string("step ") + SEAM_EXAMPLES "/fmnist_cnn.json --epilogue sometimes --out " +
                   (dir / "bad").string());
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--epilogue"), std::string::npos) << bad.err;
  Result missing = run(std::string("step ") + SEAM_EXAMPLES "/fmnist_cnn.json");
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("--out"), std::string::npos) << missing.err;
}

// --steps: more steps on the same batch, each one's loss in step.json; the files are the
// first step's, as without it.
TEST_F(Cli, StepWritesTheLossCurveOfMoreSteps) {
  const std::string args = std::string("step ") + SEAM_EXAMPLES "/fmnist_mlp.json --batch 8 --device cpu --data-seed 1";
  Result one = run(args + " --out " + (dir / "one").string());
  ASSERT_EQ(one.code, 0) << one.err;
  Result six = run(args + " --steps 6 --out " + (dir / "six").string());
  ASSERT_EQ(six.code, 0) << six.err;
  const auto a = nlohmann::json::parse(slurp(dir / "one" / "step.json"));
  const auto b = nlohmann::json::parse(slurp(dir / "six" / "step.json"));
  ASSERT_EQ(a["losses"].size(), 1u);
  ASSERT_EQ(b["losses"].size(), 6u);
  EXPECT_EQ(b["losses"][0], a["loss"]);
  EXPECT_EQ(slurp(dir / "six" / "after.safetensors"), slurp(dir / "one" / "after.safetensors"));
  // The model learns its batch (slowly: SGD with dropout on N(0, 1) images).
  EXPECT_LT(b["losses"][5].get<double>(), b["losses"][0].get<double>() - 0.05) << b.dump();
  Result none = run(args + " --steps 0 --out " + (dir / "none").string());
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.err.find("--steps"), std::string::npos) << none.err;
}

// The CPU kernels cut their loops over the cores (src/backend/cpu/parallel.h): the same
// step on one thread and on three gives the same bits. The MLP's batch of 256 cuts its
// GEMMs into row blocks; the CNN's images spread over the threads.
TEST_F(Cli, OneThreadAndThreeGiveTheSameBits) {
  for (const char* model : {"fmnist_cnn.json", "fmnist_mlp.json"}) {
    std::string after[2];
    for (int k = 0; k < 2; ++k) {
      ::setenv("SEAM_CPU_THREADS", k ? "3" : "1", 1);
      const fs::path out = dir / (std::string(model) + std::to_string(k));
      Result r = run(std::string("step ") + SEAM_EXAMPLES "/" + model + " --batch " +
                     (std::string(model) == "fmnist_mlp.json" ? "256" : "17") + " --device cpu --out " + out.string());
      ASSERT_EQ(r.code, 0) << r.err;
      after[k] = slurp(out / "after.safetensors");
    }
    ::setenv("SEAM_CPU_THREADS", "1", 1);
    EXPECT_FALSE(after[0].empty());
    EXPECT_TRUE(after[0] == after[1]) << model << ": the step differs on three threads";
  }
}

// `seam train --nproc 2`: two processes under mpirun, each on half of every batch, their
// gradients summed by the plan (or, with --zero 1, each rank's shard of them). Without dropout or batch norm the run is one process's
// up to the rounding of another summation order; rank 0 alone reports and writes, and
// its checkpoint resumes in one process. Bad launches say what is wrong.
TEST_F(Cli, TwoRanksTrainAsOneProcessWithTheWholeBatch) {
  if (!seam::dist::have_mpi()) GTEST_SKIP() << "built without MPI";  // the forked ranks are checked against mpirun's
  // Containers often bar the cross-process memory mapping of OpenMPI's shared-memory transport.
  ::setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
  fs::path data = make_data();
  fs::path model = write("mlp.json", R"({
    "name": "mlp", "input": {"shape": [784]},
    "layers": [{"op": "linear", "name": "fc1", "out": 32}, {"op": "relu"}, {"op": "linear", "name": "fc2", "out": 10}],
    "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9},
    "batch_size": 32, "epochs": 2, "seed": 4
  })");
  const std::string common = "train " + model.string() + " --data " + data.string() + " --device cpu --json";
  Result one = run(common + " --out " + (dir / "one").string());
  Result two = run(common + " --nproc 2 --out " + (dir / "two").string());
  ASSERT_EQ(one.code, 0) << one.err;
  ASSERT_EQ(two.code, 0) << two.err;
  auto epochs = [](const std::vector<nlohmann::json>& lines) {
    std::vector<nlohmann::json> e;
    for (auto& l : lines)
      if (l["event"] == "epoch") e.push_back(l);
    return e;
  };
  auto a = epochs(json_lines(one.out)), b = epochs(json_lines(two.out));
  ASSERT_EQ(a.size(), 2u) << one.out;
  ASSERT_EQ(b.size(), 2u) << "rank 0 alone reports: " << two.out;
  EXPECT_EQ(json_lines(two.out).front()["ranks"], 2);
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* k : {"train_loss", "train_accuracy", "test_loss", "test_accuracy"})
      EXPECT_NEAR(a[i][k].get<double>(), b[i][k].get<double>(), 1e-4) << k << " of epoch " << i + 1;
  auto ta = seam::io::read_safetensors((dir / "one" / "checkpoint.safetensors").string());
  auto tb = seam::io::read_safetensors((dir / "two" / "checkpoint.safetensors").string());
  ASSERT_EQ(ta.tensors.size(), tb.tensors.size());
  for (size_t i = 0; i < ta.tensors.size(); ++i) {
    if (ta.tensors[i].type.dtype != seam::DType::f32) continue;
    const auto* x = reinterpret_cast<const float*>(ta.tensors[i].data.data());
    const auto* y = reinterpret_cast<const float*>(tb.tensors[i].data.data());
    double worst = 0;
    for (size_t j = 0; j < ta.tensors[i].data.size() / 4; ++j) worst = std::max(worst, std::abs(double(x[j]) - y[j]));
    EXPECT_LT(worst, 1e-4) << ta.tensors[i].name;
  }
  // ZeRO-1 (each rank keeps half the moments) checkpoints the same tensors, bit for bit.
  Result zero = run(common + " --nproc 2 --zero 1 --out " + (dir / "zero").string());
  ASSERT_EQ(zero.code, 0) << zero.err;
  auto tz = seam::io::read_safetensors((dir / "zero" / "checkpoint.safetensors").string());
  ASSERT_EQ(tz.tensors.size(), tb.tensors.size());
  for (size_t i = 0; i < tz.tensors.size(); ++i) EXPECT_TRUE(tz.tensors[i].data == tb.tensors[i].data) << tz.tensors[i].name;
  // Started by seam itself (no mpirun), meeting through files: the same bytes again.
  ::setenv("SEAM_LAUNCH", "fork", 1);
  Result forked = run(common + " --nproc 2 --out " + (dir / "forked").string());
  ::unsetenv("SEAM_LAUNCH");
  ASSERT_EQ(forked.code, 0) << forked.err;
  auto tf = seam::io::read_safetensors((dir / "forked" / "checkpoint.safetensors").string());
  ASSERT_EQ(tf.tensors.size(), tb.tensors.size());
  for (size_t i = 0; i < tf.tensors.size(); ++i) EXPECT_TRUE(tf.tensors[i].data == tb.tensors[i].data) << tf.tensors[i].name;
  // The two ranks' checkpoint goes on in one process, at the same global batch.
  Result more = run(common + " --out " + (dir / "two").string() + " --resume " +
                    (dir / "two" / "checkpoint.safetensors").string() + " --epochs 3");
  ASSERT_EQ(more.code, 0) << more.err;
  EXPECT_EQ(epochs(json_lines(more.out)).size(), 1u) << more.out;

  Result odd = run(common + " --nproc 2 --batch 33 --out " + (dir / "odd").string());
  EXPECT_EQ(odd.code, 1);
  EXPECT_NE(odd.err.find("the batch of 33 does not split among 2 ranks"), std::string::npos) << odd.err;
  Result many = run(common + " --nproc 4096 --out " + (dir / "many").string());
  EXPECT_EQ(many.code, 1);
  EXPECT_NE(many.err.find("--nproc 4096: this process may run on"), std::string::npos) << many.err;
  EXPECT_FALSE(fs::exists(dir / "odd" / "checkpoint.safetensors"));
}

// `seam bench --nproc 2`: two ranks (started by seam, meeting through files) each time the
// data-parallel step on a batch of the workload's size; rank 0 alone reports, with the
// ranks' throughput together.
TEST_F(Cli, BenchOverTwoRanksReportsTheirThroughputTogether) {
  ::setenv("SEAM_LAUNCH", "fork", 1);
  const fs::path csv = dir / "bench.csv";
  Result r = run("bench W1 --device cpu --nproc 2 --zero 1 --steps 2 --repeats 1 --warmup 1 --csv " + csv.string());
  Result alone = run("bench W1 --device cpu --nproc 2 --breakdown --steps 1 --repeats 1 --warmup 0");
  ::unsetenv("SEAM_LAUNCH");
  ASSERT_EQ(r.code, 0) << r.err;
  size_t said = 0;
  for (size_t at = r.out.find("each of 2 ranks on its own batch, ZeRO-1"); at != std::string::npos;
       at = r.out.find("each of 2 ranks on its own batch, ZeRO-1", at + 1))
    ++said;
  EXPECT_EQ(said, 1u) << "rank 0 alone reports: " << r.out;
  std::istringstream lines(slurp(csv));
  std::string header, row, extra;
  std::getline(lines, header), std::getline(lines, row);
  EXPECT_FALSE(std::getline(lines, extra)) << "one row, rank 0's";
  std::vector<std::string> cells;
  for (std::istringstream in(row); std::getline(in, extra, ',');) cells.push_back(extra);
  ASSERT_GE(cells.size(), 8u) << row;
  EXPECT_EQ(cells[2], "eager+ranks2+zero1");
  const double ms = std::stod(cells[4]), samples = std::stod(cells[7]);
  EXPECT_NEAR(samples, 2 * 128 / (ms * 1e-3), 1e-3 * samples) << "the two ranks' rows a second";
  EXPECT_EQ(alone.code, 1);
  EXPECT_NE(alone.err.find("--breakdown, --explain and --trace time steps on one rank alone"), std::string::npos)
      << alone.err;
}
