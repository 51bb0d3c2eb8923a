// src/train_config (INI file + command line, the checks, the learning-rate schedule) and src/metrics (exact AUC,
// log-loss, accuracy, JSON lines) against hand-computed values and a brute-force AUC.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <fstream>

#include "src/base/check.h"
#include "src/metrics.h"
#include "src/train_config.h"
#include "tests/test_dense_util.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

// argv from words (argv[0] is the program).
struct Args {
  std::vector<std::string> words;
  std::vector<char*> ptrs;
  explicit Args(std::vector<std::string> w) : words(std::move(w)) {
    words.insert(words.begin(), "sparta-train");
    for (auto& s : words) ptrs.push_back(&s[0]);
  }
  int argc() { return int(ptrs.size()); }
  char** argv() { return ptrs.data(); }
};

TrainConfig parse(std::vector<std::string> words) {
  Args a(std::move(words));
  TrainConfig c;
  BOOST_REQUIRE(parse_train_config(a.argc(), a.argv(), c));
  return c;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

}  // namespace

BOOST_AUTO_TEST_CASE(config_file_and_command_line) {
  testing::ScopedPath ini("test_model_config", "run.ini");
  write_file(ini.path,
             "# a comment\n[data]\ntrain = a.h5\nglobal_batch = 2048\n[model]\ninteraction = dcnv2\n"
             "bottom_mlp = 32, 16\ntop_mlp = 8,1\ncross_rank = 4\nprecision = bf16\nseed = 18446744073709551615\n"
             "[embedding]\noptimizer = lazy_adam\nlr = 0.5\nplacement = hybrid,dispatch\nplanner_link_gbps = 85\n"
             "exchange = bf16\n[optimizer]\nlr = 0.25\n"
             "warmup_steps = 10\n[train]\nresume = true\ncheckpoint_dir = ck\n");
  // The command line overrides the file; what neither gives keeps its default.
  TrainConfig c = parse({"--config", ini.path, "--data.global_batch", "512", "--optimizer.kind", "sgd",
                         "--embedding.planner_hbm_gbps", "1500"});
  BOOST_TEST(c.train_path == "a.h5");
  BOOST_TEST(c.global_batch == 512);
  BOOST_TEST((c.model.interaction == Interaction::dcnv2));
  BOOST_TEST(c.model.bottom_mlp == std::vector<int>({32, 16}));
  BOOST_TEST(c.model.top_mlp == std::vector<int>({8, 1}));
  BOOST_TEST(c.model.cross_rank == 4);
  BOOST_TEST(c.model.cross_layers == 3);
  BOOST_TEST((c.model.precision == GemmType::bf16));
  BOOST_TEST(c.seed == 18446744073709551615ull);
  BOOST_TEST((c.sparse.kind == OptimizerKind::lazy_adam));
  BOOST_TEST(c.sparse.lr == 0.5f);
  BOOST_TEST(c.placement == "hybrid,dispatch");
  BOOST_TEST(c.planner_rates.link_GBps == 85);
  BOOST_TEST(c.planner_rates.hbm_GBps == 1500);
  BOOST_TEST(c.planner_rates.collective_us == PlannerRates().collective_us);
  BOOST_TEST(c.planner_rates.group_us == PlannerRates().group_us);
  BOOST_TEST(c.exchange == "bf16");
  BOOST_TEST((c.dense.kind == OptimizerKind::sgd));
  BOOST_TEST(c.schedule.lr == 0.25f);
  BOOST_TEST(c.schedule.warmup_steps == 10);
  BOOST_TEST(c.resume);
  BOOST_TEST(c.checkpoint_dir == "ck");
  BOOST_TEST(c.model.num_dense == -1);
  BOOST_TEST(c.eval_path == "");

  // The INI text a checkpoint records reads back to the same configuration.
  const TrainConfig back = parse_train_config_text(c.to_ini(), "test");
  BOOST_TEST(back.to_ini() == c.to_ini());
  BOOST_TEST(back.seed == c.seed);
  BOOST_TEST(back.sparse.lr == c.sparse.lr);
  BOOST_TEST(back.global_batch == 512);
  BOOST_TEST(back.planner_rates.link_GBps == 85);
  BOOST_TEST(back.planner_rates.hbm_GBps == 1500);
  BOOST_TEST(back.exchange == "bf16");
  // a checkpoint of an older version records options since removed (they changed no result): still read
  std::string older = c.to_ini();
  older.insert(older.find("[embedding]\n") + 12,
               "overlap = 1\nroute_ahead = 0\nhigh_priority = 1\nplanner_collective_us = 124\nplanner_group_us = 9\n");
  BOOST_TEST(parse_train_config_text(older, "test").to_ini() == c.to_ini());
  // an option that never was is still an error, naming it
  BOOST_CHECK_EXCEPTION(parse_train_config_text(c.to_ini() + "[embedding]\noverlapp = 1\n", "test"), Error,
                        [](const Error& e) { return std::string(e.what()).find("overlapp") != std::string::npos; });
  BOOST_TEST(parse({"--data.train", "a.h5"}).exchange == "fp32");  // the default

  // fp16 and its loss scaling options, through the checkpoint's INI text too
  const TrainConfig h = parse({"--data.train", "a.h5", "--model.precision", "fp16", "--train.loss_scale_init", "1024",
                               "--train.loss_scale_window", "50"});
  BOOST_TEST((h.model.precision == GemmType::f16));
  BOOST_TEST(h.loss_scale_init == 1024);
  BOOST_TEST(h.loss_scale_window == 50);
  const TrainConfig hb = parse_train_config_text(h.to_ini(), "test");
  BOOST_TEST((hb.model.precision == GemmType::f16));
  BOOST_TEST(hb.loss_scale_init == 1024);
  BOOST_TEST(hb.loss_scale_window == 50);

  // the communicator's options, through the INI text too
  const TrainConfig cc = parse({"--data.train", "a.h5", "--comm.timeout", "42.5", "--comm.check_calls", "1"});
  BOOST_TEST(cc.comm_timeout_s == 42.5);
  BOOST_TEST(cc.comm_check_calls);
  const TrainConfig ccb = parse_train_config_text(cc.to_ini(), "test");
  BOOST_TEST(ccb.comm_timeout_s == 42.5);
  BOOST_TEST(ccb.comm_check_calls);
  BOOST_TEST(parse({"--data.train", "a.h5"}).comm_timeout_s == 300);
  BOOST_TEST(!parse({"--data.train", "a.h5"}).comm_check_calls);
  // dropout and the dense weight decay, through the INI text too; off by default
  const TrainConfig dw = parse({"--data.train", "a.h5", "--model.dropout", "0.125", "--optimizer.weight_decay", "1e-4"});
  BOOST_TEST(dw.model.dropout == 0.125f);
  BOOST_TEST(dw.dense.weight_decay == 1e-4f);
  const TrainConfig dwb = parse_train_config_text(dw.to_ini(), "test");
  BOOST_TEST(dwb.model.dropout == 0.125f);
  BOOST_TEST(dwb.dense.weight_decay == 1e-4f);
  const TrainConfig d = parse({"--data.train", "a.h5"});
  BOOST_TEST(d.model.dropout == 0.f);
  BOOST_TEST(d.dense.weight_decay == 0.f);
  BOOST_TEST((d.model.precision == GemmType::f32));
  BOOST_TEST(d.loss_scale_init == 65536);
  BOOST_TEST(d.loss_scale_window == 2000);
}

