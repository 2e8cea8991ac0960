// The training loop: data, model, programs, per-step feedback, per-epoch evaluation,
// metrics and checkpoints. A checkpoint holds everything the next step depends on
// (parameters, optimizer moments, running statistics, the step counter, the position in
// the data order and the epoch's running sums), so a resumed run continues bitwise; it
// also keeps the epoch's time, samples and last learning rate so far, so that the row of
// an epoch that was stopped and resumed reports the whole epoch.
#include "backend/backend.h"
#include "plan/explain.h"
#include "train/trainer.h"

#include <atomic>
#include <cmath>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/file.h"
#include "data/dataset.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "io/safetensors.h"
#include "seam/model.h"
#include "train/default_model.h"
#include "train/progress.h"

namespace seam::train {

namespace {

using Clock = std::chrono::steady_clock;
// The signal that asked the run to stop (SIGINT or SIGTERM), 0 for none: the loop stops
// after its current step, writes a checkpoint and exits with 128 + the signal.
std::atomic<int> g_interrupted{0};
extern "C" void on_stop_signal(int sig) { g_interrupted = sig; }

// Installs on_stop_signal for SIGINT and SIGTERM while the loop runs, and puts back the
// handlers it found however the loop ends (an error too: Python's seam.train keeps its
// Ctrl-C after a failed run).
class StopSignals {
 public:
  StopSignals() : int_(std::signal(SIGINT, on_stop_signal)), term_(std::signal(SIGTERM, on_stop_signal)) {}
  ~StopSignals() {
    std::signal(SIGINT, int_);
    std::signal(SIGTERM, term_);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  void (*int_)(int);
  void (*term_)(int);
};

// Whether the run stops after this step: a stop signal here or on another rank, or the
// step limit. Every rank stops after the same step, or the ones going on would wait in
// the next step's sums for a rank that left.
bool agree_to_stop(dist::Comm* comm, bool limit) {
  if (!comm || comm->size() == 1) return g_interrupted || limit;
  double v[3] = {static_cast<double>(g_interrupted), g_interrupted ? 1.0 : 0.0, limit ? 1.0 : 0.0};
  comm->all_reduce_sum(v, 3);
  if (!g_interrupted && v[1] > 0) g_interrupted = static_cast<int>(std::lround(v[0] / v[1]));
  return v[1] > 0 || v[2] > 0;
}

// Rank 0's state tensors (running statistics) to every rank; the epoch's metric sums,
// which each rank keeps for its own rows, stay.
void share_running_statistics(Model& model, dist::Comm& comm) {
  for (const Slot& s : model.layout().states) {
    if (s.name == io::kTrainMetrics) continue;
    std::vector<std::byte> v = model.read_state(s.name);
    comm.broadcast(v.data(), v.size(), 0);
    model.write_state(s.name, v);
  }
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Doubles travel through checkpoint metadata as hex floats: exact, so sums resume bitwise.
std::string hexfloat(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}
double parse_double(const std::string& s) { return std::strtod(s.c_str(), nullptr); }

// Where a run stands. The epoch's loss and accuracy sums live on the device, in the
// model's state tensor io::kTrainMetrics, so they travel in checkpoints as tensors.
struct Position {
  int64_t epoch = 0, batch = 0;  // next batch to run
  double train_seconds = 0;      // whole run so far
  double epoch_seconds = 0;      // this epoch so far, across stops
  int64_t epoch_samples = 0;     // samples this epoch has trained on so far
  double lr = 0;                 // learning rate of the last update
  int64_t skipped_before_epoch = 0;  // StepState::skipped_steps when this epoch began
};

struct Checkpoint {
  std::string model_json;
  Position pos;
  int64_t step = 0;
  uint64_t seed = 0;
  int64_t batch_size = 0, train_samples = 0;
  double loss_scale = 0;
  int64_t scale_good = 0, skipped_steps = 0, skip_streak = 0;
  std::vector<HostTensor> tensors;
};

// `metrics`: the epoch's sums as one process keeps them, in place of this process's
// (a data-parallel run's ranks each keep their own rows' sums). Every rank of a ZeRO-1
// run calls it (the tensors gather every rank's moments); the `writer` writes.
void write_checkpoint(const std::string& path, Model& m, const io::ModelSpec& spec, const Position& pos,
                      int64_t batch, int64_t train_samples, std::optional<std::pair<double, double>> metrics = {},
                      bool writer = true) {
  io::TensorFile f;
  f.tensors = m.save_tensors();
  if (!writer) return;
  if (metrics)
    for (HostTensor& t : f.tensors)
      if (t.name == io::kTrainMetrics) {
        const float v[2] = {static_cast<float>(metrics->first), static_cast<float>(metrics->second)};
        std::memcpy(t.data.data(), v, sizeof v);
      }
  f.metadata = {{"format", "seam-checkpoint-1"},
                {"model", spec.json.dump()},
                {"step", std::to_string(m.state().step)},
                {"seed", std::to_string(m.state().seed)},
                {"epoch", std::to_string(pos.epoch)},
                {"batch", std::to_string(pos.batch)},
                {"batch_size", std::to_string(batch)},
                {"train_samples", std::to_string(train_samples)},
                {"data_order", "permutation(seed, epoch) of the training indices, splitmix64 Fisher-Yates"},
                {"train_seconds", hexfloat(pos.train_seconds)},
                {"epoch_seconds", hexfloat(pos.epoch_seconds)},
                {"epoch_samples", std::to_string(pos.epoch_samples)},
                {"lr", hexfloat(pos.lr)},
                {"loss_scale", hexfloat(m.state().loss_scale)},
                {"scale_good", std::to_string(m.state().scale_good)},
                {"skipped_steps", std::to_string(m.state().skipped_steps)},
                {"skip_streak", std::to_string(m.state().skip_streak)},
                {"skipped_before_epoch", std::to_string(pos.skipped_before_epoch)}};
  io::write_safetensors(path, f);
}

Checkpoint read_checkpoint(const std::string& path) {
  io::TensorFile f = io::read_safetensors(path);
  auto meta = [&](const char* k) -> const std::string& {
    auto it = f.metadata.find(k);
    if (it == f.metadata.end()) fail(path, ": not a seam checkpoint (metadata '", k, "' missing)");
    return it->second;
  };
  if (meta("format") != "seam-checkpoint-1") fail(path, ": unknown checkpoint format '", meta("format"), "'");
  auto integer = [&](const char* k) {
    try {
      return std::stoll(meta(k));
    } catch (const std::exception&) {
      fail(path, ": corrupt metadata '", k, "'");
    }
  };
  Checkpoint c;
  c.model_json = meta("model");
  c.step = integer("step");
  c.seed = static_cast<uint64_t>(std::stoull(meta("seed")));
  c.pos.epoch = integer("epoch");
  c.pos.batch = integer("batch");
  c.pos.train_seconds = parse_double(meta("train_seconds"));
  // Older checkpoints lack the epoch's time, samples and lr: their epoch is counted from
  // the resume on, as it was when they were written.
  auto optional_meta = [&](const char* k) {
    auto it = f.metadata.find(k);
    return it == f.metadata.end() ? std::string("0") : it->second;
  };
  c.pos.epoch_seconds = parse_double(optional_meta("epoch_seconds"));
  c.pos.lr = parse_double(optional_meta("lr"));
  auto optional_int = [&](const char* k) {
    try {
      return static_cast<int64_t>(std::stoll(optional_meta(k)));
    } catch (const std::exception&) {
      fail(path, ": corrupt metadata '", k, "'");
    }
  };
  c.pos.epoch_samples = optional_int("epoch_samples");
  // Older checkpoints have no loss scale (a scaled run starts it afresh) and no skips.
  c.loss_scale = parse_double(optional_meta("loss_scale"));
  c.scale_good = optional_int("scale_good");
  c.skipped_steps = optional_int("skipped_steps");
  c.skip_streak = optional_int("skip_streak");
  c.pos.skipped_before_epoch = optional_int("skipped_before_epoch");
  c.batch_size = integer("batch_size");
  c.train_samples = integer("train_samples");
  c.tensors = std::move(f.tensors);
  return c;
}

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t samples = 0;
  std::vector<int64_t> confusion;  // classes x classes, row = true label
};

// The confusion matrix only where it can be read (images' classes, not a vocabulary).
constexpr int64_t kMaxConfusion = 100;

void set_batch(Program& p, const data::Batch& b) {
  if (b.x.empty()) p.set_input("x", std::as_bytes(std::span(b.ids)));
  else p.set_input("x", std::as_bytes(std::span(b.x)));
  p.set_input("y", std::as_bytes(std::span(b.y)));
}

// Loss and accuracy over every label of the split that is not padding (-100). With
// `comm`, each rank evaluates its share of every batch and the sums are the ranks' sums.
EvalResult evaluate(Program& eval, data::Split& split, int64_t classes, dist::Comm* comm = nullptr) {
  EvalResult r;
  const bool confusion = classes <= kMaxConfusion;
  if (confusion) r.confusion.assign(static_cast<size_t>(classes * classes), 0);
  const std::string loss_name = eval.plan().outputs[0].name, pred_name = eval.plan().outputs[1].name;
  split.start_epoch(0);
  data::Batch b;
  double loss_sum = 0;
  while (split.next(b)) {
    set_batch(eval, b);
    eval.run();
    auto pred = eval.read_as<int32_t>(pred_name);
    int64_t labels = 0;
    for (size_t i = 0; i < b.y.size(); ++i) {
      const int32_t t = b.y[i], p = pred[i];
      if (t < 0) continue;
      ++labels;
      if (confusion) r.confusion[static_cast<size_t>(t * classes + p)]++;
      r.accuracy += t == p;
    }
    loss_sum += static_cast<double>(eval.read_as<float>(loss_name)[0]) * static_cast<double>(labels);
    r.samples += labels;
  }
  if (comm && comm->size() > 1) {
    // Counts travel as doubles: exact below 2^53.
    std::vector<double> v{loss_sum, r.accuracy, static_cast<double>(r.samples)};
    for (int64_t c : r.confusion) v.push_back(static_cast<double>(c));
    comm->all_reduce_sum(v.data(), v.size());
    loss_sum = v[0], r.accuracy = v[1], r.samples = std::llround(v[2]);
    for (size_t i = 0; i < r.confusion.size(); ++i) r.confusion[i] = std::llround(v[3 + i]);
  }
  r.loss = loss_sum / static_cast<double>(std::max<int64_t>(r.samples, 1));
  r.accuracy /= static_cast<double>(std::max<int64_t>(r.samples, 1));
  return r;
}

// The model's data: token files for a model of token ids (the folder given, else the
// file's data.tokens), images otherwise (the folder given, else Debian's Fashion-MNIST).
data::Dataset open_data(const io::ModelSpec& spec, const std::string& dir, const data::DataOptions& o) {
  data::Dataset d;
  if (spec.arrays) {
    if (!dir.empty()) fail("--data ", dir, ": ", spec.source, " trains on its data.arrays");
    return data::open_arrays({.x = spec.arrays->x, .y = spec.arrays->y, .test_x = spec.arrays->test_x,
                              .test_y = spec.arrays->test_y, .sample = spec.input_shape,
                              .labels = spec.label_shape, .ids = spec.token_input(),
                              .classes = spec.classes},
                             o);
  }
  if (spec.token_input()) {
    const std::string where = dir.empty() ? spec.tokens_dir : dir;
    if (where.empty())
      fail(spec.source, ": a model of token ids needs its token files: data.tokens in the file, or --data DIR");
    if (o.limit_train > 0 || o.limit_test > 0 || o.val_split > 0)
      fail(spec.source, ": --limit-train, --limit-test and val_split apply to image sets; token data has its own "
           "validation file");
    d = data::open_tokens(where, spec.input_shape.back(), o);
    if (d.classes > spec.classes)
      fail(where, ": holds token id ", d.classes - 1, ", beyond the vocabulary of ", spec.source, " (", spec.classes,
           " ids)");
    return d;
  }
  d = data::open_images(dir.empty() ? data::default_fashion_mnist_dir() : dir, o);
  const data::ImageSet& train = d.images->train;
  int64_t n = 1;
  for (int64_t s : spec.input_shape) n *= s;
  if (n != train.pixels())
    fail(spec.source, ": input shape ", shape_str(spec.input_shape), " holds ", n, " values but the images have ",
         train.rows, "x", train.cols, " = ", train.pixels(), " pixels");
  if (spec.classes != d.classes) fail(spec.source, ": classes = ", spec.classes, " but the data has ", d.classes);
  return d;
}

// The tensor cores' peak at a precision (the device model's measured figures), for MFU.
double peak_flops(Precision p) {
  const DeviceModel m;
  if (p == Precision::bf16 || p == Precision::f16) return m.half_tflops * 1e12;
  if (p == Precision::tf32) return m.tensor_tflops * 1e12;
  return m.simt_tflops * 1e12;
}

// The training of run_train on one rank of `comm` (null: one process alone). Rank 0
// reports, evaluates and writes the checkpoints and metrics; every rank trains on its
// share of each global batch, and the plan sums their gradients (Plan::buckets).
int train_on_rank(const TrainOptions& o, const std::shared_ptr<dist::Comm>& comm) {
  const auto t0 = Clock::now();
  const int rank = comm ? comm->rank() : 0, ranks = comm ? comm->size() : 1;
  const bool root = rank == 0;
  const Output output = root ? o.output : Output::quiet;
  std::optional<Checkpoint> ck;
  if (o.resume) ck = read_checkpoint(*o.resume);
  io::ModelSpec spec = o.model_path ? io::load_model_spec(*o.model_path, o.config)
                       : ck        ? io::parse_model_json(ck->model_json, *o.resume + " (stored model)")
                                   : io::parse_model_json(kDefaultModelJson, std::string(kDefaultModelName) + " (built in)");
  if (o.epochs) spec.epochs = *o.epochs;
  if (o.batch) spec.batch_size = *o.batch;
  if (o.lr) spec.optimizer.lr = *o.lr;
  if (o.seed) spec.seed = *o.seed;
  if (o.device) spec.device = *o.device;
  if (o.precision) spec.precision = *o.precision;
  if (o.layout) spec.layout = *o.layout;
  if (o.memory_budget) spec.memory_budget = *o.memory_budget;
  if (o.output_chunks) spec.output_chunks = *o.output_chunks;
  if (o.deterministic) spec.deterministic = true;
  if (o.val_split) spec.val_split = *o.val_split;
  if (spec.epochs < 1 || spec.batch_size < 1) fail("epochs and batch size must be >= 1");
  spec.optimizer.validate();
  if (ck) {
    if (ck->batch_size != spec.batch_size)
      fail(*o.resume, ": was trained with batch size ", ck->batch_size, ", not ", spec.batch_size, " (resuming exactly needs the same)");
    if (ck->seed != spec.seed) fail(*o.resume, ": was trained with seed ", ck->seed, ", not ", spec.seed);
  }
  const Device dev = resolve_device(spec.device);
  const std::string device = device_name(dev);
  const int64_t B = spec.batch_size;
  if (B % ranks)
    fail("the batch of ", B, " does not split among ", ranks, " ranks (each rank's step takes the same number of rows)");
  data::Dataset data = open_data(spec, o.data_dir,
                                 {.batch = B, .seed = spec.seed, .val_split = spec.val_split, .limit_train = o.limit_train,
                                  .limit_test = o.limit_test,
                                  .augment = {.crop_padding = spec.crop_padding, .horizontal_flip = spec.horizontal_flip}});
  if (ck && ck->train_samples != data.train_samples)
    fail(*o.resume, ": was trained on ", ck->train_samples, " samples, this run has ", data.train_samples);
  if (ranks > 1)
    for (auto* split : {&data.train, &data.val, &data.test})
      if (*split) *split = std::make_unique<data::RankShard>(std::move(*split), B, rank, ranks);
  data::Split& train_loader = *data.train;
  const int64_t steps_per_epoch = train_loader.batches_per_epoch();
  spec.fix_schedule_length(steps_per_epoch);

  io::BuiltGraph bg = io::build_graph(spec, B / ranks);
  Model model(bg.graph, {.seed = spec.seed, .device = dev, .precision = spec.precision, .precision_overrides = bg.overrides, .master_weights = spec.master_weights, .layout = spec.layout, .deterministic = spec.deterministic, .comm = comm, .zero = o.zero});
  io::load_initial(model, bg);
  Program train = model.compile({.mode = Mode::train, .loss = bg.loss, .optimizer = spec.optimizer, .recompute = spec.recompute, .output_chunks = spec.output_chunks, .memory_budget = spec.memory_budget});
  Program eval = model.compile({.mode = Mode::eval, .outputs = {bg.loss, bg.prediction}});
  double step_flops = 0;
  for (const PlanStep& st : train.plan().steps) step_flops += st.flops;
  // The epoch's sums so far, read from the device only at log points: [loss, correct].
  auto read_metrics = [&] {
    train.check();
    auto m = Program::cast_bytes<float>(model.read_state(io::kTrainMetrics));
    // Each rank sums its steps' mean losses and its correct rows: the global batch's
    // mean loss is the ranks' mean, its correct rows their sum.
    double v[2] = {m[0], m[1]};
    if (comm) comm->all_reduce_sum(v, 2), v[0] /= ranks;
    return std::pair<double, double>{v[0], v[1]};
  };
  const std::vector<float> zero_metrics(2, 0.0f);

  Position pos;
  if (ck) {
    try {
      model.load_tensors(ck->tensors);
    } catch (const Error& e) {
      fail(*o.resume, " does not fit ", spec.source, ": ", e.what());
    }
    model.state().step = ck->step;
    model.state().lr = ck->pos.lr;
    model.state().loss_scale = ck->loss_scale;
    model.state().scale_good = ck->scale_good;
    model.state().skipped_steps = ck->skipped_steps;
    model.state().skip_streak = ck->skip_streak;
    pos = ck->pos;
    if (pos.epoch >= spec.epochs) fail(*o.resume, ": the run already finished its ", spec.epochs, " epochs (pass --epochs to train longer)");
  }
  // Each rank draws dropout masks of its own for its rows; rank 0 keeps the run's seed,
  // which its checkpoints record.
  if (rank > 0) model.state().seed = dist::rank_seed(spec.seed, rank);
  // A checkpoint keeps the epoch's sums as one process would: rank 0 takes them on (its
  // loss sum times the ranks, as read_metrics divides the ranks' sum by their number),
  // the others start from zero.
  if (ck && ranks > 1) {
    auto m = Program::cast_bytes<float>(model.read_state(io::kTrainMetrics));
    const std::vector<float> mine = root ? std::vector<float>{m[0] * static_cast<float>(ranks), m[1]} : zero_metrics;
    model.write_state(io::kTrainMetrics, std::as_bytes(std::span(mine)));
  }

  const std::string out_dir = o.out_dir.empty() ? "runs/" + spec.name : o.out_dir;
  if (root) std::filesystem::create_directories(out_dir);
  const std::string ckpt_path = out_dir + "/checkpoint.safetensors", csv_path = out_dir + "/metrics.csv";
  // metrics.csv is rewritten whole after every epoch (atomically, like the checkpoint). A
  // resumed run keeps the rows of the epochs its checkpoint had finished and drops any
  // written after it (a run stopped between a row and its checkpoint redoes that epoch).
  const std::string csv_header =
      "epoch,step,lr,train_loss,train_accuracy,val_loss,val_accuracy,test_loss,test_accuracy,epoch_seconds,"
      "samples_per_second,tokens_per_second,mfu,skipped_steps\n";
  std::string csv_rows;
  if (ck) {
    std::ifstream old(csv_path);
    std::string line;
    if (std::getline(old, line) && line + '\n' == csv_header)
      while (std::getline(old, line)) {
        long long epoch = 0;
        if (std::sscanf(line.c_str(), "%lld", &epoch) == 1 && epoch >= 1 && epoch <= pos.epoch)
          csv_rows += line + '\n';
      }
  }
  auto write_csv = [&] {
    if (!root) return;
    const std::string text = csv_header + csv_rows;
    write_file_atomically(csv_path, std::as_bytes(std::span(text)));
  };
  write_csv();

  const bool bar = output == Output::bar, json = output == Output::json;
  const auto& layout = model.layout();
  if (!json && output != Output::quiet)
    std::printf("seam: training %s on %s in %s: %lld parameters, batch %lld%s, %lld steps/epoch, %lld epochs, %s\n",
                spec.name.c_str(), device.c_str(), precision_name(spec.precision),
                static_cast<long long>(layout.param_count()), static_cast<long long>(B),
                ranks > 1 ? (" (" + std::to_string(B / ranks) + " on each of " + std::to_string(ranks) + " ranks)").c_str() : "",
                static_cast<long long>(steps_per_epoch), static_cast<long long>(spec.epochs), spec.optimizer.str().c_str());
  const std::string& budget = train.plan().budget_note;
  if (!json && output != Output::quiet && !budget.empty()) std::printf("seam: %s\n", budget.c_str());
  if (json) {
    nlohmann::json start{{"event", "start"}, {"model", spec.name}, {"device", device},
                         {"precision", precision_name(spec.precision)}, {"parameters", layout.param_count()},
                         {"batch", B}, {"ranks", ranks}, {"steps_per_epoch", steps_per_epoch}, {"epochs", spec.epochs},
                         {"resumed_at_step", model.state().step}};
    if (!budget.empty()) start["memory"] = budget;
    std::cout << start.dump() << std::endl;
  }

  g_interrupted = 0;
  const StopSignals stop_signals;
  int64_t steps_this_run = 0;
  double last_test_acc = 0, last_loss = 0;
  int exit_code = 0;
  for (; pos.epoch < spec.epochs; ++pos.epoch, pos.batch = 0) {
    const auto te = Clock::now();
    if (pos.batch == 0) {
      model.write_state(io::kTrainMetrics, std::as_bytes(std::span(zero_metrics)));
      pos.epoch_seconds = 0, pos.epoch_samples = 0;
      pos.skipped_before_epoch = train.sync_state().skipped_steps;
    }
    train_loader.start_epoch(pos.epoch, pos.batch);
    ProgressBar progress("epoch " + std::to_string(pos.epoch + 1) + "/" + std::to_string(spec.epochs), steps_per_epoch, B,
                         bar && !(root && o.on_progress));
    data::Batch b;
    bool stop = false;
    // At a log point: the epoch's mean loss and accuracy so far (the same numbers whether
    // or not the run was interrupted and resumed in between).
    // Steps the update skipped (a non-finite loss or gradient) add no loss to the sums.
    // The last step's gradient norm (before clipping), where the update computes one.
    const bool has_norm = spec.optimizer.needs_norm();
    auto log_point = [&] {
      auto [loss_sum, correct] = read_metrics();
      const StepState& st = train.sync_state();
      if (st.skip_streak >= o.max_skipped_steps) {
        progress.finish();
        fail("step ", st.step, ": the last ", st.skip_streak, " updates were skipped, the loss or a gradient was "
             "not finite each time (loss scale ", st.loss_scale, "); lower the learning rate or check the data. "
             "The last checkpoint, if any, is unchanged.");
      }
      const int64_t counted = pos.batch - (st.skipped_steps - pos.skipped_before_epoch);
      const double loss = counted > 0 ? loss_sum / static_cast<double>(counted) : 0.0;
      const double acc = correct / static_cast<double>(pos.batch * B * data.sample_labels);
      if (!std::isfinite(loss)) {
        progress.finish();
        fail("the loss became ", loss, " by step ", model.state().step, " (epoch ", pos.epoch + 1,
             "); lower the learning rate or check the data. The last checkpoint, if any, is unchanged.");
      }
      char status[96];
      if (has_norm) std::snprintf(status, sizeof status, "loss %.4f  acc %.4f  norm %.3g", loss, acc, st.grad_norm);
      else std::snprintf(status, sizeof status, "loss %.4f  acc %.4f", loss, acc);
      progress.update(pos.batch, status);
      if (root && o.on_progress) o.on_progress({pos.epoch + 1, spec.epochs, pos.batch, steps_per_epoch, loss, acc});
      if (json) {
        nlohmann::json j{{"event", "step"}, {"step", model.state().step}, {"epoch", pos.epoch + 1},
                         {"loss", loss}, {"accuracy", acc}, {"lr", model.state().lr},
                         {"skipped_steps", st.skipped_steps}};
        if (has_norm) j["grad_norm"] = st.grad_norm;
        std::cout << j.dump() << '\n';
      }
    };
    while (train_loader.next(b)) {
      set_batch(train, b);
      train.run();  // returns before the GPU is done; nothing here waits for it
      pos.batch = b.index + 1;
      pos.epoch_samples += b.rows * ranks;  // the global batch's rows (training batches are whole)
      ++steps_this_run;
      const bool at_log_point = model.state().step % o.log_every == 0 || pos.batch == steps_per_epoch;
      if (at_log_point) log_point();
      // Ranks agree on stopping where they meet anyway (a signal stops a run of several
      // at the next log point); the step limit is the same on every rank.
      const bool limit = o.max_steps > 0 && steps_this_run >= o.max_steps;
      if ((ranks == 1 || at_log_point || limit) && agree_to_stop(comm.get(), limit)) {
        stop = true;
        break;
      }
    }
    progress.finish();
    const double seconds_this_run = seconds_since(te);
    pos.train_seconds += seconds_this_run;
    pos.epoch_seconds += seconds_this_run;
    pos.lr = model.state().lr;
    if (stop) {
      train.sync_state();
      std::optional<std::pair<double, double>> sums;
      if (ranks > 1) sums = read_metrics();  // every rank takes part in the sums
      write_checkpoint(ckpt_path, model, spec, pos, B, data.train_samples, sums, root);
      if (root) std::fprintf(stderr, "seam: %s after step %lld (epoch %lld, batch %lld of %lld); checkpoint written to %s; continue with --resume %s\n",
                   g_interrupted ? "interrupted" : "stopped", static_cast<long long>(model.state().step),
                   static_cast<long long>(pos.epoch + 1), static_cast<long long>(pos.batch),
                   static_cast<long long>(steps_per_epoch), ckpt_path.c_str(), ckpt_path.c_str());
      exit_code = g_interrupted ? 128 + g_interrupted : 0;
      break;
    }
    const double epoch_seconds = pos.epoch_seconds;
    auto [loss_sum, correct] = read_metrics();
    const StepState& st = train.sync_state();
    const int64_t epoch_skipped = st.skipped_steps - pos.skipped_before_epoch;
    const int64_t counted = steps_per_epoch - epoch_skipped;
    const double train_loss = counted > 0 ? loss_sum / static_cast<double>(counted) : 0.0;
    const double train_acc = correct / static_cast<double>(steps_per_epoch * B * data.sample_labels);
    const double sps = static_cast<double>(pos.epoch_samples) / std::max(epoch_seconds, 1e-9);
    // Tokens a second and model FLOPs utilization: the plan's FLOPs a step against the
    // tensor cores' measured peak at the precision (on the GPU).
    const double tps = sps * static_cast<double>(data.sample_labels);
    const double mfu = dev == Device::cuda ? step_flops * sps / static_cast<double>(B) / peak_flops(spec.precision) : 0;
    Position next = pos;
    next.epoch++, next.batch = 0, next.epoch_seconds = 0, next.epoch_samples = 0;
    // Every rank evaluates its share with rank 0's running statistics (each rank's own
    // follow its own rows; rank 0's are the ones its checkpoints keep).
    if (ranks > 1) share_running_statistics(model, *comm);
    std::optional<EvalResult> val, test;
    if (data.val) val = evaluate(eval, *data.val, spec.classes, comm.get());
    if (data.test) test = evaluate(eval, *data.test, spec.classes, comm.get());
    if (!root) {
      // Under ZeRO-1 the checkpoint's tensors gather every rank's moments.
      if (o.zero) write_checkpoint(ckpt_path, model, spec, next, B, data.train_samples, {}, false);
      continue;
    }
    const EvalResult& last = test ? *test : *val;
    last_test_acc = last.accuracy;
    last_loss = last.loss;
    auto field = [](const std::optional<EvalResult>& r, bool loss) {
      return r ? std::to_string(loss ? r->loss : r->accuracy) : std::string();
    };
    std::ostringstream row;
    row << pos.epoch + 1 << ',' << model.state().step << ',' << model.state().lr << ',' << train_loss << ',' << train_acc << ','
        << field(val, true) << ',' << field(val, false) << ',' << field(test, true) << ',' << field(test, false) << ','
        << epoch_seconds << ',' << sps << ',' << tps << ',' << (mfu > 0 ? std::to_string(mfu) : "") << ','
        << epoch_skipped << '\n';
    csv_rows += row.str();
    write_csv();
    if (json) {
      nlohmann::json j{{"event", "epoch"}, {"epoch", pos.epoch + 1}, {"step", model.state().step}, {"train_loss", train_loss},
                       {"train_accuracy", train_acc}, {"seconds", epoch_seconds}, {"samples_per_second", sps},
                       {"skipped_steps", epoch_skipped}};
      if (data.tokens) j["tokens_per_second"] = tps;
      if (mfu > 0) j["mfu"] = mfu;
      if (val) j["val_loss"] = val->loss, j["val_accuracy"] = val->accuracy;
      if (test) j["test_loss"] = test->loss, j["test_accuracy"] = test->accuracy;
      std::cout << j.dump() << std::endl;
    } else if (output != Output::quiet) {
      char speed[96];
      if (data.tokens) std::snprintf(speed, sizeof speed, "%.0f tokens/s", tps);
      else std::snprintf(speed, sizeof speed, "%.0f samples/s", sps);
      std::string line = "epoch " + std::to_string(pos.epoch + 1) + "/" + std::to_string(spec.epochs);
      char buf[160];
      std::snprintf(buf, sizeof buf, "  train loss %.4f  train acc %.4f", train_loss, train_acc);
      line += buf;
      if (val) std::snprintf(buf, sizeof buf, "  val loss %.4f  val acc %.4f", val->loss, val->accuracy), line += buf;
      if (test) std::snprintf(buf, sizeof buf, "  test loss %.4f  test acc %.4f", test->loss, test->accuracy), line += buf;
      std::snprintf(buf, sizeof buf, "  %.1fs (%s", epoch_seconds, speed);
      line += buf;
      if (mfu > 0) std::snprintf(buf, sizeof buf, ", MFU %.1f%%", 100 * mfu), line += buf;
      std::printf("%s)\n", line.c_str());
      std::fflush(stdout);
    }
    write_checkpoint(ckpt_path, model, spec, next, B, data.train_samples, std::pair{loss_sum, correct});
  }
  const double total = seconds_since(t0);
  if (exit_code == 0 && pos.epoch >= spec.epochs) {
    if (json)
      std::cout << nlohmann::json{{data.test ? "test_accuracy" : "val_accuracy", last_test_acc},
                                  {data.test ? "test_loss" : "val_loss", last_loss}, {"event", "done"},
                                  {"seconds", total}, {"train_seconds", pos.train_seconds}, {"checkpoint", ckpt_path}}
                       .dump()
                << std::endl;
    else if (output != Output::quiet)
      std::printf("seam: done in %s (training %s): %s loss %.4f, accuracy %.4f; checkpoint %s, metrics %s\n",
                  format_duration(total).c_str(), format_duration(pos.train_seconds).c_str(), data.test ? "test" : "validation",
                  last_loss, last_test_acc, ckpt_path.c_str(), csv_path.c_str());
  }
  return exit_code;
}

}  // namespace

int run_train(const TrainOptions& o) {
  return dist::run_on_ranks([&](const std::shared_ptr<dist::Comm>& comm) { return train_on_rank(o, comm); });
}

int run_eval(const EvalOptions& o) {
  Checkpoint ck = read_checkpoint(o.checkpoint);
  io::ModelSpec spec = o.model_path ? io::parse_model_file(*o.model_path)
                                    : io::parse_model_json(ck.model_json, o.checkpoint + " (stored model)");
  if (o.batch) spec.batch_size = *o.batch;
  if (o.precision) spec.precision = *o.precision;
  data::Dataset data = open_data(spec, o.data_dir, {.batch = spec.batch_size, .seed = spec.seed, .limit_test = o.limit_test});
  io::BuiltGraph bg = io::build_graph(spec, spec.batch_size);
  Model model(bg.graph, {.seed = spec.seed, .device = resolve_device(o.device), .precision = spec.precision, .precision_overrides = bg.overrides, .master_weights = spec.master_weights, .layout = spec.layout, .deterministic = spec.deterministic});
  try {
    model.load_tensors(ck.tensors);
  } catch (const Error& e) {
    fail(o.checkpoint, " does not fit ", spec.source, ": ", e.what());
  }
  Program eval = model.compile({.mode = Mode::eval, .outputs = {bg.loss, bg.prediction}});
  data::Split& loader = data.test ? *data.test : *data.val;  // token data: the validation tokens
  EvalResult r = evaluate(eval, loader, spec.classes);
  const bool confusion = !r.confusion.empty();
  if (o.json) {
    nlohmann::json j{{"samples", r.samples}, {"accuracy", r.accuracy}, {"loss", r.loss}};
    if (confusion) {
      j["confusion"] = nlohmann::json::array();
      for (int64_t t = 0; t < spec.classes; ++t) {
        std::vector<int64_t> row(r.confusion.begin() + t * spec.classes, r.confusion.begin() + (t + 1) * spec.classes);
        j["confusion"].push_back(row);
      }
    }
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::printf("%s on %lld %s: accuracy %.4f, loss %.4f\n", o.checkpoint.c_str(), static_cast<long long>(r.samples),
              data.tokens ? "validation tokens" : "test samples", r.accuracy, r.loss);
  if (!confusion) return 0;
  std::printf("confusion matrix (rows: true class, columns: predicted)\n      ");
  for (int64_t p = 0; p < spec.classes; ++p) std::printf("%6lld", static_cast<long long>(p));
  std::printf("\n");
  for (int64_t t = 0; t < spec.classes; ++t) {
    std::printf("%6lld", static_cast<long long>(t));
    for (int64_t p = 0; p < spec.classes; ++p) std::printf("%6lld", static_cast<long long>(r.confusion[static_cast<size_t>(t * spec.classes + p)]));
    std::printf("\n");
  }
  return 0;
}

int run_plan(const std::string& model_path, std::optional<int64_t> batch, bool eval, const std::string& device,
             bool measure, std::optional<Precision> precision, std::optional<LayoutPolicy> layout,
             std::optional<size_t> memory_budget, std::optional<int> output_chunks) {
  io::ModelSpec spec = io::parse_model_file(model_path);
  if (precision) spec.precision = *precision;
  if (layout) spec.layout = *layout;
  if (memory_budget) spec.memory_budget = *memory_budget;
  if (output_chunks) spec.output_chunks = *output_chunks;
  const int64_t B = batch.value_or(spec.batch_size);
  spec.fix_schedule_length(data_steps_per_epoch(spec, B));
  io::BuiltGraph bg = io::build_graph(spec, B);
  Model model(bg.graph, {.seed = spec.seed, .device = resolve_device(device), .precision = spec.precision, .precision_overrides = bg.overrides, .master_weights = spec.master_weights, .layout = spec.layout, .deterministic = spec.deterministic});
  const CompileOptions o = eval ? CompileOptions{.mode = Mode::eval, .outputs = {bg.loss, bg.prediction}}
                                : CompileOptions{.mode = Mode::train, .loss = bg.loss, .optimizer = spec.optimizer,
                                                 .recompute = spec.recompute, .output_chunks = spec.output_chunks,
                                                 .memory_budget = spec.memory_budget};
  // Only --measure runs the step: the plan alone allocates nothing, so a model larger
  // than this host's memory still prints.
  std::optional<Program> p;
  if (measure) p.emplace(model.compile(o));
  const Plan fused = p ? p->plan() : model.plan(o);
  std::printf("%s (%s step, batch %lld, %s, %s)\n%s", spec.name.c_str(), eval ? "evaluation" : "training",
              static_cast<long long>(B), device_name(model.device()), precision_name(spec.precision), fused.str().c_str());
  // The training plan is the one `seam train` runs (predictions are not read there: the
  // accuracy's count may come out of the loss). The same step without fusion, for the
  // before/after totals.
  CompileOptions plain = eval ? CompileOptions{.mode = Mode::eval, .outputs = {bg.loss, bg.prediction}, .fuse = false}
                              : CompileOptions{.mode = Mode::train, .loss = bg.loss, .optimizer = spec.optimizer, .fuse = false};
  Model cpu_model(bg.graph, {.seed = spec.seed});
  const Plan unfused = cpu_model.plan(plain);
  std::vector<double> measured;
  if (p) measured = p->time_steps(20);
  std::printf("\n%s", explain_plan(fused, unfused, DeviceModel{}, true, measured).c_str());
  for (const std::string& line : model.layout_choices()) std::printf("%s\n", line.c_str());
  return 0;
}

std::pair<io::ModelSpec, std::vector<HostTensor>> read_checkpoint_model(const std::string& checkpoint,
                                                                        const std::optional<std::string>& model_path) {
  Checkpoint ck = read_checkpoint(checkpoint);
  io::ModelSpec spec = model_path ? io::parse_model_file(*model_path)
                                  : io::parse_model_json(ck.model_json, checkpoint + " (stored model)");
  return {std::move(spec), std::move(ck.tensors)};
}

int64_t data_steps_per_epoch(const io::ModelSpec& spec, int64_t batch) {
  try {
    return open_data(spec, "", {.batch = batch, .seed = spec.seed, .val_split = spec.val_split}).train->batches_per_epoch();
  } catch (const Error&) {
    return 1;
  }
}

Device resolve_device(const std::string& requested) {
  if (requested == "cpu") return Device::cpu;
  if (requested == "cuda") return Device::cuda;  // the Model reports a missing GPU
  return default_device();
}

}  // namespace seam::train
