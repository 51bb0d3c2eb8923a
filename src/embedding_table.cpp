// embedding_table.cpp: see embedding_table.h.
#include "embedding_table.h"

#include "check.h"
#include "fill.h"

namespace sparta {

namespace {
const EmbeddingTableConfig& checked(const EmbeddingTableConfig& c) {
  SPARTA_REQUIRE(c.dim >= 1 && c.dim <= 256, "embedding table '%s': dim must be in 1..256, found %d", c.name.c_str(),
                 c.dim);
  SPARTA_REQUIRE(c.capacity_rows >= 1, "embedding table '%s': capacity_rows must be >= 1, found %lld", c.name.c_str(),
                 (long long)c.capacity_rows);
  SPARTA_REQUIRE(c.table_id >= 0, "embedding table '%s': table_id must be >= 0, found %d", c.name.c_str(), c.table_id);
  SPARTA_REQUIRE(c.init_scale >= 0, "embedding table '%s': init_scale must be >= 0, found %g", c.name.c_str(),
                 double(c.init_scale));
  return c;
}
}  // namespace

size_t EmbeddingTable::memory_bytes(int64_t capacity_rows, int dim, OptimizerKind optimizer, double max_load_factor) {
  return HashTable::memory_bytes(capacity_rows, max_load_factor) +
         size_t(capacity_rows) * size_t(dim + optimizer_state_width(optimizer, dim)) * sizeof(float);
}

EmbeddingTable::EmbeddingTable(const Device& dev, const EmbeddingTableConfig& cfg)
    : dev_(dev),
      cfg_(checked(cfg)),
      state_width_(optimizer_state_width(cfg.optimizer.kind, cfg.dim)),
      hash_(dev, cfg.name, cfg.capacity_rows, cfg.max_load_factor),
      values_(dev, size_t(cfg.capacity_rows) * cfg.dim),
      state_(dev, size_t(cfg.capacity_rows) * state_width_) {
  reset_state();
}

KeyInit EmbeddingTable::key_init() const {
  KeyInit k;
  k.seed = cfg_.seed;
  k.table_id = static_cast<uint32_t>(cfg_.table_id);
  k.scale = cfg_.init_scale;
  return k;
}

void EmbeddingTable::reset_state() {
  if (state_.empty()) return;
  // Every optimizer's state starts at zero (lazy_adam's step word: int32 0 has the bits of 0.0f), except
  // adagrad's accumulator.
  float init = cfg_.optimizer.kind == OptimizerKind::adagrad ? cfg_.optimizer.initial_accumulator : 0.f;
  fill(dev_, state_.data(), state_.size(), init);
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

void EmbeddingTable::check(LookupMode mode, MissingKey missing) {
  if (mode == LookupMode::train || missing == MissingKey::error) hash_.check_errors(missing == MissingKey::error);
}

void EmbeddingTable::pooled_forward(const int64_t* offsets, const int64_t* keys, int64_t bags, Combiner combiner,
                                    LookupMode mode, void* out, OutputType out_type, int64_t* rows,
                                    MissingKey missing) {
  ForwardArgs a = forward_args(mode, out, out_type, rows);
  a.offsets = offsets;
  a.keys = keys;
  a.bags = bags;
  a.combiner = combiner;
  sparta::pooled_forward(dev_, a);
  check(mode, missing);
}

void EmbeddingTable::unpooled_forward(const int64_t* keys, int64_t nnz, LookupMode mode, void* out, OutputType out_type,
                                      int64_t* rows, MissingKey missing) {
  ForwardArgs a = forward_args(mode, out, out_type, rows);
  a.keys = keys;
  a.bags = nnz;
  sparta::unpooled_forward(dev_, a);
  check(mode, missing);
}

void EmbeddingTable::find(const int64_t* keys, int64_t n, int64_t* rows) { hash_.find(keys, n, rows); }

TableRows EmbeddingTable::export_rows() {
  TableRows r;
  Buffer<int64_t> keys;
  int64_t n = hash_.export_keys(keys);
  r.keys = keys.download();
  r.values.resize(size_t(n) * cfg_.dim);
  r.state.resize(size_t(n) * state_width_);
  if (n > 0) {
    copy_to_host(dev_, r.values.data(), values_.data(), r.values.size() * sizeof(float));
    if (state_width_ > 0) copy_to_host(dev_, r.state.data(), state_.data(), r.state.size() * sizeof(float));
  }
  return r;
}

void EmbeddingTable::load_rows(const TableRows& rows) {
  int64_t n = rows.size();
  SPARTA_REQUIRE(rows.values.size() == size_t(n) * cfg_.dim,
                 "embedding table '%s': load of %lld rows with %zu values, expected %lld (dim %d)", cfg_.name.c_str(),
                 (long long)n, rows.values.size(), (long long)(n * cfg_.dim), cfg_.dim);
  SPARTA_REQUIRE(rows.state.size() == size_t(n) * state_width_,
                 "embedding table '%s': load of %lld rows with %zu state floats, expected %lld (%s, width %d)",
                 cfg_.name.c_str(), (long long)n, rows.state.size(), (long long)(n * state_width_),
                 optimizer_name(cfg_.optimizer.kind), state_width_);
  if (n == 0) return;
  Buffer<int64_t> keys(dev_, rows.keys);
  int64_t first = hash_.load(keys.data(), n);  // rows first .. first + n - 1, in the order given
  copy_to_device(dev_, values_.data() + first * cfg_.dim, rows.values.data(), rows.values.size() * sizeof(float));
  if (state_width_ > 0)
    copy_to_device(dev_, state_.data() + first * state_width_, rows.state.data(), rows.state.size() * sizeof(float));
  synchronize(dev_);  // the host vectors belong to the caller
}

void EmbeddingTable::clear() {
  hash_.clear();
  reset_state();
}

}  // namespace sparta
