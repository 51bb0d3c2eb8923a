// trainer.cpp: see trainer.h.
#include "src/trainer.h"

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cmath>
#include <sstream>

#include "comm/communicator.h"
#include "io/dataset.h"
#include "kernels/bce_loss.h"
#include "kernels/dense_optimizer.h"
#include "kernels/grad_scale.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/embedding_collection.h"
#include "src/planner.h"
#include "src/base/deadline.h"
#include "io/outputs.h"

namespace sparta {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string duration_text(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const long t = long(s + 0.5);
  return t >= 3600 ? strprintf("%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60) : strprintf("%ld:%02ld", t / 60, t % 60);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

// The planner's reserve: what the job allocates on the device after the plan (the memory the tables may not
// take). The dense parameters, gradients and optimizer state; two batches' buffers; the activations, bounded by
// every layer's width (and the interaction's) at the local batch, forward and backward; and a fixed margin for
// the communicator's buffers, cuBLAS workspaces and the runtime (1 GiB on a GPU, 64 MiB on the cpu backend).
size_t job_reserve(const TrainConfig& cfg, const Device& dev, int64_t local_batch, int64_t max_keys_per_sample) {
  const ModelConfig& m = cfg.model;
  const size_t P = DenseModel::param_count(m), B = size_t(std::max<int64_t>(1, local_batch));
  size_t widths = size_t(m.num_dense + 4 * m.embedding_width() + 2 * m.interaction_width());
  for (int w : m.bottom_mlp) widths += size_t(w);
  for (int w : m.top_mlp) widths += size_t(w);
  const size_t dense = (2 * P + dense_optimizer_state_size(cfg.dense.kind, P)) * sizeof(float);
  const size_t batches = 2 * B * ((1 + size_t(m.num_dense)) * sizeof(float) +
                                  (size_t(m.num_slots) + 1 + size_t(std::max<int64_t>(1, max_keys_per_sample))) * 8);
  const size_t activations = 2 * B * widths * sizeof(float);
  return dense + batches + activations + (dev.is_cuda() ? size_t(1) << 30 : size_t(64) << 20);
}

}  // namespace

Trainer::Trainer(const Context& ctx, const TrainConfig& cfg, TrainerMode mode, const std::string& load_from)
    : Trainer(MPI_COMM_WORLD, ctx.topo(), ctx.device(), cfg, mode, load_from) {}

Trainer::Trainer(MPI_Comm world, const Topology& topo, const Device& dev, const TrainConfig& cfg, TrainerMode mode,
                 const std::string& load_from)
    : world_comm_(world), topo_(topo), cfg_(cfg), dev_(dev) {
  MPI_CHECK(MPI_Comm_rank(world, &rank_));
  MPI_CHECK(MPI_Comm_size(world, &world_));
  agree(guarded([&] {
    check_train_config(cfg_);
    set_job_timeout(cfg_.comm_timeout_s);
  }));
  open_datasets(mode);
  if (mode == TrainerMode::train && cfg_.normalize == "standardize") standardize_dense();
  // Key statistics for the planner from the first batch of the data each rank reads.
  DatasetReader& sample_reader = mode == TrainerMode::train ? *train_ : *eval_;
  Batch b = sample_reader.make_batch();
  agree(guarded([&] { sample_reader.read_batch(0, 0, b); }));
  build_collection(b, sample_reader.options().global_batch);
  build_rest(!load_from.empty() ? load_from : cfg_.resume ? cfg_.checkpoint_dir : "");
}

Trainer::Trainer(MPI_Comm world, const Topology& topo, const Device& dev, const TrainConfig& cfg,
                 const DatasetSchema& schema, const Batch& sample, int64_t global_batch)
    : world_comm_(world), topo_(topo), cfg_(cfg), dev_(dev) {
  MPI_CHECK(MPI_Comm_rank(world, &rank_));
  MPI_CHECK(MPI_Comm_size(world, &world_));
  agree(guarded([&] {
    check_train_config(cfg_);
    schema_ = schema;
    set_shapes("benchmark data", "(in memory)");
    max_batch_ = std::max<int64_t>(1, sample.size);
  }));
  build_collection(sample, global_batch);
  build_rest("");
}

void Trainer::build_rest(const std::string& load_from) {
  CommOptions copt;
  agree(guarded([&] {
    copt.mode = parse_comm_mode(cfg_.comm_mode);
    copt.timeout_s = cfg_.comm_timeout_s;
    copt.check_calls = cfg_.comm_check_calls;
    SPARTA_REQUIRE(!(copt.mode == CommMode::nccl && !dev_.is_cuda()),
                   "comm.mode: nccl needs the cuda backend, and this rank runs on %s", dev_.name().c_str());
  }));
  comm_ = std::make_unique<Communicator>(topo_, dev_, copt);
  emb_dev_ = dev_;
  if (dev_.is_cuda()) {
    emb_stream_ = SideStream(dev_);
    emb_dev_.stream = emb_stream_.stream();
    emb_done_at_ = StreamEvent(dev_);
  }
  collection_ = std::make_unique<EmbeddingCollection>(world_comm_, comm_.get(), emb_dev_, collection_cfg_, plan_);
  ModelConfig m = cfg_.model;
  m.dropout_seed = hash_mix(cfg_.seed, uint64_t(rank_));  // each rank's slice its own dropout masks
  SPARTA_ASSERT(collection_->output_width() == m.embedding_width(), "collection width %lld, model expects %d",
                (long long)collection_->output_width(), m.embedding_width());
  agree(guarded([&] { model_ = std::make_unique<DenseModel>(dev_, m, max_batch_); }));
  model_->use_graphs(cfg_.cuda_graphs);
  const size_t P = model_->param_count();
  params_ = Buffer<float>(dev_, DenseModel::initial_params(m, cfg_.seed));
  grads_ = Buffer<float>(dev_, P);
  state_ = Buffer<float>(dev_, dense_optimizer_state_size(cfg_.dense.kind, P));
  dense_optimizer_init_state(dev_, cfg_.dense, state_.data(), P, dev_.stream);
  const size_t B = size_t(max_batch_);
  for (DeviceBatch& d : batches_) {
    d.labels = Buffer<float>(dev_, B);
    d.dense = Buffer<float>(dev_, B * m.num_dense);
    d.offsets = Buffer<int64_t>(dev_, B * m.num_slots + 1);
    d.keys = Buffer<int64_t>(dev_, std::max<size_t>(1, B * size_t(schema_.max_keys_per_sample())));
    d.copied = StreamEvent(dev_);
    d.read = StreamEvent(dev_);
  }
  if (dev_.is_cuda()) copy_stream_ = SideStream(dev_);
  labels_ = Buffer<float>(dev_, B);
  dense_ = Buffer<float>(dev_, B * m.num_dense);
  if (!in_x0()) emb_ = Buffer<float>(dev_, B * m.embedding_width());
  demb_ = Buffer<float>(dev_, B * m.embedding_width());
  probs_ = Buffer<float>(dev_, B);
  losses_ = Buffer<float>(dev_, size_t(cfg_.log_every));
  if (m.precision == GemmType::f16) {
    scaler_ = std::make_unique<LossScaler>(cfg_.loss_scale_init, cfg_.loss_scale_window);
    nonfinite_ = Buffer<int>(dev_, 1);
  }
  if (dev_.is_cuda()) grad_stream_ = SideStream(dev_);
  if (rank_ == 0) {
    LOG_INFO("model: %s; %zu dense parameters, dense optimizer %s", m.describe().c_str(), P,
             optimizer_name(cfg_.dense.kind));
    LOG_INFO("embedding plan (%d rank(s), global batch %lld):\n%s", world_, (long long)cfg_.global_batch,
             format_plan(collection_cfg_, plan_).c_str());
    LOG_INFO("%s", comm_->describe().c_str());
  }
  report_memory();
  if (!load_from.empty()) load(load_from);
}

void Trainer::agree(const std::string& error, const char* what) const { agree_on_error(world_comm_, error, what); }

Trainer::~Trainer() {
  if (comm_) synchronize_all();
  collection_.reset();  // its memory is freed while its stream still exists (the streams are members below it)
}

int64_t Trainer::graph_replays() const { return model_->graphs().replays(); }

void Trainer::synchronize_all() {
  comm_->synchronize(dev_.stream);
  if (emb_stream_.stream()) comm_->synchronize(emb_stream_.stream());
}

bool Trainer::in_x0() const {
  return cfg_.model.interaction == Interaction::dcnv2 && is_half(cfg_.model.precision);
}

void* Trainer::emb_out() {
  return in_x0() ? static_cast<void*>(model_->x0_half()) : static_cast<void*>(emb_.data());
}

const float* Trainer::model_forward(int64_t batch, int64_t train_step) {
  if (in_x0()) return model_->forward_in_x0(params_.data(), dense_.data(), batch, train_step);
  return model_->forward(params_.data(), dense_.data(), emb_.data(), batch, train_step);
}

void Trainer::wait_for_embeddings() { emb_stream_.join_into(dev_.stream); }

void Trainer::embeddings_wait() { emb_stream_.wait_for(dev_.stream); }

void Trainer::open_datasets(TrainerMode mode) {
  const bool training = mode == TrainerMode::train;
  predicting_ = !training;
  const std::string& data = training ? cfg_.train_path : cfg_.eval_path;
  // sparta-predict's errors name its own options (--data, --batch), not the training configuration's
  const char* option = training ? "data.train" : "--data";
  agree(guarded([&] {
    SPARTA_REQUIRE(!data.empty(), "%s: a dataset is required", option);
    SPARTA_REQUIRE(!training || cfg_.global_batch >= world_,
                   "data.global_batch: every rank needs samples, so a global batch of at least %d (the rank count) "
                   "is expected, found %lld", world_, (long long)cfg_.global_batch);
    const int64_t eval_batch = cfg_.eval_batch > 0 ? cfg_.eval_batch : cfg_.global_batch;
    SPARTA_REQUIRE(eval_batch >= world_, "%s: expected at least %d (the rank count), found %lld",
                   training ? "data.eval_batch" : "--batch", world_, (long long)eval_batch);
    ReaderOptions r;
    r.rank = rank_;
    r.world = world_;
    r.backend = dev_.backend;
    r.prefetch = cfg_.prefetch;
    if (training) {
      r.global_batch = cfg_.global_batch;
      r.drop_last = true;
      r.shuffle = cfg_.shuffle;
      r.shuffle_block = cfg_.shuffle_block;
      r.seed = cfg_.seed;
      train_ = std::make_unique<DatasetReader>(cfg_.train_path, r);
      schema_ = train_->schema();
      const int64_t blocks = (schema_.num_samples + train_->shuffle_block() - 1) / train_->shuffle_block();
      if (rank_ == 0 && cfg_.shuffle && blocks < 8)  // a file of one or a few chunks is hardly shuffled
        LOG_WARN("data.shuffle: %s holds %lld samples, only %lld block(s) of %lld (data.shuffle_block%s) to shuffle; "
                 "the samples of a block stay together in file order, so set data.shuffle_block lower (1: every "
                 "sample on its own)", cfg_.train_path.c_str(), (long long)schema_.num_samples, (long long)blocks,
                 (long long)train_->shuffle_block(), cfg_.shuffle_block > 0 ? "" : " 0: the file's chunk");
      SPARTA_REQUIRE(train_->batches_per_epoch() >= 1,
                     "data.global_batch: %lld samples per step, but %s '%s' holds only %lld samples",
                     (long long)cfg_.global_batch, option, data.c_str(), (long long)schema_.num_samples);
    }
    if (!cfg_.eval_path.empty()) {
      ReaderOptions e = r;
      e.global_batch = eval_batch;
      e.drop_last = false;
      e.shuffle = false;
      eval_ = std::make_unique<DatasetReader>(cfg_.eval_path, e);
      if (training) check_compatible(schema_, cfg_.train_path, eval_->schema(), cfg_.eval_path);
      else schema_ = eval_->schema();
      teacher_auc_ = eval_->schema().teacher_auc;
    }
    set_shapes(option, data);
    max_batch_ = std::max<int64_t>(1, std::max(train_ ? train_->max_local_batch() : 0,
                                               eval_ ? eval_->max_local_batch() : 0));
  }));
}

// data.normalize = standardize: the training file's statistics, each rank summing its share.
void Trainer::standardize_dense() {
  DenseSums s;
  agree(guarded([&] { s = dense_sums(cfg_.train_path, cfg_.normalize_samples, rank_, world_); }));
  const size_t D = s.sum.size();
  std::vector<double> all(2 * D + 1);
  std::copy(s.sum.begin(), s.sum.end(), all.begin());
  std::copy(s.sum_squares.begin(), s.sum_squares.end(), all.begin() + D);
  all[2 * D] = double(s.count);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, all.data(), int(all.size()), MPI_DOUBLE, MPI_SUM, world_comm_));
  const double n = std::max(1.0, all[2 * D]);
  std::vector<float> mean(D), scale(D);
  for (size_t j = 0; j < D; ++j) {
    const double m = all[j] / n, var = std::max(0.0, all[D + j] / n - m * m), sd = std::sqrt(var);
    mean[j] = float(m);
    scale[j] = sd > 1e-12 ? float(1.0 / sd) : 1.0f;  // a constant feature: only centred
  }
  if (rank_ == 0)
    LOG_INFO("data.normalize: dense features standardized by the statistics of %.0f samples of %s", n,
             cfg_.train_path.c_str());
  set_dense_transform(mean, scale);
}