BOOST_AUTO_TEST_CASE(bad_options_name_what_is_wrong) {
  testing::ScopedPath ini("test_model_config", "bad.ini");
  auto fails = [](std::vector<std::string> words, std::vector<std::string> names) {
    Args a(std::move(words));
    TrainConfig c;
    BOOST_CHECK_EXCEPTION(parse_train_config(a.argc(), a.argv(), c), Error, [&](const Error& e) {
      const std::string m = e.what();
      for (const auto& w : names)
        if (m.find(w) == std::string::npos) {
          BOOST_TEST_MESSAGE("error '" << m << "' does not name '" << w << "'");
          return false;
        }
      return true;
    });
  };
  fails({"--data.train", "a.h5", "--data.bogus", "1"}, {"data.bogus"});
  fails({"--data.train", "a.h5", "--data.global_batch", "many"}, {"data.global_batch", "many"});
  fails({"--data.train", "a.h5", "--data.global_batch", "0"}, {"data.global_batch", "0"});
  fails({}, {"data.train"});
  fails({"--data.train", "a.h5", "--model.bottom_mlp", "64,x"}, {"model.bottom_mlp", "64,x"});
  fails({"--data.train", "a.h5", "--model.top_mlp", "64,2"}, {"model.top_mlp", "2"});
  fails({"--data.train", "a.h5", "--model.interaction", "cat"}, {"model.interaction", "cat"});
  fails({"--data.train", "a.h5", "--model.precision", "fp8"}, {"model.precision", "fp32, bf16 or fp16", "fp8"});
  fails({"--data.train", "a.h5", "--train.loss_scale_init", "1000"}, {"train.loss_scale_init", "1000"});
  fails({"--data.train", "a.h5", "--train.loss_scale_window", "0"}, {"train.loss_scale_window", "0"});
  fails({"--data.train", "a.h5", "--embedding.optimizer", "rmsprop"}, {"embedding.optimizer", "rmsprop"});
  fails({"--data.train", "a.h5", "--optimizer.kind", "lazy_adam"}, {"optimizer.kind", "lazy_adam"});
  fails({"--data.train", "a.h5", "--embedding.placement", "dispatch,spread"}, {"embedding.placement", "spread"});
  fails({"--data.train", "a.h5", "--train.resume"}, {"train.resume", "train.checkpoint_dir"});
  fails({"--data.train", "a.h5", "--train.target_auc", "0.8"}, {"train.target_auc", "data.eval"});
  fails({"--data.train", "a.h5", "--optimizer.decay_steps", "5", "--optimizer.warmup_steps", "9"},
        {"optimizer.decay_start", "9"});
  fails({"--data.train", "a.h5", "--comm.mode", "smoke"}, {"comm.mode", "smoke"});
  fails({"--data.train", "a.h5", "--model.dropout", "1"}, {"model.dropout", "[0, 1)", "found 1"});
  fails({"--data.train", "a.h5", "--model.dropout", "-0.5"}, {"model.dropout", "found -0.5"});
  fails({"--data.train", "a.h5", "--optimizer.weight_decay", "-1"}, {"optimizer.weight_decay", "found -1"});
  fails({"--data.train", "a.h5", "--comm.timeout", "0"}, {"comm.timeout", "> 0", "0"});
  fails({"--data.train", "a.h5", "--embedding.planner_link_gbps", "0"}, {"embedding.planner_link_gbps", "> 0", "0"});
  fails({"--data.train", "a.h5", "--embedding.planner_hbm_gbps", "-3"}, {"embedding.planner_hbm_gbps", "-3"});
  // the planner's fixed costs are its own (no options)
  fails({"--data.train", "a.h5", "--embedding.planner_collective_us", "100"}, {"embedding.planner_collective_us"});
  fails({"--data.train", "a.h5", "--embedding.planner_group_us", "300"}, {"embedding.planner_group_us"});
  fails({"--data.train", "a.h5", "--embedding.exchange", "fp16"}, {"embedding.exchange", "fp16"});
  fails({"--data.train", "a.h5", "--embedding.storage", "fp8"}, {"embedding.storage", "fp8"});
  fails({"--data.train", "a.h5", "--embedding.storage", "bf16", "--embedding.optimizer", "adagrad"},
        {"embedding.storage", "bf16", "found adagrad"});
  fails({"--data.train", "a.h5", "--embedding.storage", "fp16", "--model.embedding_dim", "7", "--model.bottom_mlp",
         "64,7"},
        {"embedding.storage", "even dim", "found 7"});
  fails({"--data.train", "a.h5", "--device", "tpu"}, {"--device", "tpu"});
  fails({"--config", ini.path + ".missing"}, {ini.path + ".missing"});
  write_file(ini.path, "[data]\ntrain = a.h5\n[model]\nwidth = 3\n");
  fails({"--config", ini.path}, {ini.path, "model.width"});
  write_file(ini.path, "[data]\ntrain a.h5\n");
  fails({"--config", ini.path}, {ini.path});
  // --help prints and reports it (no configuration needed)
  Args h({"--help"});
  TrainConfig c;
  BOOST_TEST(!parse_train_config(h.argc(), h.argv(), c));
}

