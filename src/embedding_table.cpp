// embedding_table.cpp: see embedding_table.h.
#include "src/embedding_table.h"

#include <algorithm>
#include <cmath>

#include "src/base/check.h"
#include "kernels/atomic_sgd.h"
#include "kernels/fill.h"
#include "kernels/key_init.h"
#include "kernels/row_storage.h"
#include "kernels/route.h"

namespace sparta {

namespace {

// Every setting, limits included, is checked here, before the members that allocate are built.
const EmbeddingTableConfig& checked(const EmbeddingTableConfig& c) {
  const char* name = c.name.c_str();
  check_row_storage(c.storage, c.optimizer, c.dim, strprintf("embedding table '%s'", name).c_str());
  SPARTA_REQUIRE(c.dim >= 1 && c.dim <= 256, "embedding table '%s': dim must be in 1..256, found %d", name, c.dim);
  SPARTA_REQUIRE(c.capacity_rows >= 1, "embedding table '%s': capacity_rows must be >= 1, found %lld", name,
                 (long long)c.capacity_rows);
  SPARTA_REQUIRE(c.tier.tier != TableTier::automatic,
                 "embedding table '%s': tier auto is the planner's to resolve (make_plan); a table takes hbm or host",
                 name);
  SPARTA_REQUIRE(c.tier.tier == TableTier::hbm || c.tier.cache_rows >= 1,
                 "embedding table '%s': a host tier needs cache_rows >= 1, found %lld", name,
                 (long long)c.tier.cache_rows);
  SPARTA_REQUIRE(EmbeddingTable::device_rows(c) <= kBackwardMaxRows,
                 "embedding table '%s': %s must be <= %lld (the backward sorts row ids as uint32), found %lld", name,
                 c.tier.tier == TableTier::host ? "cache_rows" : "capacity_rows", (long long)kBackwardMaxRows,
                 (long long)EmbeddingTable::device_rows(c));
  SPARTA_REQUIRE(c.max_batch_keys >= 0 && c.max_batch_keys <= kBackwardMaxKeys,
                 "embedding table '%s': max_batch_keys must be in [0, %lld] (the backward counts keys in int32), "
                 "found %lld",
                 name, (long long)kBackwardMaxKeys, (long long)c.max_batch_keys);
  SPARTA_REQUIRE(c.table_id >= 0, "embedding table '%s': table_id must be >= 0, found %d", name, c.table_id);
  SPARTA_REQUIRE(c.init_scale >= 0, "embedding table '%s': init_scale must be >= 0, found %g", name,
                 double(c.init_scale));
  SPARTA_REQUIRE(c.direct_stride >= 0, "embedding table '%s': direct_stride must be >= 0 (0: hashed), found %lld",
                 name, (long long)c.direct_stride);
  SPARTA_REQUIRE(c.direct_stride == 0 || !c.tagged_keys,
                 "embedding table '%s': a direct index (direct_stride %lld) cannot take tagged keys", name,
                 (long long)c.direct_stride);
  SPARTA_REQUIRE(c.key_segments.empty() || !c.tagged_keys,
                 "embedding table '%s': key_segments and tagged_keys exclude each other", name);
  for (size_t i = 0; i < c.key_segments.size(); ++i) {
    const KeySegment& d = c.key_segments[i];
    SPARTA_REQUIRE(i > 0 ? d.key_begin > c.key_segments[i - 1].key_begin : d.key_begin == 0,
                   "embedding table '%s': key segment %zu begins at key %lld; segments must begin at 0 and "
                   "ascend", name, i, (long long)d.key_begin);
    SPARTA_REQUIRE(d.table_id >= 0, "embedding table '%s': key segment %zu has table_id %d (must be >= 0)", name,
                   i, d.table_id);
  }
  SPARTA_REQUIRE(!c.optimizer.atomic_update || c.optimizer.kind == OptimizerKind::sgd,
                 "embedding table '%s': atomic_update applies to sgd only, the optimizer is %s", name,
                 optimizer_name(c.optimizer.kind));
  SPARTA_REQUIRE(std::isfinite(c.optimizer.weight_decay) && c.optimizer.weight_decay >= 0 &&
                     (c.optimizer.weight_decay == 0 || !c.optimizer.atomic_update),
                 "embedding table '%s': weight_decay must be finite, >= 0 and 0 with atomic_update, found %g", name,
                 double(c.optimizer.weight_decay));
  return c;
}

// A host tier whose cache holds every row leaves nothing in host memory: the table is an HBM table (the same bits,
// without the tier's synchronizations).
bool tiered(const EmbeddingTableConfig& c) {
  return c.tier.tier == TableTier::host && c.tier.cache_rows < c.capacity_rows;
}

// The key index: hash slots, or a direct index (whose own checks name the table).
HashTable make_index(const Device& dev, const EmbeddingTableConfig& c) {
  if (tiered(c))  // the cache: slot numbers
    return HashTable(dev, c.name, EmbeddingTable::device_rows(c), DirectIndex{1, 0});
  if (c.direct_stride > 0) return HashTable(dev, c.name, c.capacity_rows, DirectIndex{c.direct_stride, c.direct_offset});
  return HashTable(dev, c.name, c.capacity_rows, c.max_load_factor);
}

// The keys (and bags) of one backward, or of a train lookup whose rows feed one.
void check_keys_per_call(const std::string& table, const char* what, int64_t n) {
  SPARTA_REQUIRE(n <= kBackwardMaxKeys,
                 "embedding table '%s': %lld %s in one call; the backward takes at most %lld (it counts in int32)",
                 table.c_str(), (long long)n, what, (long long)kBackwardMaxKeys);
}

// A state float of a row never updated: zeros (lazy_adam's step word: int32 0 has the bits of 0.0f), except
// adagrad's and rowwise_adagrad's accumulators.
float initial_state(const OptimizerConfig& o) {
  const OptimizerKind k = o.kind;
  return k == OptimizerKind::adagrad || k == OptimizerKind::rowwise_adagrad ? o.initial_accumulator : 0.f;
}

HostTierSetup tier_setup(const EmbeddingTableConfig& c, int state_width) {
  HostTierSetup s;
  s.name = c.name;
  s.dim = c.dim;
  s.state_width = state_width;
  s.capacity_rows = c.capacity_rows;
  s.cache_rows = EmbeddingTable::device_rows(c);
  s.eviction = c.tier.eviction;
  s.initial_state = initial_state(c.optimizer);
  s.storage = c.storage;
  s.seed = c.seed;
  s.table_id = uint32_t(c.table_id);
  s.init_scale = c.init_scale;
  s.tagged_keys = c.tagged_keys;
  s.key_segments = c.key_segments;
  s.direct_stride = c.direct_stride;
  s.direct_offset = c.direct_offset;
  return s;
}

}  // namespace

int64_t EmbeddingTable::device_rows(const EmbeddingTableConfig& cfg) {
  return cfg.tier.tier == TableTier::host ? std::min(cfg.tier.cache_rows, cfg.capacity_rows) : cfg.capacity_rows;
}

size_t EmbeddingTable::memory_bytes(int64_t capacity_rows, int dim, OptimizerKind optimizer, double max_load_factor,
                                   bool direct_index, RowStorage storage) {
  return HashTable::memory_bytes(capacity_rows, max_load_factor, direct_index) +
         size_t(capacity_rows) * size_t(dim) * row_storage_bytes(storage) +
         size_t(capacity_rows) * size_t(optimizer_state_width(optimizer, dim)) * sizeof(float);
}

EmbeddingTable::EmbeddingTable(const Device& dev, const EmbeddingTableConfig& cfg)
    : dev_(dev),
      cfg_(checked(cfg)),
      state_width_(optimizer_state_width(cfg.optimizer.kind, cfg.dim)),
      device_rows_(device_rows(cfg_)),
      tier_(tiered(cfg_) ? std::make_unique<HostTier>(dev, tier_setup(cfg_, state_width_))
                                              : nullptr),
      hash_(make_index(dev, cfg_)),
      values_(dev, size_t(device_rows_) * size_t(row_storage_floats(cfg.storage, cfg.dim))),
      state_(dev, size_t(device_rows_) * state_width_),
      segments_(dev, cfg_.key_segments),
      marks_(dev, size_t(cfg.optimizer.atomic_update && dev.is_cuda()
                             ? atomic_sgd_mark_words(device_rows_, cfg.dim)
                             : 0)) {
  reset_state(dev_.stream);
  init_direct_rows(dev_.stream);
  if (cfg.max_batch_keys > 0) workspace(cfg.max_batch_keys, dev_.stream);
  synchronize(dev_);  // ready for any stream: work on another stream is not ordered after dev.stream
}

KeyInit EmbeddingTable::key_init() const {
  KeyInit k;
  k.seed = cfg_.seed;
  k.table_id = static_cast<uint32_t>(cfg_.table_id);
  k.scale = cfg_.init_scale;
  k.tagged = cfg_.tagged_keys;
  k.segments = segments_.data();
  k.num_segments = static_cast<int>(cfg_.key_segments.size());
  k.storage = cfg_.storage;
  return k;
}

OptimizerConfig EmbeddingTable::step_config(float lr_scale) const {
  OptimizerConfig opt = cfg_.optimizer;
  if (lr_scale != 1.0f) opt.lr = opt.lr * lr_scale;
  opt.storage = cfg_.storage;
  opt.rounding_seed = cfg_.seed;
  return opt;
}

void EmbeddingTable::reset_state(Stream stream) {
  if (state_.empty()) return;
  fill(dev_, state_.data(), state_.size(), initial_state(cfg_.optimizer), stream);
}

void EmbeddingTable::init_direct_rows(Stream stream) {
  if (!hash_.is_direct() || tier_) return;  // a cache's rows are written when they become resident
  init_rows_strided(dev_, cfg_.capacity_rows, cfg_.direct_stride, cfg_.direct_offset, values_.data(), cfg_.dim,
                    key_init(), stream);
}

ForwardArgs EmbeddingTable::forward_args(LookupMode mode, void* out, OutputType out_type, int64_t* rows) {
  ForwardArgs a;
  a.table = hash_.view();
  a.rows_init.values = values_.data();
  a.rows_init.dim = cfg_.dim;
  a.rows_init.key_init = key_init();
  a.mode = mode;
  a.out = out;
  a.out_type = out_type;
  a.rows = rows;
  return a;
}

void EmbeddingTable::check(LookupMode mode, MissingKey missing, Check when, Stream stream) {
  // a tiered table checks its evaluations too (keys its cache had no room for): it synchronized already
  if (when == Check::now && (mode == LookupMode::train || missing == MissingKey::error || tier_))
    check_lookups(missing, stream);
}

void EmbeddingTable::check_lookups(MissingKey missing, Stream stream) {
  if (!tier_) return hash_.check_errors(missing == MissingKey::error, stream);
  // the tier's refusals first: the cache counts them too (row -1), under the cache's name and size
  try {
    hash_.check_errors(missing == MissingKey::error, stream);
  } catch (const Error&) {
    tier_->check();
    throw;
  }
  tier_->check();
}

const int64_t* EmbeddingTable::tier_keys(const int64_t* keys, int64_t n, LookupMode mode, Stream stream) {
  if (!tier_) return keys;
  const bool train = mode == LookupMode::train;
  return tier_->resident(keys, n, train, train, values_.data(), state_.data(), stream);
}

void EmbeddingTable::updated() {
  if (tier_) tier_->release_pins();
}

void EmbeddingTable::pooled_forward(const int64_t* offsets, const int64_t* keys, int64_t bags, Combiner combiner,
                                    LookupMode mode, void* out, OutputType out_type, int64_t* rows,
                                    MissingKey missing, Check when, Stream stream, const BagLayout& out_layout,
                                    int64_t nnz) {
  if (mode == LookupMode::train) check_keys_per_call(cfg_.name, "bags", bags);
  ForwardArgs a = forward_args(mode, out, out_type, rows);
  a.out_layout = out_layout;
  a.offsets = offsets;
  a.keys = keys;
  if (tier_) {
    if (nnz < 0) copy_to_host(dev_, &nnz, offsets + bags, sizeof(int64_t), stream);  // synchronizes
    a.keys = tier_keys(keys, nnz, mode, stream);
  }
  a.bags = bags;
  a.combiner = combiner;
  sparta::pooled_forward(dev_, a, stream);
  check(mode, missing, when, stream);
}

void EmbeddingTable::unpooled_forward(const int64_t* keys, int64_t nnz, LookupMode mode, void* out, OutputType out_type,
                                      int64_t* rows, MissingKey missing, Check when, Stream stream) {
  if (mode == LookupMode::train) check_keys_per_call(cfg_.name, "keys", nnz);
  ForwardArgs a = forward_args(mode, out, out_type, rows);
  a.keys = tier_keys(keys, nnz, mode, stream);
  a.bags = nnz;
  sparta::unpooled_forward(dev_, a, stream);
  check(mode, missing, when, stream);
}

void EmbeddingTable::find(const int64_t* keys, int64_t n, int64_t* rows, Stream stream) {
  hash_.find(tier_ ? tier_->resident(keys, n, false, false, values_.data(), state_.data(), stream) : keys, n, rows,
             stream);
}

BackwardWorkspace& EmbeddingTable::workspace(int64_t nnz, Stream stream) {
  // Grown only when a batch has more keys than any before: the step itself never allocates.
  if (!workspace_ || workspace_->max_nnz() < nnz) {
    int64_t n = std::max<int64_t>(nnz, workspace_ ? workspace_->max_nnz() : 0);
    if (workspace_) {
      // Free the old one first (at 40M rows the sort buffers are not small), once the stream of the last
      // backward, which used it, is done with it: explicit, not cudaFree's implicit synchronization.
      synchronize(dev_, workspace_stream_);
      workspace_.reset();
    }
    workspace_ = std::make_unique<BackwardWorkspace>(dev_, n, device_rows_, cfg_.dim, stream);
  }
  workspace_stream_ = stream;
  return *workspace_;
}

BackwardBatch EmbeddingTable::backward_batch(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                                             const float* grad, Combiner combiner, const BagLayout& grad_layout) const {
  SPARTA_REQUIRE(nnz >= 0 && bags >= 0, "embedding table '%s': backward of %lld bags, %lld keys", cfg_.name.c_str(),
                 (long long)bags, (long long)nnz);
  check_keys_per_call(cfg_.name, "keys", nnz);
  check_keys_per_call(cfg_.name, "bags", bags);
  BackwardBatch b;
  b.offsets = offsets;
  b.rows = rows;
  b.grad = grad;
  b.bags = bags;
  b.nnz = nnz;
  b.combiner = combiner;
  b.grad_layout = grad_layout;
  return b;
}

void EmbeddingTable::backward_and_update(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                                         const float* grad, Combiner combiner, int64_t step, Stream stream) {
  backward_and_update(offsets, rows, bags, nnz, grad, combiner, step, 1.0f, stream);
}

void EmbeddingTable::backward_and_update(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                                         const float* grad, Combiner combiner, int64_t step, float lr_scale,
                                         Stream stream, const BagLayout& grad_layout) {
  SPARTA_REQUIRE(std::isfinite(lr_scale) && lr_scale >= 0,
                 "embedding table '%s': learning-rate scale must be finite and >= 0, found %g", cfg_.name.c_str(),
                 double(lr_scale));
  SPARTA_REQUIRE(step >= 1, "embedding table '%s': optimizer step must be >= 1 (counted from 1), found %lld",
                 cfg_.name.c_str(), (long long)step);
  const BackwardBatch b = backward_batch(offsets, rows, bags, nnz, grad, combiner, grad_layout);
  const OptimizerConfig opt = step_config(lr_scale);
  try {
    if (opt.atomic_update) {  // no sort, no workspace: key by key (kernels/atomic_sgd.h)
      atomic_sgd_update(dev_, b, opt.lr, values_.data(), device_rows_, cfg_.dim,
                        marks_.empty() ? nullptr : marks_.data(), stream);
      return updated();
    }
    sparta::backward_and_update(dev_, b, workspace(nnz, stream), opt, step, values_.data(), state_.data(),
                                stream);
    updated();
  } catch (const Error& e) {
    throw Error(strprintf("embedding table '%s': %s", cfg_.name.c_str(), e.what()));
  }
}

void EmbeddingTable::prepare_update(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                                    Combiner combiner, Stream stream) {
  if (cfg_.optimizer.atomic_update) return;
  const BackwardBatch b = backward_batch(offsets, rows, bags, nnz, nullptr, combiner);
  try {
    backward_and_update_prepare(dev_, b, workspace(nnz, stream), stream);
  } catch (const Error& e) {
    throw Error(strprintf("embedding table '%s': %s", cfg_.name.c_str(), e.what()));
  }
}

void EmbeddingTable::finish_update(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                                   const float* grad, Combiner combiner, int64_t step, float lr_scale, Stream stream,
                                   const BagLayout& grad_layout) {
  if (cfg_.optimizer.atomic_update) return backward_and_update(offsets, rows, bags, nnz, grad, combiner, step,
                                                               lr_scale, stream, grad_layout);
  SPARTA_REQUIRE(std::isfinite(lr_scale) && lr_scale >= 0,
                 "embedding table '%s': learning-rate scale must be finite and >= 0, found %g", cfg_.name.c_str(),
                 double(lr_scale));
  SPARTA_REQUIRE(step >= 1, "embedding table '%s': optimizer step must be >= 1 (counted from 1), found %lld",
                 cfg_.name.c_str(), (long long)step);
  SPARTA_REQUIRE(workspace_, "embedding table '%s': finish_update with no prepare_update before it",
                 cfg_.name.c_str());
  const BackwardBatch b = backward_batch(offsets, rows, bags, nnz, grad, combiner, grad_layout);
  const OptimizerConfig opt = step_config(lr_scale);
  try {
    workspace_stream_ = stream;  // the last user of the workspace
    backward_and_update_finish(dev_, b, *workspace_, opt, step, values_.data(), state_.data(), stream);
    updated();
  } catch (const Error& e) {
    throw Error(strprintf("embedding table '%s': %s", cfg_.name.c_str(), e.what()));
  }
}

int64_t* EmbeddingTable::unique_rows(int64_t nnz, Stream stream) {
  const size_t n = size_t(std::max<int64_t>(1, nnz));
  if (unique_rows_.empty()) unique_rows_ = Buffer<int64_t>(dev_, n);
  else if (unique_rows_.size() < n) unique_rows_.resize(n, stream);  // synchronizes stream first
  return unique_rows_.data();
}

void EmbeddingTable::row_gradients(const int64_t* offsets, const int64_t* keys, const int64_t* rows, int64_t bags,
                                   int64_t nnz, const float* grad, Combiner combiner, int64_t* unique_keys,
                                   float* row_grads, int32_t* num_unique, Stream stream) {
  const BackwardBatch b = backward_batch(offsets, rows, bags, nnz, grad, combiner);
  try {
    int64_t* urows = unique_rows(nnz, stream);
    embedding_backward(dev_, b, workspace(nnz, stream), urows, row_grads, num_unique, keys, unique_keys, stream);
  } catch (const Error& e) {
    throw Error(strprintf("embedding table '%s': %s", cfg_.name.c_str(), e.what()));
  }
}

void EmbeddingTable::prepare_row_gradients(const int64_t* offsets, const int64_t* keys, const int64_t* rows,
                                           int64_t bags, int64_t nnz, Combiner combiner, int64_t* unique_keys,
                                           int32_t* num_unique, Stream stream) {
  const BackwardBatch b = backward_batch(offsets, rows, bags, nnz, nullptr, combiner);
  try {
    int64_t* urows = unique_rows(nnz, stream);
    embedding_backward_prepare(dev_, b, workspace(nnz, stream), urows, num_unique, keys, unique_keys, stream);
  } catch (const Error& e) {
    throw Error(strprintf("embedding table '%s': %s", cfg_.name.c_str(), e.what()));
  }
}

void EmbeddingTable::finish_row_gradients(const float* grad, float* row_grads, Stream stream,
                                          const BagLayout& grad_layout) {
  SPARTA_REQUIRE(workspace_ && workspace_->prepared().valid,
                 "embedding table '%s': embedding backward finish: the workspace holds no prepared batch (no "
                 "prepare_row_gradients since the last finish, or another backward of the table in between)",
                 cfg_.name.c_str());
  const BackwardWorkspace::Prepared& p = workspace_->prepared();
  const BackwardBatch b = backward_batch(p.offsets, p.rows, p.bags, p.nnz, grad, p.combiner, grad_layout);
  try {
    workspace_stream_ = stream;  // the last user of the workspace
    embedding_backward_finish(dev_, b, *workspace_, row_grads, stream);
  } catch (const Error& e) {
    throw Error(strprintf("embedding table '%s': %s", cfg_.name.c_str(), e.what()));
  }
}

void EmbeddingTable::insert_rows(const int64_t* keys, int64_t n, int64_t* rows, Stream stream) {
  check_keys_per_call(cfg_.name, "keys", n);
  ForwardArgs a = forward_args(LookupMode::train, nullptr, OutputType::f32, rows);
  hash_.get_insert(tier_keys(keys, n, LookupMode::train, stream), n, rows, a.rows_init, stream);
}

int64_t EmbeddingTable::rows_updated(Stream stream) {
  SPARTA_REQUIRE(!cfg_.optimizer.atomic_update,
                 "embedding table '%s': rows_updated is not counted with atomic_update (the update runs key by key)",
                 cfg_.name.c_str());
  return workspace_ ? read_count(dev_, workspace_->num_unique(), stream) : 0;
}

TableRows EmbeddingTable::export_rows(Stream stream) {
  TableRows r;
  if (tier_) r = tier_->export_rows(values_.data(), state_.data(), stream);
  r.name = cfg_.name;
  r.dim = cfg_.dim;
  r.optimizer = optimizer_name(cfg_.optimizer.kind);
  r.state_width = state_width_;
  r.storage = row_storage_name(cfg_.storage);
  if (tier_) return r;
  Buffer<int64_t> keys;
  int64_t n = hash_.export_keys(keys, stream);
  r.keys.resize(size_t(n));
  r.values.resize(size_t(n) * cfg_.dim);
  r.state.resize(size_t(n) * state_width_);
  if (n > 0) {
    copy_to_host(dev_, r.keys.data(), keys.data(), r.keys.size() * sizeof(int64_t), stream);  // synchronizes
    if (cfg_.storage == RowStorage::fp32) {
      copy_to_host(dev_, r.values.data(), values_.data(), r.values.size() * sizeof(float), stream);
    } else {
      std::vector<uint16_t> stored(r.values.size());
      copy_to_host(dev_, stored.data(), values_.data(), stored.size() * sizeof(uint16_t), stream);
      for (size_t i = 0; i < stored.size(); ++i) r.values[i] = rowstore::widen(cfg_.storage, stored[i]);
    }
    if (state_width_ > 0) copy_to_host(dev_, r.state.data(), state_.data(), r.state.size() * sizeof(float), stream);
  }
  return r;
}

void EmbeddingTable::load_rows(const TableRows& rows, Stream stream) {
  const char* opt = optimizer_name(cfg_.optimizer.kind);
  SPARTA_REQUIRE(rows.dim == cfg_.dim && rows.optimizer == opt && rows.state_width == state_width_,
                 "embedding table '%s': load of rows of '%s' with dim %d, optimizer '%s', state_width %d; the table "
                 "has dim %d, optimizer '%s', state_width %d",
                 cfg_.name.c_str(), rows.name.c_str(), rows.dim, rows.optimizer.c_str(), rows.state_width, cfg_.dim,
                 opt, state_width_);
  int64_t n = static_cast<int64_t>(rows.rows());
  SPARTA_REQUIRE(rows.values.size() == size_t(n) * cfg_.dim,
                 "embedding table '%s': load of %lld rows with %zu values, expected %lld (dim %d)", cfg_.name.c_str(),
                 (long long)n, rows.values.size(), (long long)(n * cfg_.dim), cfg_.dim);
  SPARTA_REQUIRE(rows.state.size() == size_t(n) * state_width_,
                 "embedding table '%s': load of %lld rows with %zu state floats, expected %lld (%s, width %d)",
                 cfg_.name.c_str(), (long long)n, rows.state.size(), (long long)(n * state_width_),
                 optimizer_name(cfg_.optimizer.kind), state_width_);
  if (tier_) return tier_->load_rows(rows, values_.data(), state_.data(), stream);
  if (n == 0) return;
  // The values as the table stores them: 16-bit rows travel as pairs in floats (the dim is even), row_floats each.
  std::vector<float> converted;
  const std::vector<float>& stored = cfg_.storage == RowStorage::fp32 ? rows.values : converted;
  const int row_floats = row_storage_floats(cfg_.storage, cfg_.dim);
  if (cfg_.storage != RowStorage::fp32) {
    converted.resize(rows.values.size() / 2);
    for (size_t i = 0; i < rows.values.size(); ++i)
      rowstore::store_nearest(converted.data(), cfg_.storage, int64_t(i), rows.values[i]);
  }
  Buffer<int64_t> keys(dev_, size_t(n));
  copy_to_device(dev_, keys.data(), rows.keys.data(), keys.bytes(), stream);
  if (hash_.is_direct()) {  // every row exists: write the given ones by key, after every key was found
    Buffer<int64_t> at(dev_, size_t(n));
    hash_.find(keys.data(), n, at.data(), stream);
    hash_.check_errors(true, stream);  // synchronizes; a key outside the index throws, nothing written
    Buffer<float> v(dev_, stored), st(dev_, rows.state);
    route_scatter_rows(dev_, v.data(), at.data(), n, row_floats, values_.data(), stream);
    if (state_width_ > 0) route_scatter_rows(dev_, st.data(), at.data(), n, state_width_, state_.data(), stream);
    synchronize(dev_, stream);  // the buffers above are freed on return
    return;
  }
  int64_t first = hash_.load(keys.data(), n, stream);  // rows first .. first + n - 1, in the order given; synchronizes
  copy_to_device(dev_, values_.data() + first * row_floats, stored.data(), stored.size() * sizeof(float), stream);
  if (state_width_ > 0)
    copy_to_device(dev_, state_.data() + first * state_width_, rows.state.data(), rows.state.size() * sizeof(float),
                   stream);
  synchronize(dev_, stream);  // the host vectors belong to the caller
}

void EmbeddingTable::clear(Stream stream) {
  if (tier_) tier_->clear(stream);
  hash_.clear(stream);
  reset_state(stream);
  init_direct_rows(stream);
}

}  // namespace sparta