void Trainer::set_dense_transform(const std::vector<float>& mean, const std::vector<float>& scale) {
  dense_mean_ = mean;
  dense_scale_ = scale;
  agree(guarded([&] {
    if (train_) train_->set_dense_transform(mean, scale);
    if (eval_) eval_->set_dense_transform(mean, scale);
  }));
}

// The model's shape against the data's.
void Trainer::set_shapes(const std::string& option, const std::string& path) {
  ModelConfig& m = cfg_.model;
  const char* dense_by = predicting_ ? "the checkpoint's model" : "the configuration (model.num_dense)";
  const char* slots_by = predicting_ ? "the checkpoint's model" : "the configuration (model.num_slots)";
  SPARTA_REQUIRE(m.num_dense < 0 || m.num_dense == schema_.num_dense,
                 "%s '%s': the file has %lld dense features per sample, %s expects %d", option.c_str(), path.c_str(),
                 (long long)schema_.num_dense, dense_by, m.num_dense);
  SPARTA_REQUIRE(m.num_slots < 0 || m.num_slots == schema_.num_slots,
                 "%s '%s': the file has %lld sparse slots per sample, %s expects %d", option.c_str(), path.c_str(),
                 (long long)schema_.num_slots, slots_by, m.num_slots);
  m.num_dense = int(schema_.num_dense);
  m.num_slots = int(schema_.num_slots);
  check_model_config(m);
  for (int64_t s = 0; s < schema_.num_slots; ++s)
    SPARTA_REQUIRE(cfg_.rows > 0 || schema_.cardinality[s] > 0,
                   "embedding.rows: slot %lld of %s '%s' has unbounded (hashed) keys, so the rows of its table "
                   "must be given (embedding.rows > 0)", (long long)s, option.c_str(), path.c_str());
}

