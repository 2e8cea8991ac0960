// The GPT builder (nn::gpt), its model-file form, its token data and its training on the
// CPU: gradients against finite differences in f64, errors that name the setting, and a
// tiny model that learns a text through `seam train`'s loop.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "cli_fixture.h"
#include "data/dataset.h"
#include "grad_check.h"
#include "io/model_file.h"
#include "seam/nn.h"
#include "train/trainer.h"

namespace seam {
namespace {

namespace fs = std::filesystem;

nn::GptConfig tiny() {
  nn::GptConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 8, c.vocab = 11, c.block_size = 6;
  return c;
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one with '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Gpt, GradientsMatchFiniteDifferencesInDouble) {
  // Every parameter: embeddings (the token one tied to the output), layer norms, the
  // attention and MLP projections; a padded vocabulary, so the cut-off logits are covered.
  for (bool tie : {true, false}) {
    SCOPED_TRACE(tie ? "tied" : "untied");
    testing::check_gradients([&](testing::GradCase& c) {
      nn::GptConfig cfg = tiny();
      cfg.tie_weights = tie;
      cfg.padded_vocab = 16;
      cfg.dtype = DType::f64;
      return nn::gpt(c.labels("tokens", {2, 5}, 11), cfg);
    });
  }
}

TEST(Gpt, ParametersAreNamedAndCountedAsGpt2s) {
  Graph g;
  nn::GptConfig c = tiny();
  Var logits = nn::gpt(g.input("x", {3, 6}, DType::i32), c);
  EXPECT_EQ(logits.shape(), (Shape{3, 6, 11}));
  int64_t n = 0;
  for (ValueId id : g.params()) n += g.value(id).type.numel();
  const int64_t C = 8, L = 2, V = 11, T = 6;
  // wte, wpe; per block 2 layer norms, qkv, proj, fc, proj (with biases); the final norm.
  EXPECT_EQ(n, V * C + T * C + L * (4 * C + 3 * C * C + 3 * C + C * C + C + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C);
  for (const char* name : {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.1.attn.c_attn.weight", "h.1.attn.c_proj.bias",
                           "h.0.mlp.c_fc.weight", "h.1.mlp.c_proj.weight", "ln_f.bias"})
    EXPECT_TRUE(g.find(name)) << name;
  EXPECT_FALSE(g.find("lm_head.weight"));  // tied to wte
  EXPECT_FALSE(g.value(*g.find("ln_f.weight")).decay);
  EXPECT_TRUE(g.value(*g.find("h.0.mlp.c_fc.weight")).decay);
  EXPECT_FALSE(g.value(*g.find("h.0.mlp.c_fc.bias")).decay);
}

TEST(Gpt, BadSettingsAreNamed) {
  auto build = [](nn::GptConfig c, int64_t T) {
    Graph g;
    nn::gpt(g.input("x", {2, T}, DType::i32), c);
  };
  nn::GptConfig c = tiny();
  c.n_head = 3;
  expect_error([&] { build(c, 4); }, "n_embd 8 is not divisible by n_head 3");
  expect_error([&] { build(tiny(), 7); }, "a sequence of 7 tokens is longer than block_size 6");
  c = tiny();
  c.padded_vocab = 5;
  expect_error([&] { build(c, 4); }, "padded_vocab 5 is smaller than vocab 11");
  c = tiny();
  c.dropout = 1;
  expect_error([&] { build(c, 4); }, "dropout must be in [0, 1)");
}

const char* kGptFile = R"({"name": "tiny_gpt", "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 8,
  "vocab": 11, "block_size": 6}, "batch_size": 4})";

TEST(GptModelFile, ExpandsIntoPlainNodes) {
  io::ModelSpec s = io::parse_model_json(kGptFile, "tiny.json");
  ASSERT_TRUE(s.gpt);
  EXPECT_EQ(s.input_shape, (Shape{6}));
  EXPECT_EQ(s.input_dtype, DType::i32);
  EXPECT_EQ(s.classes, 11);
  io::BuiltGraph b = io::build_graph(s, 4);
  EXPECT_EQ(b.graph.value(b.logits).type.shape, (Shape{4, 6, 11}));
  EXPECT_EQ(b.graph.value(b.y).type.shape, (Shape{4, 6}));
  bool attention = false;
  for (const Node& n : b.graph.nodes()) attention |= n.op == Op::attention_qkv;  // q, k and v packed, no slices
  EXPECT_TRUE(attention);
}

