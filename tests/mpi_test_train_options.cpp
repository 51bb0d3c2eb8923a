// src/trainer's run options a practitioner leans on, under MPI on every rank of the job:
//   - train.keep_best restores the best evaluation's model: the same dense parameters, bit for bit, as a run
//     stopped at that step, and `latest` names its checkpoint;
//   - train.patience stops where the rule says, judged on the evaluations of a run without it;
//   - fractional train.epochs and train.eval_every in epochs give the steps they name;
//   - the train records' samples_per_s counts the training's time only (an evaluation inside an interval is not);
//   - a file with numpy's default types (float64 labels and dense features, int32 keys and offsets) trains
//     exactly as its float32/int64 original, and a file without a teacher gives no teacher_auc in the metrics;
//   - data.normalize = standardize uses the training file's statistics and carries them into the checkpoint.
#include <mpi.h>
#include <sys/stat.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/h5.h"
#include "io/synthetic.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/trainer.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

// Every rank of the job, on the cpu backend.
struct World {
  Topology topo;
  Device dev;
  World() { topo = make_topology(MPI_COMM_WORLD, 0); }
  ~World() { free_topology(topo); }
};

// A planted task (train 8192 samples, eval 4096) written by all ranks; removed with it.
struct Data {
  testing::SharedTempPath dir{"mpi_test_train_options", "data"};
  std::string train, eval;
  Data() {
    set_log_level(LogLevel::warn);
    if (testing::world_rank() == 0) ::mkdir(dir.path.c_str(), 0755);
    MPI_Barrier(MPI_COMM_WORLD);
    train = dir.path + "/train.h5", eval = dir.path + "/eval.h5";
    for (auto [path, samples, seed] : {std::tuple<std::string, int64_t, int>{train, 8192, 1}, {eval, 4096, 2}}) {
      SyntheticOptions o;
      o.samples = samples;
      o.slots = 4;
      o.num_dense = 5;
      o.max_rows = 60;
      o.hotness = "1-2";
      o.seed = seed;
      o.teacher_seed = 7;
      WriteOptions w;
      w.chunk_rows = 256;
      generate_dataset(path, make_synthetic_config(o), w, MPI_COMM_WORLD);
    }
  }
};

TrainConfig base_config(const Data& d) {
  TrainConfig c;
  c.train_path = d.train;
  c.eval_path = d.eval;
  c.global_batch = 256;  // 32 batches per epoch
  c.eval_batch = 2048;
  c.model.num_dense = -1;  // the file's
  c.model.num_slots = -1;
  c.model.embedding_dim = 8;
  c.model.bottom_mlp = {16, 8};
  c.model.top_mlp = {16, 1};
  c.sparse.kind = OptimizerKind::adagrad;
  c.sparse.lr = 0.1f;
  c.dense.kind = OptimizerKind::adam;
  c.dense.lr = 0.004f;
  c.schedule.lr = 0.004f;
  c.steps = 12;
  c.log_every = 4;
  c.prefetch = 1;
  c.seed = testing::seed();
  return c;
}

struct Run {
  TrainResult result;
  std::vector<float> params;
  int64_t step = 0;
};

Run train(const TrainConfig& cfg) {
  World w;
  Trainer t(MPI_COMM_WORLD, w.topo, w.dev, cfg);
  Run r;
  r.result = t.run();
  r.params = t.dense_params();
  r.step = t.step();
  return r;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The number after "key": in a JSON line (NaN when absent).
double json_number(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return std::nan("");
  return std::stod(line.substr(at + key.size() + 3));
}

}  // namespace

