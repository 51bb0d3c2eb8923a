// train_options.cpp: the Boost.Program_options half of train_config.h (linked into programs and tests, like
// src/options.cpp): the options, their help, the INI file and the command line.
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "src/base/check.h"
#include "src/base/log.h"
#include "src/options.h"
#include "src/train_config.h"

namespace sparta {

namespace {

// The values that need converting after parsing (names, lists, 64-bit seeds).
struct Texts {
  std::string interaction, bottom, top, precision, sparse_kind, dense_kind;
  std::string eval_every = "0", checkpoint_every = "0";
  unsigned long long seed = 1;
};

void add_optimizer(po::options_description& d, const std::string& s, OptimizerConfig& o, std::string& kind,
                   const char* what, const char* default_kind, float default_lr) {
  // the tables' optimizer is embedding.optimizer; the dense one optimizer.kind
  const std::string key = s == "embedding" ? s + ".optimizer" : s + ".kind";
  d.add_options()(key.c_str(), po::value<std::string>(&kind)->default_value(default_kind),
                  (std::string(what) + " optimizer: sgd | momentum | nesterov | adagrad | adam" +
                   (s == "embedding" ? " | rowwise_adagrad (one accumulator per row: the mean of the squared "
                                       "gradient, as FBGEMM's EXACT_ROWWISE_ADAGRAD) | lazy_adam (adam on the rows a "
                                       "batch touched, the missed decay caught up)"
                                     : "") + " (formulas: kernels/sparse_optimizer.h)").c_str())(
      (s + ".lr").c_str(), po::value<float>(&o.lr)->default_value(default_lr),
      (s == "embedding" ? "learning rate of the tables (constant)" : "peak learning rate of the dense parameters"))(
      (s + ".momentum").c_str(), po::value<float>(&o.momentum)->default_value(0.9f, "0.9"), "momentum, nesterov: momentum")(
      (s + ".beta1").c_str(), po::value<float>(&o.beta1)->default_value(0.9f, "0.9"), "adam: first-moment decay")(
      (s + ".beta2").c_str(), po::value<float>(&o.beta2)->default_value(0.999f, "0.999"), "adam: second-moment decay")(
      (s + ".epsilon").c_str(), po::value<float>(&o.epsilon)->default_value(1e-8f, "1e-8"), "adagrad, adam: epsilon")(
      (s + ".initial_accumulator").c_str(), po::value<float>(&o.initial_accumulator)->default_value(0.f, "0"),
      "adagrad, rowwise_adagrad: the accumulator's start");
}

po::options_description config_options(TrainConfig& c, Texts& t) {
  po::options_description data("[data]"), model("[model]"), emb("[embedding] (one table per slot, named table<slot>)"),
      opt("[optimizer] (the dense parameters)"), train("[train]"), comm("[comm]");
  data.add_options()("data.train", po::value<std::string>(&c.train_path), "training dataset (HDF5, io/dataset.h)")(
      "data.eval", po::value<std::string>(&c.eval_path)->default_value(""), "evaluation dataset (\"\": no evaluation); "
      "its dense features, slots and cardinalities must be the training file's")(
      "data.global_batch", po::value<int64_t>(&c.global_batch)->default_value(4096),
      "samples per step over all ranks (each rank takes its slice; the loss is the global batch's mean)")(
      "data.eval_batch", po::value<int64_t>(&c.eval_batch)->default_value(0), "samples per evaluation batch over all ranks (0: data.global_batch)")(
      "data.eval_samples", po::value<int64_t>(&c.eval_samples)->default_value(0), "evaluate on the first N samples of data.eval (0: all)")(
      "data.shuffle", po::value<bool>(&c.shuffle)->default_value(true),
      "shuffle the training file anew each epoch (deterministic by model.seed): the epoch's order is a permutation "
      "of blocks of data.shuffle_block consecutive samples")(
      "data.shuffle_block", po::value<int64_t>(&c.shuffle_block)->default_value(0),
      "samples the shuffle keeps together, in file order (1: every sample on its own, the best mix, slower reads; "
      "0: the file's HDF5 chunk along the samples, 65536 in files without chunks); lower it for a file ordered by "
      "time or by label")(
      "data.prefetch", po::value<int>(&c.prefetch)->default_value(2), "batches read ahead by a background thread")(
      "data.normalize", po::value<std::string>(&c.normalize)->default_value("none"),
      "none | standardize: every dense feature as (x - mean) / std, the statistics of the training file (its first "
      "data.normalize_samples samples), kept in the checkpoint so that a resumed run and sparta-predict apply the same")(
      "data.normalize_samples", po::value<int64_t>(&c.normalize_samples)->default_value(1000000),
      "samples the dense statistics are taken from (0: the whole training file)");
  model.add_options()("model.interaction", po::value<std::string>(&t.interaction)->default_value("dot"),
                      "dot (DLRM: pairwise dots of the bottom output and the embeddings) | dcnv2 (a low-rank cross "
                      "network over [bottom output, embeddings])")(
      "model.num_dense", po::value<int>(&c.model.num_dense)->default_value(-1),
      "dense features the model expects (-1: the training file's; otherwise the file must have this many)")(
      "model.num_slots", po::value<int>(&c.model.num_slots)->default_value(-1),
      "sparse slots the model expects (-1: the training file's; otherwise the file must have this many)")(
      "model.embedding_dim", po::value<int>(&c.model.embedding_dim)->default_value(128), "width of every embedding row")(
      "model.bottom_mlp", po::value<std::string>(&t.bottom)->default_value("512,256,128"),
      "bottom MLP widths after the dense features, ReLU after each (dot: the last is model.embedding_dim)")(
      "model.top_mlp", po::value<std::string>(&t.top)->default_value("1024,1024,512,256,1"),
      "top MLP widths after the interaction, ReLU after all but the last, which is 1 (the logit)")(
      "model.cross_layers", po::value<int>(&c.model.cross_layers)->default_value(3), "dcnv2: cross layers")(
      "model.cross_rank", po::value<int>(&c.model.cross_rank)->default_value(512), "dcnv2: rank of each cross layer's U V")(
      "model.precision", po::value<std::string>(&t.precision)->default_value("fp32"),
      "fp32 | bf16 | fp16 (16-bit GEMM inputs, fp32 accumulation, fp32 master weights; fp16 with dynamic loss "
      "scaling, train.loss_scale_*)")(
      "model.dropout", po::value<float>(&c.model.dropout)->default_value(0.f, "0"),
      "probability of dropping each of the top MLP's hidden outputs in training (the rest scaled by 1 / (1 - p)); "
      "none in evaluation")(
      "model.seed", po::value<unsigned long long>(&t.seed)->default_value(1),
      "seed of the initial dense parameters and embedding rows and of the shuffling");
  emb.add_options()("embedding.rows", po::value<int64_t>(&c.rows)->default_value(0),
                    "rows of every table (0: its slot's cardinality; required for unbounded slots)")(
      "embedding.placement", po::value<std::string>(&c.placement)->default_value("auto"),
      "auto (the planner) | dispatch | localized[:rank] | replicated | distributed | hybrid; one for all tables, "
      "or a comma list with one per table")(
      "embedding.combiner", po::value<std::string>(&c.combiner)->default_value("sum"), "pooling of a slot's keys: sum | mean")(
      "embedding.init_scale", po::value<float>(&c.init_scale)->default_value(0.05f, "0.05"),
      "a row's first values are uniform in +-init_scale, drawn from (seed, table, key)")(
      "embedding.hot_rows", po::value<int64_t>(&c.hot_rows)->default_value(0), "hybrid: replicated frequent rows per table (0: the planner's default)")(
      "embedding.memory_mb", po::value<double>(&c.memory_mb)->default_value(0),
      "device memory per rank for the tables and their workspaces, MiB; the planner must fit it (0: this device's "
      "free memory, shared among the ranks that drive it, less what the rest of the job takes: the dense model, "
      "its optimizer state and activations, the batches)")(
      "embedding.index", po::value<std::string>(&c.index)->default_value("hashed"),
      "hashed | direct: direct indexes keys by value (a lookup reads the row only); every slot needs a cardinality "
      "and embedding.rows 0")(
      "embedding.tier", po::value<std::string>(&c.tier)->default_value("hbm"),
      "hbm | host | auto: host keeps every row and its optimizer state in host memory under a GPU cache of the hot "
      "rows (each rank caches its own shard; the same results bit for bit); auto: HBM where the planner finds room, "
      "else host (under embedding.cache_rows or cache_mb if given, else the cache the memory budget leaves); one for "
      "all tables, or a comma list with one per table")(
      "embedding.cache_rows", po::value<int64_t>(&c.cache_rows)->default_value(0),
      "tier host (or auto): rows of each table's GPU cache per rank (a batch's distinct keys must fit)")(
      "embedding.cache_mb", po::value<double>(&c.cache_mb)->default_value(0),
      "tier host (or auto): the GPU cache per table and rank in MiB of rows (values and optimizer state), instead of "
      "cache_rows")(
      "embedding.eviction", po::value<std::string>(&c.eviction)->default_value("lru"),
      "tier host: the cache's policy: lru (least recently used batch) | lfu (fewest uses); ties by key")(
      "embedding.exchange", po::value<std::string>(&c.exchange)->default_value("fp32"),
      "fp32 | bf16: bf16 halves the bytes between ranks; vectors and gradients rounded to bf16 on the way, sums in fp32")(
      "embedding.storage", po::value<std::string>(&c.storage)->default_value("fp32"),
      "fp32 | bf16 | fp16: the rows (not the optimizer's one float per row) in 16 bits, half the bytes of every "
      "lookup and update; arithmetic in fp32, each update rounded stochastically (reproducible from train.seed); "
      "16-bit takes embedding.optimizer sgd or rowwise_adagrad, an even dim, no atomic_update")(
      "embedding.planner_link_gbps", po::value<double>(&c.planner_rates.link_GBps)->default_value(PlannerRates().link_GBps),
      "the planner's link rate: GB/s one rank sends plus receives in an all-to-all (NVLink H100/H200; lower it "
      "across nodes, e.g. 85 for one 400 Gb/s NIC per GPU)")(
      "embedding.planner_hbm_gbps", po::value<double>(&c.planner_rates.hbm_GBps)->default_value(PlannerRates().hbm_GBps),
      "the planner's effective GB/s of local device passes (lookups, sorts, gathers, updates)");
  add_optimizer(emb, "embedding", c.sparse, t.sparse_kind, "the tables'", "rowwise_adagrad", 0.05f);
  emb.add_options()("embedding.weight_decay", po::value<float>(&c.sparse.weight_decay)->default_value(0.f, "0"),
                    "L2 on the rows a step touches: each row's gradient + weight_decay * row before the optimizer");
  emb.add_options()("embedding.atomic_update", po::value<bool>(&c.sparse.atomic_update)->default_value(false),
                    "sgd only: each key's update added to its row with float atomics (no sort; faster with many "
                    "keys, not bitwise reproducible); replicated tables on more than one rank stay sorted (their "
                    "copies must agree)");
  add_optimizer(opt, "optimizer", c.dense, t.dense_kind, "the dense parameters'", "adam", 1e-3f);
  opt.add_options()("optimizer.weight_decay", po::value<float>(&c.dense.weight_decay)->default_value(0.f, "0"),
                    "L2 on the dense parameters: every step's gradient + weight_decay x the parameter")(
      "optimizer.warmup_steps", po::value<int64_t>(&c.schedule.warmup_steps)->default_value(0),
                    "linear warm-up of the learning rate over N steps")(
      "optimizer.decay_start", po::value<int64_t>(&c.schedule.decay_start)->default_value(0), "step after which the polynomial decay starts")(
      "optimizer.decay_steps", po::value<int64_t>(&c.schedule.decay_steps)->default_value(0), "steps of the decay to optimizer.end_lr (0: no decay)")(
      "optimizer.decay_power", po::value<double>(&c.schedule.decay_power)->default_value(2.0), "power of the decay")(
      "optimizer.end_lr", po::value<float>(&c.schedule.end_lr)->default_value(0.f, "0"), "learning rate at the end of the decay");
  train.add_options()("train.steps", po::value<int64_t>(&c.steps)->default_value(0), "optimizer steps (0: train.epochs epochs)")(
      "train.epochs", po::value<double>(&c.epochs)->default_value(1), "epochs when train.steps is 0 (fractions allowed: "
      "2.5 epochs are round(2.5 x batches per epoch) steps)")(
      "train.log_every", po::value<int64_t>(&c.log_every)->default_value(100), "progress line and train metrics every N steps")(
      "train.eval_every", po::value<std::string>(&t.eval_every)->default_value("0"),
      "evaluate every N steps, or every epoch (\"epoch\"), or every X epochs (\"0.5 epoch\"); 0: at the end only")(
      "train.keep_best", po::value<bool>(&c.keep_best)->default_value(false)->implicit_value(true),
      "keep the best model: a checkpoint at every evaluation that improves train.best_metric, and at the end the "
      "best one is the model, and `latest` in train.checkpoint_dir (which sparta-predict reads) names it")(
      "train.best_metric", po::value<std::string>(&c.best_metric)->default_value("auc"),
      "auc (higher is better) | logloss (lower is better): what train.keep_best and train.patience judge")(
      "train.patience", po::value<int64_t>(&c.patience)->default_value(0),
      "early stop: end the run after N evaluations in a row without improvement of train.best_metric (0: never)")(
      "train.target_auc", po::value<double>(&c.target_auc)->default_value(0), "stop once an evaluation reaches this AUC (0: never)")(
      "train.checkpoint_dir", po::value<std::string>(&c.checkpoint_dir)->default_value(""),
      "checkpoint folder (io/checkpoint.h: step-<n>/, latest); \"\": no checkpoints")(
      "train.checkpoint_every", po::value<std::string>(&t.checkpoint_every)->default_value("0"),
      "a checkpoint every N steps, or every epoch (\"epoch\", \"0.5 epoch\"), besides the one at the end (0: the end only)")(
      "train.keep_last", po::value<int64_t>(&c.keep_last)->default_value(0),
      "keep the newest N checkpoints that verify, removing older ones after each save (0: keep all)")(
      "train.resume", po::value<bool>(&c.resume)->default_value(false)->implicit_value(true),
      "continue from train.checkpoint_dir's latest checkpoint (any rank count and plan)")(
      "train.metrics", po::value<std::string>(&c.metrics_path)->default_value(""), "JSON lines of train and eval metrics (\"\": none)")(
      "train.loss_scale_init", po::value<double>(&c.loss_scale_init)->default_value(65536),
      "fp16: the first loss scale, a power of two (halved at every overflowed step, which is skipped; not below 1)")(
      "train.loss_scale_window", po::value<int64_t>(&c.loss_scale_window)->default_value(2000),
      "fp16: good steps in a row after which the loss scale doubles")(
      "train.cuda_graphs", po::value<bool>(&c.cuda_graphs)->default_value(true),
      "GPUs: record the dense model's forward, loss and backward as CUDA graphs and replay them while batch and "
      "buffers stay the same (one launch each instead of one per kernel and GEMM); no effect on the cpu backend");
  comm.add_options()("comm.mode", po::value<std::string>(&c.comm_mode)->default_value("hier"),
                     "hier (NCCL in a node, MPI between nodes) | mpi | nccl (comm/communicator.h)")(
      "comm.timeout", po::value<double>(&c.comm_timeout_s)->default_value(300),
      "seconds a wait may make no progress before the job ends, naming the operation and its peers")(
      "comm.check_calls", po::value<bool>(&c.comm_check_calls)->default_value(false),
      "every rank's calls compared before they start; a difference ends the job naming both (debugging a hang; "
      "also SPARTA_COMM_CHECK=1)");
  po::options_description all;
  all.add(data).add(model).add(emb).add(opt).add(train).add(comm);
  return all;
}

GemmType parse_precision(const std::string& s) {
  if (s == "fp32") return GemmType::f32;
  if (s == "bf16") return GemmType::bf16;
  if (s == "fp16") return GemmType::f16;
  throw Error("model.precision: expected fp32, bf16 or fp16, found '" + s + "'");
}

OptimizerKind optimizer_kind(const char* option, const std::string& name) {
  try {
    return parse_optimizer(name);
  } catch (const Error& e) {
    throw Error(std::string(option) + ": " + e.what());
  }
}

void finish(TrainConfig& c, const Texts& t) {
  c.model.interaction = parse_interaction(t.interaction);
  c.model.bottom_mlp = parse_widths("model.bottom_mlp", t.bottom);
  c.model.top_mlp = parse_widths("model.top_mlp", t.top);
  c.model.precision = parse_precision(t.precision);
  c.seed = t.seed;
  c.sparse.kind = optimizer_kind("embedding.optimizer", t.sparse_kind);
  c.dense.kind = optimizer_kind("optimizer.kind", t.dense_kind);
  c.schedule.lr = c.dense.lr;
  parse_interval("train.eval_every", t.eval_every, c.eval_every, c.eval_every_epochs);
  parse_interval("train.checkpoint_every", t.checkpoint_every, c.checkpoint_every, c.checkpoint_every_epochs);
  const std::string& d = c.context.device;
  SPARTA_REQUIRE(d == "cpu" || d == "cuda" || d == "auto", "--device: expected cpu, cuda or auto, found '%s'", d.c_str());
  SPARTA_REQUIRE(c.context.ranks_per_node >= 0, "--ranks-per-node: expected >= 0, found %d", c.context.ranks_per_node);
  check_train_config(c);
}

void store_config_file(std::istream& in, const std::string& where, const po::options_description& desc,
                       po::variables_map& vm) {
  try {
    po::store(po::parse_config_file(in, desc, false), vm);
  } catch (const po::error& e) {
    throw Error("config file " + where + ": " + e.what());
  }
}

// Options that older checkpoints' configs hold and this version no longer has (each changed no result): their
// lines are left out when a checkpoint's config is read back, so those checkpoints still load.
std::string without_retired_options(const std::string& ini) {
  static const char* const kRetired[] = {"embedding.overlap", "embedding.route_ahead", "embedding.high_priority",
                                         "embedding.planner_collective_us", "embedding.planner_group_us"};
  std::istringstream in(ini);
  std::string out, section, line;
  while (std::getline(in, line)) {
    const size_t b = line.find_first_not_of(" \t");
    if (b != std::string::npos && line[b] == '[') {
      section = line.substr(b + 1, line.find(']', b) - b - 1);
    } else if (b != std::string::npos) {
      const size_t eq = line.find('=');
      const std::string key = line.substr(b, (eq == std::string::npos ? line.size() : eq) - b);
      const std::string name = section + "." + key.substr(0, key.find_last_not_of(" \t") + 1);
      bool retired = false;
      for (const char* r : kRetired) retired = retired || name == r;
      if (retired) continue;
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace

bool parse_train_config(int argc, char** argv, TrainConfig& c) {
  Texts t;
  po::options_description common("common options");
  add_common_options(common, c.context, c.log_level);
  common.add_options()("config", po::value<std::string>(&c.config_file)->default_value(""),
                       "INI file: [section] then key = value lines for the options section.key below; the "
                       "command line overrides it");
  po::options_description file = config_options(c, t);
  po::options_description all("sparta-train options (every section.key may be given in --config FILE or as "
                              "--section.key VALUE)");
  all.add(common).add(file);
  po::variables_map vm;
  // Command line first: Boost keeps the first value stored, so it overrides the file.
  try {
    po::store(po::command_line_parser(argc, argv).options(all).run(), vm);
  } catch (const po::error& e) {
    throw Error(std::string("options: ") + e.what());
  }
  if (vm.count("help")) {
    int rank = 0, up = 0;
    MPI_Initialized(&up);
    if (up) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
      std::cout << "usage: mpiexec -n N sparta-train --config FILE [--section.key VALUE ...]\n"
                   "Trains a DLRM or DCNv2 model: embeddings sharded over the ranks, the dense part data-parallel.\n\n"
                << all << std::endl;
    return false;
  }
  if (vm.count("config") && !vm["config"].as<std::string>().empty()) {
    const std::string path = vm["config"].as<std::string>();
    std::error_code ec;
    SPARTA_REQUIRE(!std::filesystem::is_directory(path, ec), "--config '%s': is a directory; expected an INI file",
                   path.c_str());
    SPARTA_REQUIRE(std::filesystem::exists(path, ec), "--config '%s': no such file", path.c_str());
    std::ifstream in(path);
    SPARTA_REQUIRE(in.good(), "--config '%s': cannot be opened for reading", path.c_str());
    store_config_file(in, "'" + path + "'", file, vm);
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(std::string("options: ") + e.what());
  }
  set_log_level(parse_log_level(c.log_level));
  finish(c, t);
  return true;
}

TrainConfig parse_train_config_text(const std::string& ini, const std::string& where) {
  TrainConfig c;
  Texts t;
  po::options_description file = config_options(c, t);
  po::variables_map vm;
  std::istringstream in(without_retired_options(ini));
  store_config_file(in, where, file, vm);
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(where + ": " + e.what());
  }
  finish(c, t);
  return c;
}

}  // namespace sparta