TEST(GptModelFile, APositionEmbeddingLayerAddsItsTableAndNamesItsLimit) {
  auto spec = [](int64_t num) {
    return R"({"input": {"shape": [5], "dtype": "i32"}, "classes": 7, "nodes": [
      {"op": "embedding", "name": "tok", "input": "x", "num": 7, "dim": 4},
      {"op": "position_embedding", "name": "pos", "input": "tok", "num": )" +
           std::to_string(num) + R"(},
      {"op": "linear", "name": "head", "input": "pos", "out": 7}]})";
  };
  io::ModelSpec s = io::parse_model_json(spec(8), "pos.json");
  io::BuiltGraph b = io::build_graph(s, 2);
  EXPECT_EQ(b.graph.value(*b.graph.find("pos.weight")).type.shape, (Shape{8, 4}));
  EXPECT_EQ(b.graph.value(b.y).type.shape, (Shape{2, 5}));
  expect_error([&] { io::parse_model_json(spec(4), "pos.json"); },
               "a sequence of 5 positions is longer than its 4 rows");
}

TEST(GptModelFile, W6IsGpt2At124MParameters) {
  const io::ModelSpec s = bench::gpt2_spec();
  ASSERT_TRUE(s.gpt);
  EXPECT_EQ(s.classes, 50257);
  EXPECT_EQ(s.gpt->rows(), 50304);
  EXPECT_EQ(s.precision, Precision::bf16);
  io::BuiltGraph b = io::build_graph(s, 1);
  int64_t n = 0, decayed = 0;
  for (ValueId id : b.graph.params()) {
    const Value& v = b.graph.value(id);
    n += v.type.numel();
    EXPECT_EQ(v.decay, v.type.shape.size() == 2) << v.name << ": decay on the 2-D weights only";
    decayed += v.decay;
  }
  EXPECT_EQ(n, 124475904);  // llm.c's count for GPT-2 124M with the padded vocabulary
  EXPECT_EQ(decayed, 2 + 12 * 4);  // wte, wpe and four projections a block
  EXPECT_EQ(b.graph.value(b.logits).type.shape, (Shape{1, 1024, 50257}));
}

TEST(GptModelFile, ErrorsNameTheFileAndTheSetting) {
  auto with = [](const std::string& model, const std::string& extra = "") {
    return R"({"model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 8, "vocab": 11, "block_size": 6)" + model +
           "}" + extra + "}";
  };
  expect_error([&] { io::parse_model_json(with(R"(, "n_head": 3)"), "m.json"); }, "m.json: model: gpt: n_embd 8 is not divisible by n_head 3");
  expect_error([&] { io::parse_model_json(with(R"(, "heads": 2)"), "m.json"); }, "unknown key 'heads'");
  expect_error([&] { io::parse_model_json(with("", R"(, "input": {"shape": [7]})"), "m.json"); },
               "T <= block_size 6");
  expect_error([&] { io::parse_model_json(with("", R"(, "classes": 12)"), "m.json"); }, "the gpt's vocab is 11");
  expect_error([&] { io::parse_model_json(R"({"model": {"type": "rnn"}})", "m.json"); }, "unknown model type 'rnn'");
  expect_error([&] { io::parse_model_json(R"({"input": {"shape": [4], "dtype": "f16"}, "layers": [{"op": "relu"}]})", "m.json"); },
               "unknown dtype 'f16'");
  expect_error([&] { io::parse_model_json(with("", R"(, "layers": [{"op": "relu"}])"), "m.json"); }, "exactly one of");
}

// A corpus of `n` tokens of a repeating pattern, in train.tok and val.tok under dir.
void write_corpus(const fs::path& dir, size_t n) {
  fs::create_directories(dir);
  data::TokenFile f;
  f.vocab = 11;
  const std::vector<uint16_t> pattern{1, 2, 3, 4, 5, 6, 7, 3, 9, 10, 0};
  for (size_t i = 0; i < n; ++i) f.tokens.push_back(pattern[i % pattern.size()]);
  data::write_tokens((dir / "train.tok").string(), f);
  f.tokens.resize(n / 4);
  data::write_tokens((dir / "val.tok").string(), f);
}