// keep_best: the run ends with the best evaluation's model. A second run of as many steps as the best one, with
// no evaluation, gives the same dense parameters bit for bit (the same rank count and plan: the same bits) and the
// same AUC; `latest` and `best` name the best step.
BOOST_AUTO_TEST_CASE(keep_best_restores_the_best_evaluation) {
  Data data;
  testing::SharedTempPath dir("mpi_test_train_options", "keep_best");
  if (testing::world_rank() == 0) ::mkdir(dir.path.c_str(), 0755);
  bool tried_middle = false;
  // A dense learning rate high enough that the evaluations go up and down: some run's best is not its last (at
  // a few test seeds none of the six is, so the initial model's seed moves on then).
  for (uint64_t shift = 0; shift < 4 && !tried_middle; ++shift)
  for (float lr : {0.05f, 0.1f, 0.2f, 0.4f, 0.8f, 1.6f}) {
    TrainConfig cfg = base_config(data);
    cfg.seed += shift;
    cfg.steps = 40;
    cfg.eval_every = 4;
    cfg.dense.lr = cfg.schedule.lr = lr;
    cfg.keep_best = true;
    cfg.checkpoint_every = 12;  // checkpoints after the best one: `latest` must come back to it
    cfg.checkpoint_dir = dir.path + "/lr" + std::to_string(lr) + "_" + std::to_string(shift);
    const Run a = train(cfg);
    const TrainResult& r = a.result;
    BOOST_REQUIRE_EQUAL(r.evals.size(), 10u);
    int64_t best = -1;
    double best_auc = 0;
    for (const auto& [step, m] : r.evals)
      if (best < 0 || m.auc > best_auc) best = step, best_auc = m.auc;
    BOOST_TEST(r.best_step == best);
    BOOST_TEST(r.best_value == best_auc);
    BOOST_TEST(r.last_step == 40);
    BOOST_TEST(a.step == best);
    if (testing::world_rank() == 0) {
      BOOST_TEST(read_text(cfg.checkpoint_dir + "/latest") == "step-" + std::to_string(best) + "\n");
      BOOST_TEST(read_text(cfg.checkpoint_dir + "/best") == "step-" + std::to_string(best) + "\n");
    }
    if (best == 40) continue;
    tried_middle = true;
    TrainConfig plain = base_config(data);
    plain.seed = cfg.seed;
    plain.dense.lr = plain.schedule.lr = lr;
    plain.steps = best;
    const Run b = train(plain);
    BOOST_TEST(b.params == a.params);
    BOOST_REQUIRE(!b.result.evals.empty());
    BOOST_TEST(b.result.evals.back().second.auc == best_auc);
    BOOST_TEST_MESSAGE("lr " << lr << ": best AUC " << best_auc << " at step " << best << " of 40");
    break;
  }
  BOOST_REQUIRE_MESSAGE(tried_middle, "every run's best evaluation was its last: the restore was not exercised");
}

// patience: the run stops at the first evaluation that is the patience-th in a row without a better AUC than the
// best before it, found here on the evaluations of the same run without patience.
BOOST_AUTO_TEST_CASE(patience_stops_where_the_rule_says) {
  Data data;
  for (float lr : {0.1f, 0.4f, 1.6f})
    for (int64_t patience : {2, 1}) {
      TrainConfig cfg = base_config(data);
      cfg.steps = 40;
      cfg.eval_every = 2;
      cfg.dense.lr = cfg.schedule.lr = lr;
      const Run full = train(cfg);
      int64_t stop = -1, since = 0;
      double best = -1;
      for (const auto& [step, m] : full.result.evals) {
        if (m.auc > best) best = m.auc, since = 0;
        else if (++since >= patience) {
          stop = step;
          break;
        }
      }
      if (stop < 0 || stop == 40) continue;  // no early stop in this one: another learning rate or patience
      BOOST_TEST_MESSAGE("lr " << lr << ", patience " << patience << ": stops at step " << stop);
      cfg.patience = patience;
      const Run early = train(cfg);
      BOOST_TEST(early.result.stopped_early);
      BOOST_TEST(early.result.last_step == stop);
      BOOST_TEST(early.result.evals.size() == size_t(stop / 2));
      return;
    }
  BOOST_FAIL("no learning rate gave an evaluation sequence that patience 2 or 1 stops early");
}

// 0.75 epoch of 32 batches is 24 steps; an evaluation every 0.25 epoch is one every 8 steps.
BOOST_AUTO_TEST_CASE(fractional_epochs_and_evaluations_per_epoch) {
  Data data;
  TrainConfig cfg = base_config(data);
  cfg.steps = 0;
  cfg.epochs = 0.75;
  parse_interval("train.eval_every", "0.25 epoch", cfg.eval_every, cfg.eval_every_epochs);
  const Run r = train(cfg);
  BOOST_TEST(r.result.last_step == 24);
  std::vector<int64_t> at;
  for (const auto& e : r.result.evals) at.push_back(e.first);
  BOOST_TEST(at == std::vector<int64_t>({8, 16, 24}));
}