BOOST_AUTO_TEST_CASE(learning_rate_schedule) {
  LrSchedule s;
  s.lr = 1.0f;
  BOOST_TEST(learning_rate(s, 1) == 1.0f);
  s.warmup_steps = 4;
  BOOST_TEST(learning_rate(s, 1) == 0.25f);
  BOOST_TEST(learning_rate(s, 3) == 0.75f);
  BOOST_TEST(learning_rate(s, 4) == 1.0f);
  BOOST_TEST(learning_rate(s, 100) == 1.0f);
  s.decay_start = 10;
  s.decay_steps = 10;
  s.decay_power = 2;
  s.end_lr = 0.0f;
  BOOST_TEST(learning_rate(s, 10) == 1.0f);
  BOOST_TEST(learning_rate(s, 15) == 0.25f);  // (1 - 5/10)^2
  BOOST_TEST(learning_rate(s, 19) == float(0.01), boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(learning_rate(s, 20) == 0.0f);
  BOOST_TEST(learning_rate(s, 50) == 0.0f);
  s.end_lr = 0.5f;
  s.decay_power = 1;
  BOOST_TEST(learning_rate(s, 15) == 0.75f);  // 0.5 + 0.5 * 0.5
  BOOST_TEST(learning_rate(s, 30) == 0.5f);
}

// train.eval_every and train.checkpoint_every in steps or epochs, fractional train.epochs, and the options of
// model selection; what to_ini writes reads back the same.
BOOST_AUTO_TEST_CASE(intervals_in_steps_or_epochs) {
  TrainConfig c = parse({"--data.train", "a.h5", "--data.eval", "e.h5", "--train.epochs", "2.5", "--train.eval_every",
                         "epoch", "--train.checkpoint_every", "0.25 epoch", "--train.keep_best", "--train.patience", "3",
                         "--train.best_metric", "logloss", "--train.checkpoint_dir", "ck", "--data.shuffle_block", "1"});
  BOOST_TEST(c.epochs == 2.5);
  BOOST_TEST(c.eval_every == 0);
  BOOST_TEST(c.eval_every_epochs == 1.0);
  BOOST_TEST(c.checkpoint_every_epochs == 0.25);
  BOOST_TEST(c.keep_best);
  BOOST_TEST(c.patience == 3);
  BOOST_TEST(c.best_metric == "logloss");
  BOOST_TEST(c.shuffle_block == 1);
  // 2.5 epochs of 30 batches: 75 steps; 7 batches: 17.5 rounds to 18; an evaluation per epoch, a checkpoint every
  // 0.25 epoch (7.5 rounds to 8; at least 1 step)
  BOOST_TEST(total_steps(c, 30) == 75);
  BOOST_TEST(total_steps(c, 7) == 18);
  BOOST_TEST(interval_steps(c.eval_every, c.eval_every_epochs, 30) == 30);
  BOOST_TEST(interval_steps(c.checkpoint_every, c.checkpoint_every_epochs, 30) == 8);
  BOOST_TEST(interval_steps(c.checkpoint_every, c.checkpoint_every_epochs, 2) == 1);
  BOOST_TEST(interval_steps(40, 0, 30) == 40);
  TrainConfig back = parse_train_config_text(c.to_ini(), "to_ini");
  BOOST_TEST(back.epochs == 2.5);
  BOOST_TEST(back.eval_every_epochs == 1.0);
  BOOST_TEST(back.checkpoint_every_epochs == 0.25);
  BOOST_TEST(back.keep_best);
  BOOST_TEST(back.patience == 3);
  BOOST_TEST(back.best_metric == "logloss");
  BOOST_TEST(back.shuffle_block == 1);
  c = parse({"--data.train", "a.h5", "--train.eval_every", "40", "--train.steps", "9"});
  BOOST_TEST(c.eval_every == 40);
  BOOST_TEST(c.eval_every_epochs == 0.0);
  BOOST_TEST(total_steps(c, 1000) == 9);
  int64_t steps = -1;
  double epochs = -1;
  for (const char* bad : {"often", "2.5", "-1", "epochal", "1 epoch 2", "x epoch"})
    BOOST_CHECK_EXCEPTION(parse_interval("train.eval_every", bad, steps, epochs), Error, [&](const Error& e) {
      const std::string m = e.what();
      return m.find("train.eval_every") != std::string::npos && m.find(std::string("'") + bad + "'") != std::string::npos;
    });
  parse_interval("x", "2 epochs", steps, epochs);
  BOOST_TEST(epochs == 2.0);
  BOOST_TEST(steps == 0);
}

BOOST_AUTO_TEST_CASE(model_selection_and_interval_options_are_checked) {
  auto fails = [](std::vector<std::string> words, std::vector<std::string> names) {
    words.insert(words.begin(), {"--data.train", "a.h5"});
    Args a(std::move(words));
    TrainConfig c;
    BOOST_CHECK_EXCEPTION(parse_train_config(a.argc(), a.argv(), c), Error, [&](const Error& e) {
      const std::string m = e.what();
      for (const auto& w : names)
        if (m.find(w) == std::string::npos) {
          BOOST_TEST_MESSAGE("error '" << m << "' does not name '" << w << "'");
          return false;
        }
      return true;
    });
  };
  fails({"--train.eval_every", "sometimes"}, {"train.eval_every", "sometimes"});
  fails({"--train.checkpoint_every", "-2"}, {"train.checkpoint_every", "-2"});
  fails({"--train.epochs", "0"}, {"train.epochs", "> 0"});
  fails({"--train.keep_best", "--train.checkpoint_dir", "ck"}, {"train.keep_best", "data.eval"});
  fails({"--data.eval", "e.h5", "--train.keep_best"}, {"train.keep_best", "train.checkpoint_dir"});
  fails({"--train.patience", "2"}, {"train.patience", "data.eval"});
  fails({"--data.eval", "e.h5", "--train.best_metric", "accuracy"}, {"train.best_metric", "accuracy"});
  fails({"--data.shuffle_block", "-1"}, {"data.shuffle_block", "-1"});
}

// A schedule whose steps lie beyond the run is named (demo.ini's decay_start 512 in a 117-step run).
BOOST_AUTO_TEST_CASE(schedule_beyond_the_run_is_named) {
  LrSchedule s;
  s.warmup_steps = 100;
  s.decay_start = 512;
  s.decay_steps = 200;
  std::vector<std::string> w = schedule_warnings(s, 117);
  BOOST_REQUIRE_EQUAL(w.size(), 1u);
  BOOST_TEST(w[0].find("optimizer.decay_start 512: the decay never starts in this run of 117 steps") !=
             std::string::npos, w[0]);
  w = schedule_warnings(s, 600);
  BOOST_REQUIRE_EQUAL(w.size(), 1u);
  BOOST_TEST(w[0].find("does not reach optimizer.end_lr") != std::string::npos, w[0]);
  w = schedule_warnings(s, 50);
  BOOST_REQUIRE_EQUAL(w.size(), 2u);
  BOOST_TEST(w[0].find("optimizer.warmup_steps 100") != std::string::npos, w[0]);
  BOOST_TEST(schedule_warnings(s, 712).empty());
  s.decay_steps = 0;  // no decay: decay_start means nothing
  BOOST_TEST(schedule_warnings(s, 117).empty());
}

namespace {
// AUC by counting every (positive, negative) pair: ties count one half.
double brute_auc(const std::vector<float>& p, const std::vector<float>& y) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < p.size(); ++i)
    for (size_t j = 0; j < p.size(); ++j)
      if (y[i] > 0.5f && y[j] <= 0.5f) {
        pairs += 1;
        wins += p[i] > p[j] ? 1 : p[i] == p[j] ? 0.5 : 0;
      }
  return wins / pairs;
}
}  // namespace

