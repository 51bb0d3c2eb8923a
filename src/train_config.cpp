// train_config.cpp: see train_config.h (the schedule, the checks, the INI text; the parsing is train_options.cpp).
#include "src/train_config.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "src/base/check.h"
#include "src/loss_scale.h"
#include "src/placement.h"

namespace sparta {

float learning_rate(const LrSchedule& s, int64_t step) {
  double lr = s.lr;
  if (s.warmup_steps > 0 && step < s.warmup_steps) lr = double(s.lr) * double(step) / double(s.warmup_steps);
  if (s.decay_steps > 0 && step > s.decay_start) {
    const double t = double(std::min(step - s.decay_start, s.decay_steps)) / double(s.decay_steps);
    lr = s.end_lr + (double(s.lr) - s.end_lr) * std::pow(1.0 - t, s.decay_power);
  }
  return float(lr);
}

float learning_rate_factor(const LrSchedule& s, int64_t step) {
  return s.lr > 0 ? float(double(learning_rate(s, step)) / double(s.lr)) : 1.0f;
}

void parse_interval(const std::string& option, const std::string& text, int64_t& steps, double& epochs) {
  std::string t;
  for (char ch : text)
    if (ch != ' ' && ch != '\t') t += ch;
  steps = 0;
  epochs = 0;
  size_t at = t.find("epoch");
  const bool bad_tail = at != std::string::npos && t.substr(at) != "epoch" && t.substr(at) != "epochs";
  const std::string number = at == std::string::npos ? t : t.substr(0, at);
  size_t used = 0;
  double v = 0;
  bool ok = !bad_tail;
  if (ok && !(at != std::string::npos && number.empty())) {
    try {
      v = std::stod(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    ok = !number.empty() && used == number.size() && std::isfinite(v) && v >= 0;
  } else if (ok) {
    v = 1;  // "epoch"
  }
  if (ok && at == std::string::npos) ok = v == std::floor(v);  // steps are whole
  if (!ok)
    throw Error(option + ": expected a number of steps (0: none), \"epoch\" or a number of epochs (\"0.5 epoch\"), "
                "found '" + text + "'");
  if (at == std::string::npos) steps = int64_t(v);
  else epochs = v;
}

std::string interval_text(int64_t steps, double epochs) {
  if (epochs > 0) {
    std::ostringstream s;
    s.precision(9);
    s << epochs << " epoch";
    return s.str();
  }
  return std::to_string(steps);
}

int64_t interval_steps(int64_t steps, double epochs, int64_t batches_per_epoch) {
  if (epochs > 0) return std::max<int64_t>(1, std::llround(epochs * double(batches_per_epoch)));
  return steps;
}

int64_t total_steps(const TrainConfig& c, int64_t batches_per_epoch) {
  if (c.steps > 0) return c.steps;
  return std::max<int64_t>(1, std::llround(c.epochs * double(batches_per_epoch)));
}

std::vector<std::string> schedule_warnings(const LrSchedule& s, int64_t total) {
  std::vector<std::string> out;
  if (s.warmup_steps > total)
    out.push_back(strprintf("optimizer.warmup_steps %lld: the warm-up does not finish in this run of %lld steps (the "
                            "learning rate stays below optimizer.lr)", (long long)s.warmup_steps, (long long)total));
  if (s.decay_steps > 0 && s.decay_start >= total)
    out.push_back(strprintf("optimizer.decay_start %lld: the decay never starts in this run of %lld steps",
                            (long long)s.decay_start, (long long)total));
  else if (s.decay_steps > 0 && s.decay_start + s.decay_steps > total)
    out.push_back(strprintf("optimizer.decay_start %lld + optimizer.decay_steps %lld: the decay does not reach "
                            "optimizer.end_lr in this run of %lld steps", (long long)s.decay_start,
                            (long long)s.decay_steps, (long long)total));
  return out;
}

std::vector<int> parse_widths(const std::string& option, const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && item[used] == ' ') ++used;
    SPARTA_REQUIRE(used == item.size() && !item.empty() && v >= 1 && v <= (1 << 30),
                   "%s: expected layer widths >= 1 separated by commas (512,256,128), found '%s'", option.c_str(),
                   text.c_str());
    out.push_back(int(v));
  }
  SPARTA_REQUIRE(!out.empty(), "%s: expected layer widths >= 1 separated by commas (512,256,128), found '%s'",
                 option.c_str(), text.c_str());
  return out;
}

namespace {

std::string widths_text(const std::vector<int>& w) {
  std::string s;
  for (size_t i = 0; i < w.size(); ++i) s += (i ? "," : "") + std::to_string(w[i]);
  return s;
}

void check_optimizer(const char* section, const OptimizerConfig& o) {
  SPARTA_REQUIRE(std::isfinite(o.lr) && o.lr > 0, "%s.lr: expected a learning rate > 0, found %g", section, o.lr);
  SPARTA_REQUIRE(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1,
                 "%s.beta1, %s.beta2: expected values in [0, 1), found %g and %g", section, section, o.beta1, o.beta2);
  SPARTA_REQUIRE(o.epsilon >= 0, "%s.epsilon: expected >= 0, found %g", section, o.epsilon);
  SPARTA_REQUIRE(o.momentum >= 0, "%s.momentum: expected >= 0, found %g", section, o.momentum);
  SPARTA_REQUIRE(o.initial_accumulator >= 0, "%s.initial_accumulator: expected >= 0, found %g", section,
                 o.initial_accumulator);
}

}  // namespace

void check_train_config(const TrainConfig& c) {
  SPARTA_REQUIRE(!c.train_path.empty(), "data.train: a training dataset is required (--data.train FILE)");
  SPARTA_REQUIRE(c.global_batch >= 1, "data.global_batch: expected >= 1, found %lld", (long long)c.global_batch);
  SPARTA_REQUIRE(c.eval_batch >= 0, "data.eval_batch: expected >= 0 (0: data.global_batch), found %lld",
                 (long long)c.eval_batch);
  SPARTA_REQUIRE(c.eval_samples >= 0, "data.eval_samples: expected >= 0 (0: all), found %lld",
                 (long long)c.eval_samples);
  SPARTA_REQUIRE(c.prefetch >= 0, "data.prefetch: expected >= 0, found %d", c.prefetch);
  SPARTA_REQUIRE(c.model.num_dense == -1 || c.model.num_dense >= 1,
                 "model.num_dense: expected >= 1 (or -1: the training file's), found %d", c.model.num_dense);
  SPARTA_REQUIRE(c.model.num_slots == -1 || c.model.num_slots >= 1,
                 "model.num_slots: expected >= 1 (or -1: the training file's), found %d", c.model.num_slots);
  {
    ModelConfig m = c.model;  // the shape checks, with stand-ins for what the file will say
    if (m.num_dense < 0) m.num_dense = 1;
    if (m.num_slots < 0) m.num_slots = 1;
    check_model_config(m);
  }
  SPARTA_REQUIRE(c.rows >= 0, "embedding.rows: expected >= 0 (0: each slot's cardinality), found %lld",
                 (long long)c.rows);
  {
    std::stringstream ss(c.placement);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const std::string name = item.substr(0, item.find(':'));
      if (name == "auto") continue;
      try {
        parse_placement(name);
      } catch (const Error& e) {
        throw Error("embedding.placement: expected auto, dispatch, localized[:rank], replicated, distributed or "
                    "hybrid (one for every table, or a comma list with one per table), found '" + item + "'");
      }
    }
  }
  try {
    parse_combiner(c.combiner);
  } catch (const Error& e) {
    throw Error(std::string("embedding.combiner: ") + e.what());
  }
  check_optimizer("embedding", c.sparse);
  SPARTA_REQUIRE(!c.sparse.atomic_update || c.sparse.kind == OptimizerKind::sgd,
                 "embedding.atomic_update: applies to embedding.optimizer sgd only, found %s",
                 optimizer_name(c.sparse.kind));
  SPARTA_REQUIRE(std::isfinite(c.sparse.weight_decay) && c.sparse.weight_decay >= 0,
                 "embedding.weight_decay: expected a finite value >= 0, found %g", double(c.sparse.weight_decay));
  SPARTA_REQUIRE(c.sparse.weight_decay == 0 || !c.sparse.atomic_update,
                 "embedding.weight_decay: not with embedding.atomic_update (a row several keys touch would decay once "
                 "per key), found %g", double(c.sparse.weight_decay));
  try {
    check_row_storage(parse_row_storage(c.storage), c.sparse, c.model.embedding_dim, "embedding.storage");
  } catch (const Error& e) {
    const std::string what = e.what();
    throw Error(what.rfind("embedding.storage", 0) == 0 ? what : "embedding.storage: " + what);
  }
  SPARTA_REQUIRE(c.init_scale >= 0, "embedding.init_scale: expected >= 0, found %g", c.init_scale);
  SPARTA_REQUIRE(c.hot_rows >= 0, "embedding.hot_rows: expected >= 0, found %lld", (long long)c.hot_rows);
  SPARTA_REQUIRE(c.memory_mb >= 0, "embedding.memory_mb: expected >= 0 (0: the device's free memory), found %g",
                 c.memory_mb);
  SPARTA_REQUIRE(c.exchange == "fp32" || c.exchange == "bf16", "embedding.exchange: expected fp32 or bf16, found '%s'",
                 c.exchange.c_str());
  SPARTA_REQUIRE(c.index == "hashed" || c.index == "direct", "embedding.index: expected hashed or direct, found '%s'",
                 c.index.c_str());
  SPARTA_REQUIRE(c.index != "direct" || c.rows == 0,
                 "embedding.index: direct holds every key of a slot's cardinality, so embedding.rows must be 0 (found "
                 "%lld)", (long long)c.rows);
  // (the list's length is checked against the slots where they are known: the trainer)
  bool any_host = false, any_auto = false;
  std::stringstream tiers(c.tier);
  for (std::string t; std::getline(tiers, t, ',');) {
    const TableTier tier = parse_tier(t, "embedding.tier");
    any_host = tier == TableTier::host || any_host;
    any_auto = tier == TableTier::automatic || any_auto;
  }
  SPARTA_REQUIRE(c.cache_rows >= 0 && c.cache_mb >= 0 && std::isfinite(c.cache_mb),
                 "embedding.cache_rows, embedding.cache_mb: expected >= 0, found %lld and %g", (long long)c.cache_rows,
                 c.cache_mb);
  SPARTA_REQUIRE(!any_host || (c.cache_rows > 0) != (c.cache_mb > 0),
                 "embedding.tier host: give the GPU cache's size as embedding.cache_rows or embedding.cache_mb (one of "
                 "them), found cache_rows %lld, cache_mb %g", (long long)c.cache_rows, c.cache_mb);
  SPARTA_REQUIRE(!any_auto || c.cache_rows == 0 || c.cache_mb == 0,
                 "embedding.tier auto: give the GPU cache's size as embedding.cache_rows or embedding.cache_mb (one of "
                 "them), or neither (the planner sizes it), found cache_rows %lld, cache_mb %g",
                 (long long)c.cache_rows, c.cache_mb);
  SPARTA_REQUIRE(any_host || any_auto || (c.cache_rows == 0 && c.cache_mb == 0),
                 "embedding.cache_rows, embedding.cache_mb: a cache for tables in host memory only (embedding.tier "
                 "host or auto), found tier '%s'", c.tier.c_str());
  SPARTA_REQUIRE(!any_host || c.storage == "fp32",
                 "embedding.tier host: the host tier holds fp32 rows only; found embedding.storage %s",
                 c.storage.c_str());
  SPARTA_REQUIRE(parse_eviction(c.eviction, "embedding.eviction") != Eviction::error,
                 "embedding.eviction: expected lru or lfu (a host table's cache evicts rows), found '%s'",
                 c.eviction.c_str());
  const PlannerRates& pr = c.planner_rates;
  for (const auto& r : {std::make_pair("embedding.planner_link_gbps", pr.link_GBps),
                        std::make_pair("embedding.planner_hbm_gbps", pr.hbm_GBps)})
    SPARTA_REQUIRE(r.second > 0 && std::isfinite(r.second), "%s: expected > 0, found %g", r.first, r.second);
  check_optimizer("optimizer", c.dense);
  SPARTA_REQUIRE(std::isfinite(c.dense.weight_decay) && c.dense.weight_decay >= 0,
                 "optimizer.weight_decay: expected a finite value >= 0, found %g", c.dense.weight_decay);
  SPARTA_REQUIRE(c.dense.kind != OptimizerKind::lazy_adam && c.dense.kind != OptimizerKind::rowwise_adagrad,
                 "optimizer.kind: %s is a sparse optimizer (embedding.optimizer); the dense parameters take "
                 "sgd, momentum, nesterov, adagrad or adam", optimizer_name(c.dense.kind));
  const LrSchedule& s = c.schedule;
  SPARTA_REQUIRE(s.warmup_steps >= 0 && s.decay_start >= 0 && s.decay_steps >= 0,
                 "optimizer.warmup_steps, optimizer.decay_start, optimizer.decay_steps: expected >= 0, found %lld, "
                 "%lld, %lld", (long long)s.warmup_steps, (long long)s.decay_start, (long long)s.decay_steps);
  SPARTA_REQUIRE(s.decay_steps == 0 || s.decay_start >= s.warmup_steps,
                 "optimizer.decay_start: the decay starts after the warm-up (%lld steps), found %lld",
                 (long long)s.warmup_steps, (long long)s.decay_start);
  SPARTA_REQUIRE(s.decay_power > 0 && s.end_lr >= 0 && s.end_lr <= s.lr,
                 "optimizer.decay_power, optimizer.end_lr: expected a power > 0 and 0 <= end_lr <= lr (%g), found "
                 "%g and %g", s.lr, s.decay_power, s.end_lr);
  SPARTA_REQUIRE(c.steps >= 0, "train.steps: expected >= 0 (0: train.epochs), found %lld", (long long)c.steps);
  SPARTA_REQUIRE(c.epochs > 0 && std::isfinite(c.epochs), "train.epochs: expected > 0 (fractions allowed), found %g",
                 c.epochs);
  SPARTA_REQUIRE(c.normalize == "none" || c.normalize == "standardize",
                 "data.normalize: expected none or standardize, found '%s'", c.normalize.c_str());
  SPARTA_REQUIRE(c.normalize_samples >= 0, "data.normalize_samples: expected >= 0 (0: all), found %lld",
                 (long long)c.normalize_samples);
  SPARTA_REQUIRE(c.shuffle_block >= 0, "data.shuffle_block: expected >= 0 (0: the file's chunk), found %lld",
                 (long long)c.shuffle_block);
  SPARTA_REQUIRE(c.best_metric == "auc" || c.best_metric == "logloss",
                 "train.best_metric: expected auc or logloss, found '%s'", c.best_metric.c_str());
  SPARTA_REQUIRE(c.patience >= 0, "train.patience: expected >= 0 (0: no early stop), found %lld",
                 (long long)c.patience);
  SPARTA_REQUIRE(!(c.keep_best || c.patience > 0) || !c.eval_path.empty(),
                 "train.keep_best, train.patience: choosing a model by its evaluations needs an evaluation set "
                 "(data.eval)");
  SPARTA_REQUIRE(!c.keep_best || !c.checkpoint_dir.empty(),
                 "train.keep_best: the best model is kept as a checkpoint, so train.checkpoint_dir is needed");
  SPARTA_REQUIRE(c.log_every >= 1, "train.log_every: expected >= 1, found %lld", (long long)c.log_every);
  SPARTA_REQUIRE(c.eval_every >= 0, "train.eval_every: expected >= 0 (0: at the end), found %lld",
                 (long long)c.eval_every);
  SPARTA_REQUIRE(c.checkpoint_every >= 0, "train.checkpoint_every: expected >= 0 (0: at the end), found %lld",
                 (long long)c.checkpoint_every);
  SPARTA_REQUIRE(c.target_auc >= 0 && c.target_auc <= 1, "train.target_auc: expected a value in [0, 1], found %g",
                 c.target_auc);
  SPARTA_REQUIRE(c.target_auc == 0 || !c.eval_path.empty(),
                 "train.target_auc: stopping at an AUC needs an evaluation set (data.eval)");
  SPARTA_REQUIRE(c.keep_last >= 0 && c.keep_last <= 1000000, "train.keep_last: expected 0 (keep all) or a count, found %lld",
                 (long long)c.keep_last);
  SPARTA_REQUIRE(!c.resume || !c.checkpoint_dir.empty(),
                 "train.resume: resuming needs train.checkpoint_dir (the folder whose `latest` to continue from)");
  LossScaler(c.loss_scale_init, c.loss_scale_window);  // throws naming the option
  SPARTA_REQUIRE(c.comm_mode == "hier" || c.comm_mode == "mpi" || c.comm_mode == "nccl",
                 "comm.mode: expected hier, mpi or nccl, found '%s'", c.comm_mode.c_str());
  SPARTA_REQUIRE(c.comm_timeout_s > 0, "comm.timeout: expected seconds > 0, found %g", c.comm_timeout_s);
}