// The rate of an interval with an evaluation in it: its samples over its training time (the wall time between
// records less the evaluations'), not over the time since the evaluation ended.
BOOST_AUTO_TEST_CASE(samples_per_s_counts_training_time_only) {
  Data data;
  testing::SharedTempPath metrics("mpi_test_train_options", "rate.jsonl");
  TrainConfig cfg = base_config(data);
  cfg.steps = 16;
  cfg.log_every = 8;
  cfg.eval_every = 2;  // three evaluations inside every interval of 8 steps
  cfg.eval_batch = 256;
  cfg.metrics_path = metrics.path;
  train(cfg);
  if (testing::world_rank() != 0) return;
  std::ifstream in(metrics.path);
  std::string line;
  double last_elapsed = 0, evals = 0;
  int intervals = 0;
  while (std::getline(in, line)) {
    if (line.find("\"record\":\"eval\"") != std::string::npos) evals += json_number(line, "seconds");
    if (line.find("\"record\":\"train\"") == std::string::npos) continue;
    const double elapsed = json_number(line, "elapsed_s"), rate = json_number(line, "samples_per_s");
    const double training = elapsed - last_elapsed - evals;
    const double want = 8 * 256 / training;
    BOOST_TEST_MESSAGE("interval " << intervals << ": " << rate << " samples/s reported, " << want
                                   << " from the records (evaluations " << evals << " s of "
                                   << elapsed - last_elapsed << " s)");
    BOOST_TEST(evals > 0);
    BOOST_TEST(std::fabs(rate / want - 1) < 0.25);
    last_elapsed = elapsed, evals = 0, ++intervals;
  }
  BOOST_TEST(intervals == 2);
}

namespace {

// Copies a sparta dataset into the types numpy and pandas write by default: float64 /label and /dense, int32
// /sparse/keys and /sparse/offsets; the attributes without the synthetic ones (generator, teacher_auc, seeds).
void write_numpy_typed(const std::string& from, const std::string& to) {
  h5::File f = h5::open_file(from);
  h5::File g = h5::create_file(to);
  for (const char* a : {"format", "preprocessing"}) h5::write_attr(g, "/", a, h5::read_attr_string(f, "/", a));
  for (const char* a : {"version", "num_samples", "num_dense", "num_slots"})
    h5::write_attr(g, "/", a, h5::read_attr_int(f, "/", a));
  for (const char* a : {"cardinality", "hotness"}) h5::write_attr(g, "/", a, h5::read_attr_ints(f, "/", a));
  auto as_double = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  auto as_int32 = [](const std::vector<int64_t>& v) { return std::vector<int32_t>(v.begin(), v.end()); };
  const std::vector<double> label = as_double(h5::read_all<float>(f, "/label"));
  const std::vector<double> dense = as_double(h5::read_all<float>(f, "/dense"));
  const std::vector<int32_t> offsets = as_int32(h5::read_all<int64_t>(f, "/sparse/offsets"));
  const std::vector<int32_t> keys = as_int32(h5::read_all<int64_t>(f, "/sparse/keys"));
  const hsize_t n = label.size();
  h5::write_dataset<double>(g, "/label", label.data(), {n});
  h5::write_dataset<double>(g, "/dense", dense.data(), {n, dense.size() / n});
  h5::create_group(g, "/sparse");
  h5::write_dataset<int32_t>(g, "/sparse/offsets", offsets.data(), {offsets.size()});
  h5::write_dataset<int32_t>(g, "/sparse/keys", keys.data(), {keys.size()});
  h5::close(g);
}

}  // namespace

BOOST_AUTO_TEST_CASE(numpy_typed_files_train_like_their_original) {
  Data data;
  testing::SharedTempPath metrics("mpi_test_train_options", "typed.jsonl");
  const std::string train64 = data.dir.path + "/train64.h5", eval64 = data.dir.path + "/eval64.h5";
  if (testing::world_rank() == 0) {
    write_numpy_typed(data.train, train64);
    write_numpy_typed(data.eval, eval64);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  TrainConfig cfg = base_config(data);
  cfg.shuffle_block = 16;
  const Run original = train(cfg);
  cfg.train_path = train64;
  cfg.eval_path = eval64;
  cfg.metrics_path = metrics.path;
  const Run typed = train(cfg);
  BOOST_TEST(typed.result.losses == original.result.losses);
  BOOST_TEST(typed.params == original.params);
  BOOST_REQUIRE(!typed.result.evals.empty() && !original.result.evals.empty());
  BOOST_TEST(typed.result.evals.back().second.auc == original.result.evals.back().second.auc);
  BOOST_TEST(original.result.teacher_auc >= 0);  // the synthetic original has one
  BOOST_TEST(typed.result.teacher_auc < 0);
  if (testing::world_rank() == 0) {
    const std::string m = read_text(metrics.path);
    BOOST_TEST(m.find("\"record\":\"eval\"") != std::string::npos);
    BOOST_TEST(m.find("teacher_auc") == std::string::npos, m);
  }
}

namespace {

// The mean and the population standard deviation of every dense feature of a file, in double.
void file_statistics(const std::string& path, std::vector<double>& mean, std::vector<double>& sd) {
  h5::File f = h5::open_file(path);
  const int64_t D = h5::read_attr_int(f, "/", "num_dense");
  const std::vector<float> x = h5::read_all<float>(f, "/dense");
  const size_t n = x.size() / size_t(D);
  mean.assign(size_t(D), 0);
  sd.assign(size_t(D), 0);
  for (size_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < D; ++j) mean[size_t(j)] += x[i * size_t(D) + size_t(j)] / double(n);
  for (size_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < D; ++j) {
      const double d = x[i * size_t(D) + size_t(j)] - mean[size_t(j)];
      sd[size_t(j)] += d * d / double(n);
    }
  for (double& v : sd) v = std::sqrt(v);
}

// A copy of a dataset with its dense features standardized by the given float statistics, as x -> (x - mean) *
// scale in float: the transformation the reader documents, applied here independently of it.
void write_standardized(const std::string& from, const std::string& to, const std::vector<float>& mean,
                        const std::vector<float>& scale) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
  h5::File f = h5::open_file(to, true);
  std::vector<float> x = h5::read_all<float>(f, "/dense");
  const size_t D = mean.size();
  for (size_t i = 0; i < x.size(); ++i) {
    const float centred = x[i] - mean[i % D];
    x[i] = centred * scale[i % D];
  }
  h5::write_rows<float>(f, "/dense", x.data(), 0, x.size() / D);
  h5::close(f);
}

}  // namespace