void Trainer::build_collection(const Batch& b, int64_t global_batch) {
  const ModelConfig& m = cfg_.model;
  CollectionConfig& c = collection_cfg_;
  agree(guarded([&] {
    c.num_slots = m.num_slots;
    c.seed = cfg_.seed;
    c.exchange = cfg_.exchange == "bf16" ? DataType::bf16 : DataType::f32;
    if (in_x0()) {
      // DCNv2 in 16 bits: the embeddings pooled straight into the model's 16-bit x0 (after the bottom MLP's
      // columns), each value rounded once; their gradient comes back in float
      c.output = m.precision == GemmType::bf16 ? OutputType::bf16 : OutputType::f16;
      c.output_col = m.bottom_mlp.back();
      c.output_row = c.output_col + m.embedding_width();
      c.float_gradient = true;
    }
    const std::vector<std::string> placements = split_list(cfg_.placement);
    SPARTA_REQUIRE(placements.size() == 1 || placements.size() == size_t(m.num_slots),
                   "embedding.placement: expected one placement for every table or a list of %d (one per table), "
                   "found %zu in '%s'", m.num_slots, placements.size(), cfg_.placement.c_str());
    const std::vector<std::string> tiers = split_list(cfg_.tier);
    SPARTA_REQUIRE(tiers.size() == 1 || tiers.size() == size_t(m.num_slots),
                   "embedding.tier: expected one tier for every table or a list of %d (one per table), found %zu in "
                   "'%s'", m.num_slots, tiers.size(), cfg_.tier.c_str());
    for (int s = 0; s < m.num_slots; ++s) {
      CollectionTableConfig t;
      t.name = "table" + std::to_string(s);
      t.rows = cfg_.rows > 0 ? cfg_.rows : schema_.cardinality[s];
      t.key_bound = schema_.cardinality[s];  // keys in [0, cardinality); 0: unbounded
      t.direct_index = cfg_.index == "direct";
      SPARTA_REQUIRE(!t.direct_index || t.key_bound > 0,
                     "embedding.index: direct needs every slot's cardinality; slot %d of the training data has none "
                     "(unbounded keys)", s);
      t.dim = m.embedding_dim;
      t.combiner = parse_combiner(cfg_.combiner);
      t.optimizer = cfg_.sparse;
      t.storage = parse_row_storage(cfg_.storage);
      t.slots = {s};
      t.placement = placements.size() == 1 ? placements[0] : placements[s];
      t.hot_rows = cfg_.hot_rows;
      t.init_scale = cfg_.init_scale;
      t.tier = make_tier(parse_tier(tiers.size() == 1 ? tiers[0] : tiers[size_t(s)], "embedding.tier"),
                         cfg_.cache_rows, cfg_.cache_mb, parse_eviction(cfg_.eviction, "embedding.eviction"),
                         row_storage_floats(t.storage, t.dim), optimizer_state_width(t.optimizer.kind, t.dim));
      c.tables.push_back(t);
    }
    check_collection_config(c);
  }));
  std::vector<int64_t> offsets(b.offsets.data(), b.offsets.data() + b.size * m.num_slots + 1);
  std::vector<int64_t> keys(b.keys.data(), b.keys.data() + b.num_keys);
  PlannerOptions po;
  po.world = world_;
  po.global_batch = global_batch;
  po.backend = dev_.backend;
  po.memory_budget = cfg_.memory_mb > 0 ? size_t(cfg_.memory_mb * 1024 * 1024)
                                        : device_memory_budget(world_comm_, dev_,
                                                               job_reserve(cfg_, dev_, max_batch_,
                                                                           schema_.max_keys_per_sample()));
  po.rates = cfg_.planner_rates;
  const size_t max_top = size_t(std::max<int64_t>(cfg_.hot_rows, po.default_hot_rows));
  std::vector<TableKeyStats> stats = count_keys(world_comm_, c, offsets, keys, b.size, max_top);
  agree(guarded([&] { plan_ = make_plan(c, po, stats); }));
}