std::string TrainConfig::to_ini() const {
  std::ostringstream s;
  s.precision(9);
  auto opt = [&](const OptimizerConfig& o, const char* key) {
    s << key << " = " << optimizer_name(o.kind) << "\nlr = " << o.lr << "\nmomentum = " << o.momentum
      << "\nbeta1 = " << o.beta1 << "\nbeta2 = " << o.beta2 << "\nepsilon = " << o.epsilon
      << "\ninitial_accumulator = " << o.initial_accumulator << "\n";
  };
  s << "[data]\ntrain = " << train_path << "\neval = " << eval_path << "\nglobal_batch = " << global_batch
    << "\neval_batch = " << eval_batch << "\neval_samples = " << eval_samples << "\nshuffle = " << shuffle
    << "\nshuffle_block = " << shuffle_block << "\nnormalize = " << normalize
    << "\nnormalize_samples = " << normalize_samples << "\nprefetch = " << prefetch << "\n\n";
  s << "[model]\ninteraction = " << interaction_name(model.interaction) << "\nnum_dense = " << model.num_dense
    << "\nnum_slots = " << model.num_slots << "\nembedding_dim = " << model.embedding_dim
    << "\nbottom_mlp = " << widths_text(model.bottom_mlp) << "\ntop_mlp = " << widths_text(model.top_mlp)
    << "\ncross_layers = " << model.cross_layers << "\ncross_rank = " << model.cross_rank
    << "\nprecision = " << precision_name(model.precision) << "\ndropout = " << model.dropout << "\nseed = " << seed
    << "\n\n";
  s << "[embedding]\nrows = " << rows << "\nplacement = " << placement << "\ncombiner = " << combiner << "\n";
  opt(sparse, "optimizer");
  s << "weight_decay = " << sparse.weight_decay << "\natomic_update = " << sparse.atomic_update << "\ninit_scale = " << init_scale << "\nhot_rows = " << hot_rows << "\nmemory_mb = " << memory_mb
    << "\nexchange = " << exchange << "\nstorage = " << storage
    << "\nindex = " << index << "\ntier = " << tier << "\ncache_rows = " << cache_rows << "\ncache_mb = " << cache_mb
    << "\neviction = " << eviction
    << "\nplanner_link_gbps = " << planner_rates.link_GBps << "\nplanner_hbm_gbps = " << planner_rates.hbm_GBps
    << "\n\n";
  s << "[optimizer]\n";
  opt(dense, "kind");
  s << "weight_decay = " << dense.weight_decay << "\n";
  s << "warmup_steps = " << schedule.warmup_steps << "\ndecay_start = " << schedule.decay_start
    << "\ndecay_steps = " << schedule.decay_steps << "\ndecay_power = " << schedule.decay_power
    << "\nend_lr = " << schedule.end_lr << "\n\n";
  s << "[train]\nsteps = " << steps << "\nepochs = " << epochs << "\nlog_every = " << log_every
    << "\neval_every = " << interval_text(eval_every, eval_every_epochs) << "\ntarget_auc = " << target_auc
    << "\ncheckpoint_dir = " << checkpoint_dir
    << "\ncheckpoint_every = " << interval_text(checkpoint_every, checkpoint_every_epochs)
    << "\nkeep_last = " << keep_last << "\nkeep_best = " << keep_best << "\nbest_metric = " << best_metric << "\npatience = " << patience
    << "\nresume = " << resume << "\nmetrics = " << metrics_path
    << "\nloss_scale_init = " << loss_scale_init << "\nloss_scale_window = " << loss_scale_window
    << "\ncuda_graphs = " << cuda_graphs
    << "\n\n[comm]\nmode = " << comm_mode << "\ntimeout = " << comm_timeout_s << "\ncheck_calls = " << comm_check_calls
    << "\n";
  return s.str();
}

}  // namespace sparta
