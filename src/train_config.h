// train_config.h: everything sparta-train and sparta-predict are told: an INI file (--config FILE) whose
// [section] key = value lines are the options section.key, overridden by the same options on the command line
// (--optimizer.lr 0.1). Every option has a default and a line of help (`sparta-train --help`).
//
// The parsing is src/train_options.cpp (Boost.Program_options, which Debian ships as a non-PIC static archive:
// linked into programs and tests beside src/options.cpp, never into libsparta); the rest is train_config.cpp.
// The checks that need no file are check_train_config; the checks against the datasets (slots, dims, sizes)
// are the trainer's, before any work.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/embedding_types.h"
#include "src/context.h"
#include "src/model.h"
#include "src/planner.h"

namespace sparta {

// The learning rate of the dense optimizer at step t (from 1): linear warm-up over warmup_steps from
// lr / warmup_steps to lr, then constant, then from decay_start on a polynomial decay over decay_steps to
// end_lr: lr_t = end_lr + (lr - end_lr) (1 - min(t - decay_start, decay_steps) / decay_steps)^decay_power
// (MLPerf DLRM's schedule; decay_steps 0: no decay).
struct LrSchedule {
  float lr = 0.01f;
  int64_t warmup_steps = 0;
  int64_t decay_start = 0;
  int64_t decay_steps = 0;
  double decay_power = 2.0;
  float end_lr = 0.f;
};
float learning_rate(const LrSchedule& s, int64_t step);
// learning_rate(s, step) / s.lr: the schedule's factor, which the embedding tables' learning rates follow
// (1 when s.lr is 0).
float learning_rate_factor(const LrSchedule& s, int64_t step);

struct TrainConfig {
  // [data]
  std::string train_path;        // dataset files (io/dataset.h)
  std::string eval_path;         // "": no evaluation
  int64_t global_batch = 4096;   // samples per step over all ranks
  int64_t eval_batch = 0;        // samples per evaluation batch over all ranks (0: global_batch)
  int64_t eval_samples = 0;      // evaluate on the first eval_samples of the eval file (0: all)
  bool shuffle = true;           // shuffle the training file by blocks of shuffle_block samples, anew each epoch
  int64_t shuffle_block = 0;     // samples kept together by the shuffle (0: the file's HDF5 chunk along N)
  int prefetch = 2;              // batches the reader reads ahead
  // none | standardize: dense features as (x - mean) / std per feature, the statistics of the training file's
  // first normalize_samples samples (all: 0); kept in checkpoints, so a resumed run and sparta-predict apply the same
  std::string normalize = "none";
  int64_t normalize_samples = 1000000;

  // [model]: ModelConfig; num_dense and num_slots -1 take the training file's
  ModelConfig model;
  uint64_t seed = 1;             // initial dense parameters and embedding rows, shuffling

  // [embedding]: one table per slot, named table<slot>
  int64_t rows = 0;              // rows of every table (0: its slot's cardinality, required when unbounded)
  std::string placement = "auto";  // auto | dispatch | localized | replicated | distributed | hybrid, or a list
  std::string combiner = "sum";
  OptimizerConfig sparse;        // the tables' optimizer (constant learning rate)
  float init_scale = 0.05f;
  int64_t hot_rows = 0;          // hybrid: replicated frequent rows per table (0: the planner's default)
  double memory_mb = 0;          // device memory per rank for the tables (0: no limit)
  std::string exchange = "fp32";  // fp32 | bf16: the wire type of vectors and gradients between ranks
  // fp32 | bf16 | fp16: how the tables store their rows (src/embedding_table.h EmbeddingTableConfig::storage);
  // 16-bit storage takes embedding.optimizer sgd or rowwise_adagrad and an even model.embedding_dim
  std::string storage = "fp32";
  // hashed | direct: direct indexes every table's keys by value (src/placement.h direct_index): every slot needs
  // a cardinality and its table that many rows (embedding.rows 0)
  std::string index = "hashed";
  // Where the rows live (src/host_tier.h): hbm | host, one for all tables or a comma list with one per table; a
  // host table's GPU cache per rank: cache_rows, or cache_mb MiB of rows (one of them with host, none without);
  // the cache's eviction: lru | lfu
  std::string tier = "hbm";
  int64_t cache_rows = 0;
  double cache_mb = 0;
  std::string eviction = "lru";
  // The planner's rates: link and HBM from planner_link_gbps, planner_hbm_gbps (each > 0; a cluster's NICs or
  // another GPU generation), its fixed costs per collective and per group always its defaults
  PlannerRates planner_rates;