void Trainer::report_memory() const {
  const size_t P = model_->param_count();
  const size_t B = size_t(max_batch_);
  const DeviceBatch& d = batches_[0];
  double mine[3] = {double(collection_->memory_bytes()),
                    double((2 * P + state_.size()) * sizeof(float) + model_->workspace_bytes()),
                    double((B * (2 + cfg_.model.num_dense) + emb_.size() + demb_.size()) * sizeof(float) +
                           2 * ((d.labels.size() + d.dense.size()) * sizeof(float) +
                                (d.offsets.size() + d.keys.size()) * sizeof(int64_t)))};
  std::vector<double> all(size_t(3) * world_);
  timed_gather(mine, 3, MPI_DOUBLE, all.data(), 3, 0, world_comm_, "device memory report");
  if (rank_ != 0) return;
  std::string s = "device memory per rank (MiB): embeddings + dense parameters, gradients, optimizer state and "
                  "activations + batch buffers = total";
  for (int r = 0; r < world_; ++r) {
    const double* v = &all[size_t(3) * r];
    s += strprintf("\n  rank %d: %.1f + %.1f + %.1f = %.1f", r, v[0] / 1048576, v[1] / 1048576, v[2] / 1048576,
                   (v[0] + v[1] + v[2]) / 1048576);
  }
  LOG_INFO("%s", s.c_str());
}

// ---- checkpoints

ModelSpec Trainer::model_spec() const {
  ModelSpec spec;
  spec.tables = collection_->table_specs();
  for (const ParamPart& p : DenseModel::parts(cfg_.model)) spec.dense.push_back({p.name, p.shape});
  if (state_.size() > 0)
    spec.dense.push_back({std::string("dense_optimizer.") + optimizer_name(cfg_.dense.kind), {int64_t(state_.size())}});
  if (cfg_.normalize == "standardize") {  // the dense features' statistics (data.normalize)
    spec.dense.push_back({"data.dense_mean", {int64_t(cfg_.model.num_dense)}});
    spec.dense.push_back({"data.dense_scale", {int64_t(cfg_.model.num_dense)}});
  }
  return spec;
}

std::vector<DenseTensor> Trainer::dense_tensors() {
  synchronize_all();
  const std::vector<float> p = params_.download();
  std::vector<DenseTensor> out;
  for (const ParamPart& part : DenseModel::parts(cfg_.model))
    out.push_back({part.name, part.shape,
                   std::vector<float>(p.begin() + part.offset, p.begin() + part.offset + part.count())});
  if (state_.size() > 0)
    out.push_back({std::string("dense_optimizer.") + optimizer_name(cfg_.dense.kind), {int64_t(state_.size())},
                   state_.download()});
  if (cfg_.normalize == "standardize") {
    const int64_t D = cfg_.model.num_dense;
    out.push_back({"data.dense_mean", {D}, dense_mean_});
    out.push_back({"data.dense_scale", {D}, dense_scale_});
  }
  return out;
}

std::string Trainer::save() {
  CheckpointMeta meta;
  meta.step = step_;
  meta.plan = plan_summary(collection_cfg_, plan_);
  meta.config = cfg_.to_ini();
  meta.rng_state = {int64_t(cfg_.seed)};
  const int64_t bpe = train_->batches_per_epoch();
  meta.reader_position = {step_ / bpe, step_ % bpe, cfg_.global_batch};
  if (scaler_) meta.loss_scale = {scaler_->log2_scale(), scaler_->good_run()};
  std::vector<DenseTensor> dense = dense_tensors();
  if (rank_ != 0) dense.clear();
  const std::string dir = save_checkpoint(world_comm_, cfg_.checkpoint_dir, meta, dense, collection_->rows_to_save());
  LOG_INFO("checkpoint: step %lld -> %s", (long long)step_, dir.c_str());
  if (cfg_.keep_last > 0) {
    verified_steps_.insert(step_);  // the save checksummed every file it wrote from the disk
    agree(guarded([&] {
      if (rank_ != 0) return;
      for (int64_t s : prune_checkpoints(cfg_.checkpoint_dir, int(cfg_.keep_last), &verified_steps_))
        LOG_INFO("checkpoint: removed step %lld (train.keep_last %lld)", (long long)s, (long long)cfg_.keep_last);
    }), "checkpoint retention");
  }
  return dir;
}

void Trainer::load(const std::string& path) {
  const ModelSpec spec = model_spec();
  // a checkpoint root: the newest step that loads (falling back past one that does not verify, saying so)
  LoadedCheckpoint c = load_newest_checkpoint(world_comm_, path, spec,
                                              [this](int table, int64_t key) { return collection_->owner_of(table, key); });
  verified_steps_.insert(c.manifest.meta.step);
  agree(guarded([&] { collection_->load_rows(c.tables); }));
  const std::vector<ParamPart> parts = DenseModel::parts(cfg_.model);
  std::vector<float> p(model_->param_count());
  for (size_t i = 0; i < parts.size(); ++i)
    std::copy(c.dense[i].data.begin(), c.dense[i].data.end(), p.begin() + parts[i].offset);
  params_.upload(p);
  if (state_.size() > 0) state_.upload(c.dense[parts.size()].data);
  if (cfg_.normalize == "standardize") {  // the statistics the model was trained with
    const size_t at = parts.size() + (state_.size() > 0 ? 1 : 0);
    set_dense_transform(c.dense[at].data, c.dense[at + 1].data);
  }
  step_ = c.manifest.meta.step;
  // fp16: the scale goes on from where it was (a checkpoint without one, e.g. of another precision, keeps
  // train.loss_scale_init); a good run longer than this run's window starts the window again
  const std::vector<int64_t>& ls = c.manifest.meta.loss_scale;
  if (scaler_ && ls.size() == 2)
    agree(guarded([&] { scaler_->restore(ls[0], ls[1] < cfg_.loss_scale_window ? ls[1] : 0); }));
  const std::vector<int64_t>& pos = c.manifest.meta.reader_position;
  if (pos.size() == 3 && pos[2] != cfg_.global_batch)
    LOG_WARN("resume: the checkpoint was written with data.global_batch %lld, this run has %lld: the sample order "
             "differs from the original run's", (long long)pos[2], (long long)cfg_.global_batch);
  synchronize(dev_, dev_.stream);  // the host vectors above die here
  LOG_INFO("loaded %s: step %lld, written by %d rank(s) with plan %s", c.manifest.dir.c_str(),
           (long long)step_, c.manifest.meta.world_size, c.manifest.meta.plan.c_str());
}