TEST(TokenBatches, EvaluationPredictsEveryTokenOnceAndPadsTheRest) {
  data::TokenFile f;
  f.vocab = 50;
  for (uint16_t i = 0; i < 23; ++i) f.tokens.push_back(i);
  data::TokenBatches b(f, 2, 5, false, 0, "t");
  EXPECT_EQ(b.samples(), 5);  // 22 targets in windows of 5
  EXPECT_EQ(b.batches_per_epoch(), 3);
  b.start_epoch(0);
  data::Batch batch;
  std::vector<int32_t> seen;
  int64_t rows = 0;
  while (b.next(batch)) {
    ASSERT_EQ(batch.ids.size(), 10u);
    for (size_t i = 0; i < batch.y.size(); ++i)
      if (batch.y[i] >= 0) {
        EXPECT_EQ(batch.y[i], batch.ids[i] + 1);  // the next token
        seen.push_back(batch.y[i]);
      }
    rows += batch.rows;
  }
  EXPECT_EQ(rows, 5);
  std::vector<int32_t> all;
  for (int32_t t = 1; t < 23; ++t) all.push_back(t);
  EXPECT_EQ(seen, all);
}

TEST(TokenBatches, TrainingWindowsDependOnlyOnSeedEpochAndBatch) {
  data::TokenFile f;
  f.vocab = 1000;
  for (uint16_t i = 0; i < 1000; ++i) f.tokens.push_back(i);
  data::TokenBatches a(f, 4, 8, true, 7, "t"), b(f, 4, 8, true, 7, "t");
  data::Batch x, y;
  a.start_epoch(2, 3);
  ASSERT_TRUE(a.next(x));
  b.start_epoch(2);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(b.next(y));
  EXPECT_EQ(x.ids, y.ids);
  EXPECT_EQ(x.y, y.y);
  EXPECT_EQ(x.index, 3);
}

TEST(TokenData, MissingFilesSayHowToMakeThem) {
  expect_error([] { data::open_tokens("/nonexistent/corpus", 8, {}); }, "seam tokenize FILE... --out /nonexistent/corpus");
}

TEST(TokenData, AnIdBeyondTheModelsVocabularyIsNamed) {
  const fs::path dir = fs::temp_directory_path() / ("seam_gpt_vocab_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  write_corpus(dir / "data", 200);  // ids up to 10
  const std::string model = R"({"name": "v", "device": "cpu", "batch_size": 2,
    "model": {"type": "gpt", "n_layer": 1, "n_head": 1, "n_embd": 4, "vocab": 10, "block_size": 4}})";
  {
    std::ofstream(dir / "m.json") << model;
  }
  train::TrainOptions o;
  o.model_path = (dir / "m.json").string();
  o.data_dir = (dir / "data").string();
  o.out_dir = (dir / "run").string();
  o.output = train::Output::quiet;
  expect_error([&] { train::run_train(o); }, "holds token id 10, beyond the vocabulary of " + o.model_path.value() + " (10 ids)");
  o.limit_train = 5;
  expect_error([&] { train::run_train(o); }, "apply to image sets");
  EXPECT_FALSE(fs::exists(dir / "run" / "checkpoint.safetensors"));
  fs::remove_all(dir);
}