BOOST_AUTO_TEST_CASE(metrics_against_hand_computed_values) {
  // Scores with ties (rounded to 1/16), labels random.
  std::vector<float> p = testing::random_floats(500, 0.f, 1.f), y(500);
  for (auto& v : p) v = std::round(v * 16) / 16;
  const std::vector<int64_t> bits = testing::random_ints(500, 0, 1);
  for (size_t i = 0; i < y.size(); ++i) y[i] = float(bits[i]);
  const EvalMetrics m = evaluate(p, y);
  BOOST_TEST(m.samples == 500);
  BOOST_TEST(m.auc == brute_auc(p, y), boost::test_tools::tolerance(1e-12));
  double loss = 0, right = 0, pos = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double q = std::min(std::max(double(p[i]), 1e-7), 1 - 1e-7);
    loss += y[i] > 0.5f ? -std::log(q) : -std::log(1 - q);
    right += (p[i] > 0.5f) == (y[i] > 0.5f);
    pos += y[i] > 0.5f;
  }
  BOOST_TEST(m.logloss == loss / 500, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(m.accuracy == right / 500);
  BOOST_TEST(m.positive_rate == pos / 500);

  // Four samples by hand: positives 0.9, 0.4; negatives 0.4, 0.1 → pairs (0.9>0.4, 0.9>0.1, 0.4=0.4, 0.4>0.1) = 3.5/4
  const EvalMetrics h = evaluate({0.9f, 0.4f, 0.4f, 0.1f}, {1, 1, 0, 0});
  BOOST_TEST(h.auc == 0.875);
  BOOST_TEST(h.accuracy == 0.75);  // 0.9 → 1 right, 0.4 → 0 wrong, 0.4 → 0 right, 0.1 → 0 right
  BOOST_TEST(h.logloss == -(std::log(0.9f) + std::log(0.4f) + std::log(0.6f) + std::log(0.9f)) / 4,
             boost::test_tools::tolerance(1e-6));
  BOOST_TEST(evaluate({0.3f, 0.7f}, {1, 1}).auc == 0.5);  // one class only
}

BOOST_AUTO_TEST_CASE(json_lines) {
  const std::string s = JsonLine("eval").add("step", int64_t(7)).add("auc", 0.75).add("name", "a\"b\n").add("x", NAN).str();
  BOOST_TEST(s == "{\"record\":\"eval\",\"step\":7,\"auc\":0.75,\"name\":\"a\\\"b\\n\",\"x\":null}");
}