// ---- one step

void Trainer::stage(const Batch& b) {
  const int at = staged_ && staged_at_ == fill_ ? 1 - fill_ : fill_;
  DeviceBatch& d = batches_[at];
  if (at == ahead_at_) {  // its keys are about to change
    collection_->forget_route_ahead();
    ahead_at_ = -1;
  }
  Stream s = copy_stream_.stream() ? copy_stream_.stream() : dev_.stream;
  d.read.wait_in(s);  // after the work that last read it
  const size_t B = size_t(b.size), S = size_t(b.num_slots);
  copy_to_device(dev_, d.labels.data(), b.labels.data(), B * sizeof(float), s);
  copy_to_device(dev_, d.dense.data(), b.dense.data(), B * size_t(b.num_dense) * sizeof(float), s);
  copy_to_device(dev_, d.offsets.data(), b.offsets.data(), (B * S + 1) * sizeof(int64_t), s);
  copy_to_device(dev_, d.keys.data(), b.keys.data(), size_t(b.num_keys) * sizeof(int64_t), s);
  d.copied.record(s);
  staged_ = &b;
  staged_at_ = at;
  fill_ = 1 - at;
}

Trainer::DeviceBatch& Trainer::take(const Batch& b) {
  if (staged_ != &b) stage(b);
  DeviceBatch& d = batches_[staged_at_];
  staged_ = nullptr;
  if (staged_at_ == ahead_at_) ahead_at_ = -1;  // the forward about to be queued takes the route
  d.copied.wait_in(dev_.stream);
  if (emb_stream_.stream()) d.copied.wait_in(emb_stream_.stream());
  const size_t B = size_t(b.size);
  copy_on_device(dev_, labels_.data(), d.labels.data(), B * sizeof(float), dev_.stream);
  copy_on_device(dev_, dense_.data(), d.dense.data(), B * size_t(b.num_dense) * sizeof(float), dev_.stream);
  // The collection writes the embeddings' output (emb_out()), which the compute stream's work may still read:
  // after a training step, up to the model's inputs_read only (emb_done_), so the next forward runs beside that
  // step's last dense layers; otherwise (evaluation, timed steps) up to all of its work so far.
  if (emb_done_ && emb_stream_.stream())
    emb_done_at_.wait_in(emb_stream_.stream());
  else
    embeddings_wait();
  emb_done_ = false;
  return d;
}

void Trainer::forget_staged() {
  staged_ = nullptr;
  if (ahead_at_ >= 0) collection_->forget_route_ahead();
  ahead_at_ = -1;
}

void Trainer::route_next(const Batch& nb) {
  if (staged_ != &nb) return;
  DeviceBatch& d = batches_[staged_at_];
  if (emb_stream_.stream()) d.copied.wait_in(emb_stream_.stream());  // the route reads its keys and offsets
  if (collection_->route_ahead(d.offsets.data(), d.keys.data(), nb.size)) ahead_at_ = staged_at_;
}

void Trainer::release(DeviceBatch& d) {
  wait_for_embeddings();  // the collection's last work may still read the keys and offsets
  d.read.record(dev_.stream);
}

void Trainer::copies_done() {
  if (copy_stream_.stream()) synchronize(dev_, copy_stream_.stream());
}

void Trainer::reduce_bucket(size_t offset, size_t count) {
  if (world_ == 1 || count == 0) return;
  Stream s = dev_.stream;
  if (grad_stream_.stream()) {
    grad_stream_.wait_for(dev_.stream);
    s = grad_stream_.stream();
  }
  comm_->all_reduce(grads_.data() + offset, grads_.data() + offset, count, DataType::f32, s);
}

void Trainer::join_grad_stream() {
  if (world_ > 1) grad_stream_.join_into(dev_.stream);
}

bool Trainer::unscale_gradients(int64_t batch) {
  join_grad_stream();
  unscale_and_check(dev_, grads_.data(), grads_.size(), demb_.data(), size_t(batch) * cfg_.model.embedding_width(),
                    1.f / scaler_->scale(), nonfinite_.data(), dev_.stream);
  comm_->synchronize(dev_.stream);
  int bad = 0;
  copy_to_host(dev_, &bad, nonfinite_.data(), sizeof(int), dev_.stream);
  // the dense gradients are the same on every rank after the all-reduce, the embedding gradient is each rank's
  if (world_ > 1) timed_allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, world_comm_, "fp16 overflow check");
  return scaler_->update(bad == 0);
}