// The whole path on the CPU: a model file of a tiny GPT, token files, `seam train`'s
// loop with AdamW, warmup + cosine and clipping; the validation loss falls far below the
// uniform guess's log(11) = 2.40 on a text that repeats.
TEST(GptTraining, ATinyGptLearnsARepeatingTextOnTheCpu) {
  const fs::path dir = fs::temp_directory_path() / ("seam_gpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  write_corpus(dir / "data", 4000);
  const std::string model = R"({"name": "tiny_gpt", "device": "cpu", "seed": 3, "batch_size": 8, "epochs": 3,
    "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "vocab": 11, "block_size": 12},
    "optimizer": {"type": "adamw", "lr": 0.01, "betas": [0.9, 0.95], "weight_decay": 0.1, "clip_norm": 1.0,
                  "schedule": {"type": "cosine", "warmup_steps": 5}},
    "data": {"tokens": ")" + (dir / "data").string() + R"("}})";
  {
    std::ofstream(dir / "gpt.json") << model;
  }
  train::TrainOptions o;
  o.model_path = (dir / "gpt.json").string();
  o.out_dir = (dir / "run").string();
  o.output = train::Output::quiet;
  ASSERT_EQ(train::run_train(o), 0);
  std::ifstream csv(dir / "run" / "metrics.csv");
  std::string header, line, last;
  std::getline(csv, header);
  EXPECT_NE(header.find("val_loss"), std::string::npos);
  int rows = 0;
  while (std::getline(csv, line)) last = line, ++rows;
  EXPECT_EQ(rows, 3);
  std::vector<std::string> f;
  std::stringstream ls(last);
  for (std::string cell; std::getline(ls, cell, ',');) f.push_back(cell);
  ASSERT_EQ(f.size(), 14u);
  const double val_loss = std::stod(f[5]), tokens_per_s = std::stod(f[11]);
  EXPECT_LT(val_loss, 0.5) << last;
  EXPECT_TRUE(f[7].empty()) << "no test split for token data";
  EXPECT_NEAR(tokens_per_s, 12 * std::stod(f[10]), 1e-5 * tokens_per_s);  // six digits in the CSV
  // A prompt byte this 11-token vocabulary does not hold is refused by name.
  train::SampleOptions so;
  so.checkpoint = (dir / "run" / "checkpoint.safetensors").string();
  so.prompt = "a";
  so.device = "cpu";
  expect_error([&] { train::run_sample(so); }, "the prompt's byte 97 is beyond the model's vocabulary of 11");
  fs::remove_all(dir);
}

// The command line end to end: text to token files, a tiny GPT trained on them, and
// greedy sampling that continues the text it learnt.
class GptCli : public testing::CliTest {};

TEST_F(GptCli, TokenizeTrainAndSampleContinueTheText) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the cat sat. ";
  {
    std::ofstream(dir / "corpus.txt") << text;
  }
  testing::CliResult r = run("tokenize " + (dir / "corpus.txt").string() + " --out " + (dir / "tok").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string model = R"({"name": "cat", "device": "cpu", "seed": 1, "batch_size": 16, "epochs": 25,
    "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab": 256, "block_size": 16},
    "optimizer": {"type": "adamw", "lr": 0.01, "schedule": {"type": "cosine", "warmup_steps": 5}}})";
  {
    std::ofstream(dir / "cat.json") << model;
  }
  r = run("train " + (dir / "cat.json").string() + " --data " + (dir / "tok").string() + " --out " + (dir / "run").string() +
          " --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string ck = (dir / "run" / "checkpoint.safetensors").string();
  r = run("sample " + ck + " --prompt 'the cat' --tokens 24 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "the cat sat. the cat sat. the c\n");  // the prompt and 24 bytes
  // Drawn at temperature 1 among the 3 most likely: the same seed, the same text.
  const testing::CliResult a = run("sample " + ck + " --tokens 30 --top-k 3 --seed 5"),
                           b = run("sample " + ck + " --tokens 30 --top-k 3 --seed 5");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out.size(), 32u);  // the newline prompt, 30 bytes, a newline
  // A vocabulary wider than the bytes (GPT-2's 50257 on byte tokens, here 300): the bytes
  // it learnt print as text all the same.
  std::string wide = model;
  const std::string bytes_vocab = "\"vocab\": 256";
  wide.replace(wide.find(bytes_vocab), bytes_vocab.size(), "\"vocab\": 300");
  {
    std::ofstream(dir / "wide.json") << wide;
  }
  r = run("train " + (dir / "wide.json").string() + " --data " + (dir / "tok").string() + " --out " +
          (dir / "wide").string() + " --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("sample " + (dir / "wide" / "checkpoint.safetensors").string() + " --prompt 'the cat' --tokens 24 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.size(), 7u + 24u + 1u) << r.out;  // the prompt, 24 bytes (not ids), a newline
  EXPECT_EQ(r.out.rfind("the cat", 0), 0u) << r.out;
  // seam bench times a model of token ids on random tokens.
  r = run("bench " + (dir / "cat.json").string() + " --device cpu --steps 2 --repeats 1 --warmup 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("cat"), std::string::npos) << r.out;
  // Not a language model: refused by name.
  r = run("sample " + ck + " --model " + SEAM_EXAMPLES "/fmnist_mlp.json");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("fmnist_mlp.json: seam sample draws from a causal language model"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace seam
