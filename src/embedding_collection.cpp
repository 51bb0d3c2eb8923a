// embedding_collection.cpp: see embedding_collection.h.
#include "src/embedding_collection.h"

#include <algorithm>

#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/placement_common.h"
#include "src/planner.h"

namespace sparta {

static_assert(kAllRanks == kEveryRank, "placements and checkpoints name 'every rank' alike");

// One table's slots: which ones (device, for the route kernels), where they go in a sample's output row, and the
// table's cut of the current batch (kept until the backward).
struct EmbeddingCollection::Slots {
  std::vector<int32_t> slots, cols;
  Buffer<int32_t> slots_dev, cols_dev;
  Buffer<int64_t> offsets, keys;  // [bags + 1], [nnz]
  Buffer<float> pooled;           // [bags, dim]: pooled vectors, then their gradients
  TableBatch batch;
  RouteScratch scratch;
};

EmbeddingCollection::EmbeddingCollection(MPI_Comm world, Communicator* comm, const Device& dev,
                                         const CollectionConfig& cfg, const Plan& plan)
    : world_(world), dev_(dev), cfg_(cfg), plan_(plan) {
  agree_on_error(world_, guarded([&] {
    check_collection_config(cfg_);
    SPARTA_REQUIRE(plan_.tables.size() == cfg_.tables.size(), "embedding collection: a plan of %zu tables for %zu",
                   plan_.tables.size(), cfg_.tables.size());
  }));
  ex_ = std::make_unique<Exchange>(comm, dev_, world_);
  slot_cols_.assign(size_t(cfg_.num_slots), 0);
  std::vector<int> dim_of_slot(size_t(cfg_.num_slots), 0);
  for (const CollectionTableConfig& t : cfg_.tables)
    for (int s : t.slots) dim_of_slot[size_t(s)] = t.dim;
  for (int s = 0; s < cfg_.num_slots; ++s) slot_cols_[size_t(s)] = width_, width_ += dim_of_slot[size_t(s)];
  // Every rank builds the same shards' structure; a bad plan fails alike everywhere, a failed allocation ends
  // the job (device_alloc).
  agree_on_error(world_, guarded([&] {
    for (size_t i = 0; i < cfg_.tables.size(); ++i) {
      PlacedTableSetup s;
      s.table = cfg_.tables[i];
      s.table_id = static_cast<int>(i);
      s.seed = cfg_.seed;
      s.shard_slack = cfg_.shard_slack;
      s.plan = plan_.tables[i];
      tables_.push_back(make_placed_table(s, *ex_));
      auto sl = std::make_unique<Slots>();
      for (int slot : s.table.slots) {
        sl->slots.push_back(slot);
        sl->cols.push_back(static_cast<int32_t>(slot_cols_[size_t(slot)]));
      }
      sl->slots_dev = Buffer<int32_t>(dev_, sl->slots);
      sl->cols_dev = Buffer<int32_t>(dev_, sl->cols);
      slots_.push_back(std::move(sl));
    }
  }));
}

EmbeddingCollection::~EmbeddingCollection() = default;

int EmbeddingCollection::rank() const { return ex_->rank(); }
int EmbeddingCollection::world() const { return ex_->world(); }

size_t EmbeddingCollection::memory_bytes() const {
  size_t b = 0;
  for (const auto& t : tables_) b += t->memory_bytes();
  return b;
}

void EmbeddingCollection::forward(const int64_t* offsets, const int64_t* keys, int64_t local_batch, float* out,
                                  LookupMode mode) {
  const int S = cfg_.num_slots;
  // The offsets are checked on the host (a bad batch on one rank fails every rank before any collective).
  ex_->agree(guarded([&] {
    SPARTA_REQUIRE(local_batch >= 0, "embedding collection forward, rank %d: local batch %lld", ex_->rank(),
                   (long long)local_batch);
    std::vector<int64_t> h = ex_->download(offsets, size_t(local_batch * S + 1));
    SPARTA_REQUIRE(h[0] == 0, "embedding collection forward, rank %d: offsets[0] must be 0, found %lld", ex_->rank(),
                   (long long)h[0]);
    for (int64_t r = 0; r < local_batch * S; ++r)
      SPARTA_REQUIRE(h[r] <= h[r + 1],
                     "embedding collection forward, rank %d: offsets decrease at row %lld (sample %lld, slot %lld): "
                     "%lld then %lld",
                     ex_->rank(), (long long)r, (long long)(r / S), (long long)(r % S), (long long)h[r],
                     (long long)h[r + 1]);
  }));
  std::vector<size_t> b = ex_->counts(std::vector<size_t>(size_t(world()), size_t(local_batch)));
  std::vector<int64_t> rank_batches(b.begin(), b.end());
  for (size_t i = 0; i < tables_.size(); ++i) {
    Slots& sl = *slots_[i];
    const int ts = static_cast<int>(sl.slots.size());
    const int dim = cfg_.tables[i].dim;
    const int64_t bags = local_batch * ts;
    int64_t* t_offsets = grow(sl.offsets, dev_, size_t(bags) + 1);
    route_select_slot_offsets(dev_, offsets, local_batch, S, sl.slots_dev.data(), ts, t_offsets, sl.scratch,
        dev_.stream);
    const int64_t nnz = ex_->download(t_offsets + bags, 1)[0];
    int64_t* t_keys = grow(sl.keys, dev_, size_t(nnz));
    route_select_slot_keys(dev_, offsets, keys, local_batch, S, sl.slots_dev.data(), ts, t_offsets, t_keys,
        dev_.stream);
    TableBatch& tb = sl.batch;
    tb.offsets = t_offsets;
    tb.keys = t_keys;
    tb.bags = bags;
    tb.nnz = nnz;
    tb.table_slots = ts;
    tb.rank_batches = rank_batches;
    float* pooled = grow(sl.pooled, dev_, size_t(bags) * dim);
    tables_[i]->forward(tb, mode, pooled);
    route_put_slots(dev_, pooled, local_batch, ts, dim, sl.cols_dev.data(), width_, out, dev_.stream);
  }
  if (mode == LookupMode::train) {
    ex_->agree(guarded([&] {
      for (auto& t : tables_) t->check_lookups();
    }));
    batch_ = local_batch;
    trained_ = true;
  } else {
    trained_ = false;  // the placements' routes now hold this batch's: the train batch's backward cannot follow
  }
}

void EmbeddingCollection::backward(const float* grad, int64_t step) {
  SPARTA_REQUIRE(trained_, "embedding collection backward: no train forward right before it (each train forward "
                           "takes one backward, with no other forward in between)");
  SPARTA_REQUIRE(step >= 1, "embedding collection backward: step must be >= 1, found %lld", (long long)step);
  for (size_t i = 0; i < tables_.size(); ++i) {
    Slots& sl = *slots_[i];
    const int ts = static_cast<int>(sl.slots.size());
    float* g = sl.pooled.data();
    route_take_slots(dev_, grad, batch_, ts, cfg_.tables[i].dim, sl.cols_dev.data(), width_, g, dev_.stream);
    tables_[i]->backward(g, step);
  }
  trained_ = false;
}

// ----------------------------------------------------------------------------
// checkpoints

std::vector<TableSpec> EmbeddingCollection::table_specs() const {
  std::vector<TableSpec> specs;
  for (const CollectionTableConfig& t : cfg_.tables)
    specs.push_back({t.name, t.dim, optimizer_name(t.optimizer.kind), optimizer_state_width(t.optimizer.kind, t.dim)});
  return specs;
}

namespace {
void describe(TableRows& r, const TableSpec& s) {
  r.name = s.name;
  r.dim = s.dim;
  r.optimizer = s.optimizer;
  r.state_width = s.state_width;
}
}  // namespace

std::vector<TableRows> EmbeddingCollection::rows_to_save() {
  std::vector<TableSpec> specs = table_specs();
  std::vector<TableRows> out;
  for (size_t i = 0; i < tables_.size(); ++i) {
    out.push_back(tables_[i]->rows_to_save());
    describe(out.back(), specs[i]);
  }
  return out;
}

TableRows EmbeddingCollection::held_rows(int table) {
  TableRows r = tables_.at(size_t(table))->held_rows();
  describe(r, table_specs()[size_t(table)]);
  return r;
}

int EmbeddingCollection::owner_of(int table, int64_t key) const { return tables_.at(size_t(table))->owner_of(key); }

void EmbeddingCollection::load_rows(const std::vector<TableRows>& tables) {
  SPARTA_REQUIRE(tables.size() == tables_.size(), "embedding collection: rows of %zu tables for %zu", tables.size(),
                 tables_.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    const TableRows& r = tables[i];
    for (int64_t k : r.keys) {
      int o = tables_[i]->owner_of(k);
      SPARTA_REQUIRE(o == rank() || o == kAllRanks, "table '%s': rank %d was given key %lld, which rank %d owns",
                     cfg_.tables[i].name.c_str(), rank(), (long long)k, o);
    }
    try {
      tables_[i]->load_rows(r);
    } catch (const Error& e) {
      throw Error("table '" + cfg_.tables[i].name + "': " + e.what());
    }
  }
}

std::string EmbeddingCollection::save(const std::string& root, CheckpointMeta meta) {
  meta.plan = plan_summary(cfg_, plan_);
  return save_checkpoint(world_, root, meta, {}, rows_to_save());
}

CheckpointMeta EmbeddingCollection::load(const std::string& path) {
  ModelSpec spec;
  spec.tables = table_specs();
  LoadedCheckpoint c =
      load_checkpoint(world_, path, spec, [this](int table, int64_t key) { return owner_of(table, key); });
  ex_->agree(guarded([&] { load_rows(c.tables); }));
  return c.manifest.meta;
}

}  // namespace sparta