void Trainer::train_step(const Batch& b, int64_t step, int64_t global_batch, float* loss_slot, const NextBatch& next,
                         bool look_ahead) {
  DeviceBatch& d = take(b);
  const int64_t size = b.size;
  // The next step's batch, fetched (b's memory may change then: its copies were done a step ago) and staged now,
  // its copies beside this step's forward; its route (the keys' sort, buckets, counts and exchange, with their
  // host waits) queued on the embeddings' stream as the dense backward is queued, before that stream waits for
  // the embeddings' gradient.
  const Batch* nb = next ? next() : nullptr;
  collection_->mark(dev_.stream, "dense: step");
  collection_->forward(d.offsets.data(), d.keys.data(), size, emb_out(), LookupMode::train);
  wait_for_embeddings();
  collection_->prepare_backward();  // on the collection's stream, beside the dense forward
  collection_->mark(dev_.stream, "dense: embeddings in");
  model_forward(size, step);
  model_->loss(labels_.data(), global_batch, loss_slot, scaler_ ? scaler_->scale() : 1.f);
  collection_->mark(dev_.stream, "dense: forward and loss");
  // The embeddings' backward starts as soon as demb is written (fp16: once it is unscaled), on their stream,
  // while the dense stream computes the weight gradients. The dense gradients' all-reduce goes after the
  // embeddings' exchange, which it would otherwise hold up (the communicator runs one collective at a time), and
  // overlaps the embeddings' update; fp16 needs it before (the overflow check reads the reduced gradients), so
  // there it runs per bucket during the backward.
  DenseModel::GradsReady buckets;
  if (scaler_) buckets = [this](size_t offset, size_t count) { reduce_bucket(offset, count); };
  model_->backward(
      params_.data(), grads_.data(), demb_.data(), buckets,
      [this, nb] {
        collection_->mark(dev_.stream, "dense: embeddings' gradient");
        if (nb) route_next(*nb);
        if (!scaler_) embeddings_wait();
      },
      [this] {
        // the last read of the embeddings' output in this step is queued (the interaction's backward, or the cross
        // network's V_0 gradient when they lie in x0's 16-bit array)
        if (emb_stream_.stream()) emb_done_at_.record(dev_.stream), emb_done_ = true;
      });
  collection_->mark(dev_.stream, "dense: backward");
  const bool apply = !scaler_ || unscale_gradients(size);  // fp16: false for an overflowed step
  if (!apply) skipped_.push_back(step);
  if (scaler_) embeddings_wait();
  if (apply) collection_->backward(demb_.data(), step, learning_rate_factor(cfg_.schedule, step));
  // The next batch routed ahead: its lookups and their exchanges now, beside the last dense layers and before the
  // dense gradients' all-reduce (the communicator runs its collectives in the order they come)
  if (apply && look_ahead && ahead_at_ >= 0) {
    // after the model's last read of the embeddings' output (in x0's 16-bit array, the cross network's V_0
    // gradient reads it after demb)
    if (emb_done_ && emb_stream_.stream()) emb_done_at_.wait_in(emb_stream_.stream());
    collection_->look_up_ahead(emb_out(), LookupMode::train);
  }
  if (!scaler_) reduce_bucket(0, grads_.size());
  join_grad_stream();
  collection_->mark(dev_.stream, "dense: gradients reduced");
  if (apply)
    dense_optimizer_update(dev_, cfg_.dense, step, learning_rate(cfg_.schedule, step), params_.data(),
                           grads_.data(), state_.data(), params_.size(), dev_.stream);
  collection_->mark(dev_.stream, "dense: optimizer");
  release(d);
}

double Trainer::plain_steps(const std::vector<const Batch*>& batches, int64_t global_batch, int64_t n) {
  SPARTA_REQUIRE(!batches.empty(), "Trainer::plain_steps: no batches");
  synchronize_all();
  const double t = now_s();
  const size_t k = batches.size();
  for (int64_t i = 0; i < n; ++i) {
    // as run() does: the next step's batch copied (and routed ahead) while this one trains
    const Batch& b = *batches[size_t(i) % k];
    NextBatch next;
    if (i + 1 < n) next = [&] {
        const Batch* nb = batches[size_t(i + 1) % k];
        stage(*nb);
        return nb;
      };
    train_step(b, step_ + 1, global_batch, losses_.data(), next, /*look_ahead=*/true);
    ++step_;
  }
  synchronize_all();
  return (now_s() - t) * 1e3 / double(n > 0 ? n : 1);
}

Trainer::StepTimes Trainer::timed_step(const Batch& b, int64_t global_batch) {
  auto ms_since = [this](double& t) {
    synchronize_all();
    const double now = now_s(), d = (now - t) * 1e3;
    t = now;
    return d;
  };
  StepTimes st;
  const int64_t s = step_ + 1;
  double t = now_s();
  DeviceBatch& d = take(b);
  copies_done();
  st.data_ms = ms_since(t);
  collection_->forward(d.offsets.data(), d.keys.data(), b.size, emb_out(), LookupMode::train);
  st.embedding_ms = ms_since(t);
  wait_for_embeddings();
  model_forward(b.size, s);
  model_->loss(labels_.data(), global_batch, losses_.data(), scaler_ ? scaler_->scale() : 1.f);
  model_->backward(params_.data(), grads_.data(), demb_.data());
  st.dense_ms = ms_since(t);
  if (world_ > 1) comm_->all_reduce(grads_.data(), grads_.data(), grads_.size(), DataType::f32, dev_.stream);
  st.comm_ms = ms_since(t);
  const bool apply = !scaler_ || unscale_gradients(b.size);  // fp16 (counted as dense time)
  if (!apply) skipped_.push_back(s);
  st.dense_ms += ms_since(t);
  embeddings_wait();
  if (apply) collection_->backward(demb_.data(), s, learning_rate_factor(cfg_.schedule, s));
  st.embedding_ms += ms_since(t);
  if (apply)
    dense_optimizer_update(dev_, cfg_.dense, s, learning_rate(cfg_.schedule, s), params_.data(), grads_.data(),
                           state_.data(), params_.size(), dev_.stream);
  release(d);
  st.dense_ms += ms_since(t);
  step_ = s;
  return st;
}

std::vector<double> Trainer::flush_losses(int64_t n) {
  if (world_ > 1) comm_->all_reduce(losses_.data(), losses_.data(), size_t(n), DataType::f32, dev_.stream);
  comm_->synchronize(dev_.stream);
  std::vector<float> v(static_cast<size_t>(n));
  copy_to_host(dev_, v.data(), losses_.data(), v.size() * sizeof(float), dev_.stream);
  return std::vector<double>(v.begin(), v.end());
}

void Trainer::write_metrics(const std::string& line) {
  if (rank_ == 0 && metrics_.is_open()) metrics_ << line << "\n" << std::flush;
}

// ---- evaluation

Predictions Trainer::predict_local() {
  Predictions out;
  const int64_t limit = cfg_.eval_samples > 0 ? cfg_.eval_samples : eval_->schema().num_samples;
  const int64_t G = eval_->options().global_batch;
  eval_->start_epoch(0);
  for (int64_t index = 0;; ++index) {
    const Batch* b = nullptr;
    copies_done();  // the reader may reuse the memory of the batch before
    agree(guarded([&] { b = eval_->next(); }), "reading an evaluation batch");
    if (!b || index * G >= limit) break;
    DeviceBatch& d = take(*b);
    collection_->forward(d.offsets.data(), d.keys.data(), b->size, emb_out(), LookupMode::eval);
    wait_for_embeddings();
    const float* logits = model_forward(b->size, 0);
    sigmoid(dev_, logits, probs_.data(), b->size, dev_.stream);
    release(d);
    comm_->synchronize(dev_.stream);
    std::vector<float> p(size_t(b->size));
    copy_to_host(dev_, p.data(), probs_.data(), p.size() * sizeof(float), dev_.stream);
    int64_t i = 0;
    for (const auto& seg : b->segments)
      for (int64_t k = 0; k < seg.second; ++k, ++i) {
        if (seg.first + k >= limit) continue;
        out.sample.push_back(seg.first + k);
        out.prob.push_back(p[size_t(i)]);
        out.label.push_back(b->labels[size_t(i)]);
      }
  }
  return out;
}