// data.normalize = standardize: the statistics are the training file's (checked against two passes in double),
// the checkpoint carries them, training with them is training on a file standardized beforehand by them, and a
// prediction from the checkpoint (another Trainer, as sparta-predict builds it) gives the trained model's
// evaluation exactly.
BOOST_AUTO_TEST_CASE(standardized_dense_features_travel_with_the_model) {
  Data data;
  testing::SharedTempPath dir("mpi_test_train_options", "normalize");
  if (testing::world_rank() == 0) ::mkdir(dir.path.c_str(), 0755);
  MPI_Barrier(MPI_COMM_WORLD);
  TrainConfig cfg = base_config(data);
  cfg.normalize = "standardize";
  cfg.normalize_samples = 0;
  cfg.checkpoint_dir = dir.path + "/ckpt";
  const Run normalized = train(cfg);
  MPI_Barrier(MPI_COMM_WORLD);
  // the checkpoint's statistics against the file's, computed here in double
  std::vector<double> mean, sd;
  file_statistics(data.train, mean, sd);
  std::vector<float> m, s;
  {
    h5::File d = h5::open_file(cfg.checkpoint_dir + "/step-12/dense.h5");
    m = h5::read_all<float>(d, "/dense/data.dense_mean");
    s = h5::read_all<float>(d, "/dense/data.dense_scale");
  }
  BOOST_REQUIRE_EQUAL(m.size(), mean.size());
  BOOST_REQUIRE_EQUAL(s.size(), sd.size());
  for (size_t j = 0; j < mean.size(); ++j) {
    BOOST_TEST(std::fabs(m[j] - mean[j]) <= 1e-4 * (1 + std::fabs(mean[j])), "feature " << j);
    BOOST_TEST(std::fabs(s[j] * sd[j] - 1) <= 1e-4, "feature " << j);
  }
  // training on files standardized beforehand by those statistics. The inputs are then the same floats, so the
  // runs agree to rounding (a loose bound would let two different transformations pass: with statistics that
  // differ in their last bits, Adam carries the difference to 1e-3 of the loss by step 12 at some seeds).
  const std::string pre = dir.path + "/train_standardized.h5", eval_pre = dir.path + "/eval_standardized.h5";
  if (testing::world_rank() == 0) {
    write_standardized(data.train, pre, m, s);
    write_standardized(data.eval, eval_pre, m, s);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  TrainConfig by_hand = base_config(data);
  by_hand.seed = cfg.seed;
  by_hand.train_path = pre;
  by_hand.eval_path = eval_pre;
  const Run reference = train(by_hand);
  BOOST_REQUIRE_EQUAL(normalized.result.losses.size(), reference.result.losses.size());
  for (size_t i = 0; i < reference.result.losses.size(); ++i)
    BOOST_TEST(std::fabs(normalized.result.losses[i] / reference.result.losses[i] - 1) < 1e-6,
               "step " << i + 1 << ": " << normalized.result.losses[i] << " vs " << reference.result.losses[i]);
  const double auc = normalized.result.evals.back().second.auc;
  BOOST_TEST(std::fabs(auc - reference.result.evals.back().second.auc) < 1e-6);
  // predicting from the checkpoint: the statistics come with it
  World w;
  Trainer t(MPI_COMM_WORLD, w.topo, w.dev, cfg, TrainerMode::predict, cfg.checkpoint_dir);
  const Predictions pred = t.predict();
  if (testing::world_rank() == 0) BOOST_TEST(evaluate(pred.prob, pred.label).auc == auc);
}