  // [optimizer]: the dense optimizer and its schedule
  OptimizerConfig dense;
  LrSchedule schedule;

  // [train]
  int64_t steps = 0;             // optimizer steps (0: epochs x batches per epoch, rounded, at least 1)
  double epochs = 1;             // fractional epochs allowed
  int64_t log_every = 100;       // progress line and train metrics every N steps
  int64_t eval_every = 0;        // evaluate every N steps (0: at the end only)
  double eval_every_epochs = 0;  // > 0 (eval_every = "epoch", "0.5 epoch"): every so many epochs instead
  double target_auc = 0;         // > 0: stop once an evaluation reaches this AUC
  std::string checkpoint_dir;    // "": no checkpoints
  int64_t checkpoint_every = 0;  // also every N steps (0: at the end only)
  int64_t keep_last = 0;         // keep the newest N checkpoints that verify (0: all)
  double checkpoint_every_epochs = 0;  // > 0: every so many epochs instead ("epoch")
  // Model selection on the evaluations: keep_best saves a checkpoint at every evaluation that improves
  // best_metric (auc: higher, logloss: lower) and ends the run with the best one as the model and as `latest`;
  // patience > 0 stops the run after that many evaluations in a row without improvement.
  bool keep_best = false;
  std::string best_metric = "auc";
  int64_t patience = 0;
  bool resume = false;           // continue from checkpoint_dir/latest (any rank count, any plan)
  std::string metrics_path;      // JSON lines (rank 0); "": none
  double loss_scale_init = 65536;     // fp16: the first loss scale (a power of two; src/loss_scale.h)
  int64_t loss_scale_window = 2000;   // fp16: good steps in a row before the scale doubles
  bool cuda_graphs = true;       // GPUs: the dense model's pieces replayed as CUDA graphs (src/model.h)
  std::string comm_mode = "hier";  // [comm] mode: hier | mpi | nccl
  double comm_timeout_s = 300;     // [comm] timeout: seconds without progress before the job ends
  bool comm_check_calls = false;   // [comm] check_calls: every rank's calls compared before they start


  // Common options (not in the config text).
  ContextOptions context;
  std::string log_level = "info";
  std::string config_file;

  // The configuration as INI text: what a checkpoint records, and what parse_train_config_text reads back.
  std::string to_ini() const;
};

// Throws sparta::Error naming the option (section.key), what was expected and what was found, for values no
// dataset can make right: sizes < 1, an unknown placement, combiner or optimizer name, lazy_adam for the
// dense part, a negative count, a schedule that decays before it warms up, resume without a checkpoint folder.
void check_train_config(const TrainConfig& c);

// ---- src/train_options.cpp

// sparta-train's options. Returns false after printing --help (rank 0). Throws sparta::Error for an unknown
// option, a malformed value, a missing or malformed config file (naming the file and line), then runs
// check_train_config.
bool parse_train_config(int argc, char** argv, TrainConfig& c);

// The INI text of to_ini(), with nothing from the command line (a checkpoint's config). Throws sparta::Error
// naming `where` on anything malformed.
TrainConfig parse_train_config_text(const std::string& ini, const std::string& where);

// Splits "512,256,128" into widths; throws sparta::Error naming option on anything else.
std::vector<int> parse_widths(const std::string& option, const std::string& text);

// An interval of train.eval_every or train.checkpoint_every: "N" (steps), "epoch", "X epoch" or "Xepochs"
// (fractional epochs). Throws sparta::Error naming option on anything else.
void parse_interval(const std::string& option, const std::string& text, int64_t& steps, double& epochs);
std::string interval_text(int64_t steps, double epochs);  // what parse_interval reads back
// The interval in steps for an epoch of batches_per_epoch steps (0: none; at least 1 otherwise).
int64_t interval_steps(int64_t steps, double epochs, int64_t batches_per_epoch);
// The steps of a run: steps, else epochs x batches_per_epoch rounded (at least 1).
int64_t total_steps(const TrainConfig& c, int64_t batches_per_epoch);
// One line per part of the schedule that lies beyond a run of total steps (a warm-up that does not finish, a
// decay that never starts or does not reach end_lr), naming the options; empty when it all happens.
std::vector<std::string> schedule_warnings(const LrSchedule& s, int64_t total);

}  // namespace sparta