EvalMetrics Trainer::evaluate_now() { return evaluate_distributed(world_comm_, predict_local()); }

Predictions Trainer::predict() {
  SPARTA_ASSERT(eval_ != nullptr, "predict without an evaluation dataset");
  return gather_predictions(world_comm_, predict_local(), 0);
}

// ---- the loop

// What the parts of a run share (Trainer::run): its schedule, the log interval's clock, the model selection.
struct Trainer::Run {
  TrainResult r;
  int64_t bpe = 0, total = 0, eval_every = 0, checkpoint_every = 0;
  int64_t epoch = 0, first = 0;            // the epoch being read; the step the run started from
  double start = 0, interval_t0 = 0;       // the run's and the log interval's start (now_s)
  int64_t interval_first = 0, interval_samples = 0;
  int64_t since_best = 0, saved_at = -1;   // evaluations since the best; the step of the run's last checkpoint
  std::string best_dir;                    // train.keep_best: the best evaluation's checkpoint
  bool eval_after(int64_t s) const { return eval_every > 0 && s % eval_every == 0; }
};

Trainer::Run Trainer::start_run() {
  Run run;
  run.r.first_step = run.first = step_;
  run.r.teacher_auc = teacher_auc_;
  run.bpe = train_->batches_per_epoch();
  run.total = total_steps(cfg_, run.bpe);
  run.eval_every = interval_steps(cfg_.eval_every, cfg_.eval_every_epochs, run.bpe);
  run.checkpoint_every = interval_steps(cfg_.checkpoint_every, cfg_.checkpoint_every_epochs, run.bpe);
  if (rank_ == 0)
    for (const std::string& w : schedule_warnings(cfg_.schedule, run.total)) LOG_WARN("%s", w.c_str());
  // A metrics file that cannot be written (or that is an input) is an error on every rank before any step.
  agree(guarded([&] {
    if (rank_ != 0 || cfg_.metrics_path.empty()) return;
    require_output_not_input({"train.metrics", cfg_.metrics_path},
                             {{"data.train", cfg_.train_path}, {"data.eval", cfg_.eval_path}, {"--config", cfg_.config_file}});
    metrics_.open(cfg_.metrics_path, step_ > 0 ? std::ios::app : std::ios::trunc);
    SPARTA_REQUIRE(metrics_.good(), "train.metrics '%s': cannot open for writing: %s", cfg_.metrics_path.c_str(),
                   std::strerror(errno));
  }), "opening train.metrics");
  JsonLine run_line("run");
  run_line.add("step", step_)
      .add("total_steps", run.total)
      .add("ranks", world_)
      .add("device", dev_.name())
      .add("global_batch", cfg_.global_batch)
      .add("model", cfg_.model.describe())
      .add("plan", plan_summary(collection_cfg_, plan_));
  if (teacher_auc_ >= 0) run_line.add("teacher_auc", teacher_auc_);  // synthetic data only
  write_metrics(run_line.str());
  LOG_INFO("training: steps %lld..%lld of %lld per epoch, %d rank(s) on %s", (long long)step_ + 1,
           (long long)run.total, (long long)run.bpe, world_, dev_.name().c_str());
  run.epoch = step_ / run.bpe;
  train_->start_epoch(run.epoch, step_ % run.bpe);
  run.start = run.interval_t0 = now_s();
  run.interval_first = step_ + 1;
  return run;
}

// The next batch (agreed: an error on any rank throws on every rank). The reader may then reuse the memory of
// the batch before, whose copies are waited for first.
const Batch* Trainer::fetch(Run& run) {
  copies_done();
  const Batch* b = nullptr;
  agree(guarded([&] {
    b = train_->next();
    if (!b) {  // the epoch ended: the next one, reshuffled
      train_->start_epoch(++run.epoch);
      b = train_->next();
    }
  }), "reading a batch");
  SPARTA_ASSERT(b != nullptr, "an epoch of %lld batches delivered none", (long long)run.bpe);
  return b;
}

// The step's checkpoint, once however often asked.
std::string Trainer::checkpoint_once(Run& run) {
  if (run.saved_at != step_) run.r.checkpoint = save();
  run.saved_at = step_;
  return run.r.checkpoint;
}

// The log interval that ends at this step: its mean loss, rate and ETA to the log and train.metrics.
void Trainer::log_interval(Run& run) {
  const std::vector<double> l = flush_losses(step_ - run.interval_first + 1);
  run.r.losses.insert(run.r.losses.end(), l.begin(), l.end());
  double mean = 0;
  for (double v : l) mean += v;
  mean /= double(l.size());
  const double t = now_s(), rate = double(run.interval_samples) / std::max(t - run.interval_t0, 1e-9);
  const double eta = (t - run.start) / double(step_ - run.first) * double(run.total - step_);
  const float lr = learning_rate(cfg_.schedule, step_);
  const std::string scaling =
      scaler_ ? strprintf(" | loss scale %g, %lld skipped", double(scaler_->scale()), (long long)scaler_->skipped())
              : std::string();
  LOG_INFO("step %lld/%lld | loss %.5f | lr %.3g | %.0f samples/s | ETA %s%s", (long long)step_,
           (long long)run.total, mean, lr, rate, duration_text(eta).c_str(), scaling.c_str());
  JsonLine line("train");
  line.add("split", "train")
      .add("step", step_)
      .add("epoch", run.epoch)
      .add("loss", mean)
      .add("lr", double(lr))
      .add("samples_per_s", rate)
      .add("elapsed_s", t - run.start);
  if (scaler_) line.add("loss_scale", double(scaler_->scale())).add("skipped_steps", scaler_->skipped());
  write_metrics(line.str());
  run.interval_first = step_ + 1;
  run.interval_samples = 0;
  run.interval_t0 = now_s();
}

// Evaluates, logs, and keeps the model selection (train.keep_best, train.patience); returns whether the run stops
// here (train.target_auc reached, or train.patience run out).
bool Trainer::evaluate_and_select(Run& run) {
  if (!eval_) return false;
  TrainResult& r = run.r;
  const double t0 = now_s();
  EvalMetrics m = evaluate_now();
  const double seconds = now_s() - t0;
  r.evals.push_back({step_, m});
  JsonLine line("eval");
  line.add("split", "eval")
      .add("step", step_)
      .add("auc", m.auc)
      .add("logloss", m.logloss)
      .add("loss", m.logloss)
      .add("accuracy", m.accuracy)
      .add("samples", m.samples)
      .add("seconds", seconds);
  if (teacher_auc_ >= 0) line.add("teacher_auc", teacher_auc_);
  write_metrics(line.str());
  LOG_INFO("eval step %lld: AUC %.4f%s, log-loss %.4f, accuracy %.4f over %lld samples (%.1f s)", (long long)step_,
           m.auc, teacher_auc_ >= 0 ? strprintf(" (teacher %.4f)", teacher_auc_).c_str() : "", m.logloss, m.accuracy,
           (long long)m.samples, seconds);
  const bool higher_better = cfg_.best_metric == "auc";
  const double v = higher_better ? m.auc : m.logloss;
  if (r.best_step < 0 || (higher_better ? v > r.best_value : v < r.best_value)) {
    r.best_step = step_;
    r.best_value = v;
    run.since_best = 0;
    if (cfg_.keep_best) {
      run.best_dir = checkpoint_once(run);
      agree(guarded([&] {
        if (rank_ == 0) point_checkpoint(cfg_.checkpoint_dir, "best", step_);
      }));
    }
  } else {
    ++run.since_best;
  }
  if (cfg_.patience > 0 && run.since_best >= cfg_.patience) {
    r.stopped_early = true;
    LOG_INFO("early stop at step %lld: %lld evaluations without a better %s than %.5f (step %lld; train.patience)",
             (long long)step_, (long long)run.since_best, cfg_.best_metric.c_str(), r.best_value,
             (long long)r.best_step);
    return true;
  }
  if (cfg_.target_auc > 0 && m.auc >= cfg_.target_auc) {
    r.reached_target = true;
    return true;
  }
  return false;
}

// After the last step (or an early stop): the cut interval's losses, the last evaluation, and the model kept:
// the best evaluation's checkpoint (train.keep_best) or a checkpoint of the last step.
TrainResult Trainer::finish_run(Run& run, bool stopped) {
  TrainResult& r = run.r;
  copies_done();
  forget_staged();
  if (stopped && step_ - run.interval_first + 1 > 0) {  // the losses of a cut interval
    const std::vector<double> l = flush_losses(step_ - run.interval_first + 1);
    r.losses.insert(r.losses.end(), l.begin(), l.end());
  }
  if (!stopped) evaluate_and_select(run);
  r.last_step = step_;
  if (cfg_.keep_best && !run.best_dir.empty() && r.best_step != step_) {
    // The best evaluation's checkpoint becomes the model and `latest` (what sparta-predict and a resume read).
    // Its rows go into empty tables: a new collection of the same plan.
    synchronize_all();
    collection_.reset();
    collection_ = std::make_unique<EmbeddingCollection>(world_comm_, comm_.get(), emb_dev_, collection_cfg_, plan_);
    load(run.best_dir);
    agree(guarded([&] {
      if (rank_ == 0) point_checkpoint(cfg_.checkpoint_dir, "latest", r.best_step);
    }));
    r.checkpoint = run.best_dir;
    LOG_INFO("train.keep_best: the model is step %lld's (%s %.5f), and %s/latest names it", (long long)r.best_step,
             cfg_.best_metric.c_str(), r.best_value, cfg_.checkpoint_dir.c_str());
  } else if (!cfg_.checkpoint_dir.empty() && step_ > run.first) {
    checkpoint_once(run);
  }
  r.skipped_steps = skipped_;
  r.loss_scale = scaler_ ? scaler_->scale() : 1.0;
  if (r.reached_target) LOG_INFO("reached train.target_auc %.4f at step %lld", cfg_.target_auc, (long long)step_);
  LOG_INFO("training done: %lld steps in %s", (long long)(step_ - run.first), duration_text(now_s() - run.start).c_str());
  return r;
}

// The batch's walk: fetch (the reader), train_step (route, look up, dense forward and backward, the embeddings'
// and the dense update), and between steps the log, evaluations and checkpoints. The next batch is fetched and
// staged inside the step, so that its copies and route run beside this one's work.
TrainResult Trainer::run() {
  Run run = start_run();
  auto checkpoint_after = [&](int64_t s) {
    return !cfg_.checkpoint_dir.empty() && run.checkpoint_every > 0 && s % run.checkpoint_every == 0;
  };
  bool stop = false;
  forget_staged();
  const Batch* b = nullptr;  // the next step's batch when the step before fetched and staged it
  while (step_ < run.total && !stop) {
    if (!b) b = fetch(run);
    const int64_t s = step_ + 1;
    const int64_t global_batch = train_->global_batch_size(b->index);
    // the next step's batch, fetched and staged during this step (b's memory may change then)
    const Batch* next = nullptr;
    auto fetch_next = [&]() -> const Batch* {
      if (s >= run.total) return nullptr;
      next = fetch(run);
      stage(*next);
      return next;
    };
    // no evaluation or checkpoint between this step and the next: the next batch's lookups may start in this one
    const bool quiet = !run.eval_after(s) && !checkpoint_after(s);
    train_step(*b, s, global_batch, losses_.data() + (s - run.interval_first), fetch_next, quiet);
    run.interval_samples += global_batch;
    step_ = s;
    const bool last = step_ == run.total;
    if (step_ - run.interval_first + 1 == cfg_.log_every || last) log_interval(run);
    // An evaluation's or a checkpoint's time is not the training's: the interval's clock skips it (its samples
    // stay counted).
    const double paused_at = now_s();
    if (!last && run.eval_after(step_)) stop = evaluate_and_select(run);
    if (!last && !stop && checkpoint_after(step_)) checkpoint_once(run);
    run.interval_t0 += now_s() - paused_at;
    b = stop ? nullptr : next;
  }
  return finish_run(run, stop);
}

std::vector<float> Trainer::dense_params() {
  comm_->synchronize(dev_.stream);
  return params_.download();
}

TableRows Trainer::held_rows(int table) { return collection_->held_rows(table); }

void Trainer::trace(bool on) { collection_->trace(on); }

std::vector<StreamClock::Point> Trainer::read_trace() {
  synchronize_all();
  return collection_->read_trace();
}

}  // namespace sparta
