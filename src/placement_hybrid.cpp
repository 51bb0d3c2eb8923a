// placement_hybrid.cpp: HugeCTR's HybridSparseEmbedding: the most frequent keys (the plan's hot set of H keys,
// from counts over a sample of the data) are replicated on every rank; the rest are placed by dispatch. A batch's
// keys are split stably into hot and cold; the hot ones are looked up in the local copy, the cold ones dispatched
// to their owners; the bags are pooled at the requester from the split vectors, each key's read where it lies.
//
// Backward: the cold keys' gradients go back to their owners (dispatch). The hot keys' gradients are summed per
// hot key on each rank (its keys in key order, in kernels/embedding_backward.h's fixed order), into a dense
// [H, dim] gradient with a count per hot key, and both are all-reduced: every copy then updates the same rows
// (those with a count) with the same sums, so the copies stay identical. The bytes of the hot backward depend on
// H, not on the batch: the replication pays when the hot keys are looked up more often per step than there are of
// them.
//
// Each row lives in exactly one of the two shards and is updated once per step it is touched, so every optimizer
// and any hotness work as in one table. The forward equals a single-rank pooled lookup bit for bit; a hot row's
// gradient is added per rank, then over ranks (equal to the single-rank sum within rounding).
#include <algorithm>

#include "kernels/fill.h"
#include "src/placement_common.h"

namespace sparta {

namespace {

// The hot copy stays in HBM: it is small and every rank reads it every step.
PlacedTableSetup in_hbm(PlacedTableSetup s) {
  s.table.tier = TierConfig{};
  return s;
}

class HybridTable : public PlacedTable {
 public:
  HybridTable(const PlacedTableSetup& s, Exchange& ex)
      : ex_(ex),
        dim_(s.table.dim),
        combiner_(s.table.combiner),
        direct_(s.table.direct_index),
        hot_keys_(s.plan.hot_keys),
        hot_table_(make_shard(ex.device(), in_hbm(s), std::max<int64_t>(1, int64_t(s.plan.hot_keys.size())), "/hot")),
        cold_(ex, s, ""),
        hot_posted_(ex.device()),
        hot_sums_(ex, s.table.dim) {
    for (size_t i = 1; i < hot_keys_.size(); ++i)
      SPARTA_REQUIRE(hot_keys_[i - 1] < hot_keys_[i], "table '%s': hybrid hot keys must be ascending and distinct",
                     s.table.name.c_str());
    SPARTA_REQUIRE(int64_t(hot_keys_.size()) <= s.table.rows, "table '%s': %zu hot keys for a table of %lld rows",
                   s.table.name.c_str(), hot_keys_.size(), (long long)s.table.rows);
    if (!hot_keys_.empty()) hot_set_ = Buffer<int64_t>(ex.device(), hot_keys_);
    // A direct index holds every key from the start: so does the hot copy (its keys' initial values), and the
    // cold shard's rows of the hot keys are never used (nor saved).
    if (direct_) insert_hot_keys();
  }

  void begin_forward(const TableBatch& in, LookupMode mode, float* out) override {
    const Device& dev = ex_.device();
    in_ = in;
    mode_ = mode;
    out_ = out;
    int32_t* part = grow(part_, ex_, in.nnz);
    int64_t* perm = grow(perm_, ex_, in.nnz);
    int64_t* counts = grow(counts_, ex_, 2);
    route_part_by_membership(dev, in.keys, in.nnz, hot_set_.data(), int64_t(hot_keys_.size()), part, dev.stream);
    route_bucket(dev, part, in.nnz, 2, perm, counts, scratch_, dev.stream);
    std::vector<int64_t> c = ex_.download(counts, 2);
    hot_ = c[0], cold_n_ = c[1];
    int64_t* keys = grow(split_keys_, ex_, in.nnz);  // hot keys, then cold keys
    route_gather_keys(dev, in.keys, perm, in.nnz, keys, dev.stream);
    cold_.route(keys + hot_, cold_n_);
    // key i's place among the split keys (the forward's pooling), and in the backward each split key's bag
    int64_t* iota = grow(iota_, ex_, in.nnz);
    route_iota(dev, in.nnz, iota, dev.stream);
    route_scatter_keys(dev, iota, perm, in.nnz, grow(split_of_key_, ex_, in.nnz), dev.stream);
    if (mode == LookupMode::train) {
      int64_t* bag_of_key = grow(bag_of_key_, ex_, in.nnz);
      route_key_bags(dev, in.offsets, in.bags, 0, bag_of_key, dev.stream);
      route_gather_keys(dev, bag_of_key, perm, in.nnz, grow(bag_of_split_, ex_, in.nnz), dev.stream);
    }
  }

  void lookup() override {
    // the hot keys in the local copy while the cold ones travel
    float* split = grow(split_vecs_, ex_, size_t(in_.nnz) * dim_);
    table_lookup_keys(*hot_table_, split_keys_.data(), hot_, mode_, split, nullptr);
    cold_.lookup(mode_);
  }

  void finish_forward() override {
    const Device& dev = ex_.device();
    cold_.finish();
    float* split = split_vecs_.data();
    route_gather_rows(dev, cold_.vectors(), cold_.vector_of_key(), cold_n_, dim_, split + size_t(hot_) * dim_,
                      dev.stream);
    route_pool_bags(dev, in_.offsets, split, split_of_key_.data(), in_.bags, dim_, combiner_, out_, dev.stream);
  }

  void begin_backward(const float* grad) override {
    const Device& dev = ex_.device();
    // a key's gradient is its bag's, divided for mean by the whole bag's length (the hot keys and the cold ones
    // each hold part of a bag)
    const float* key_grads = grad;
    if (combiner_ == Combiner::mean) {
      float* scaled = grow(scaled_, ex_, size_t(in_.bags) * dim_);
      route_scale_bag_grads(dev, in_.offsets, grad, in_.bags, dim_, combiner_, scaled, dev.stream);
      key_grads = scaled;
    }
    // the hot keys and the cold ones each in their bags (their bag ids ascend in the split order)
    int64_t* hot_offsets = grow(hot_bag_offsets_, ex_, size_t(in_.bags) + 1);
    route_offsets_from_sorted_bags(dev, bag_of_split_.data(), hot_, in_.bags, hot_offsets, dev.stream);
    int64_t* cold_offsets = grow(cold_bag_offsets_, ex_, size_t(in_.bags) + 1);
    route_offsets_from_sorted_bags(dev, bag_of_split_.data() + hot_, cold_n_, in_.bags, cold_offsets, dev.stream);
    if (!hot_keys_.empty()) send_hot(hot_offsets, key_grads);
    cold_.send(cold_offsets, in_.bags, key_grads, Combiner::sum);
  }

  void update(int64_t step, float lr_scale) override {
    if (!hot_keys_.empty()) update_hot(step, lr_scale);
    cold_.update(step, lr_scale);
  }

  void check_lookups() override {
    table_check(*hot_table_);
    table_check(cold_.table());
  }
  int owner_of(int64_t key) const override {
    return std::binary_search(hot_keys_.begin(), hot_keys_.end(), key) ? kAllRanks : owner_of_key(key, ex_.world());
  }
  TableRows rows_to_save() override {
    TableRows hot = table_export(*hot_table_);
    if (ex_.rank() != 0) hot = select_rows(hot, std::vector<bool>(hot.rows(), false));  // one writer per row
    return concat(hot, cold_rows());
  }
  TableRows held_rows() override { return concat(table_export(*hot_table_), cold_rows()); }
  void load_rows(const TableRows& rows) override {
    std::vector<bool> hot(rows.rows()), cold(rows.rows());
    for (size_t i = 0; i < rows.rows(); ++i) {
      hot[i] = std::binary_search(hot_keys_.begin(), hot_keys_.end(), rows.keys[i]);
      cold[i] = !hot[i];
    }
    if (direct_) hot_table_->clear(ex_.device().stream);  // it held every hot key: the loaded rows replace them
    table_load(*hot_table_, select_rows(rows, hot));
    table_load(cold_.table(), select_rows(rows, cold));
    if (direct_) insert_hot_keys();  // hot keys the checkpoint lacks: their initial values
  }
  size_t memory_bytes() const override { return table_memory_bytes(*hot_table_) + cold_.memory_bytes(); }
  int64_t rows_in_use() override {  // a direct cold shard's rows of hot keys are not in use (the hot copy has them)
    int64_t unused = 0;
    if (direct_)
      for (int64_t k : hot_keys_) unused += owner_of_key(k, ex_.world()) == ex_.rank();
    return table_rows_in_use(*hot_table_, ex_.device()) + table_rows_in_use(cold_.table(), ex_.device()) - unused;
  }
  void trace(StreamClock* clock) override {
    table_trace(*hot_table_, clock);
    table_trace(cold_.table(), clock);
  }

 private:
  // This rank's hot keys (split_keys_[0, hot_)) in bags (offsets [bags + 1]), each key's gradient its bag's row
  // of grads. Posts the all-reduce of every rank's sums and counts per hot key.
  void send_hot(const int64_t* offsets, const float* grads) {
    const Device& dev = ex_.device();
    const int64_t H = int64_t(hot_keys_.size());
    // the hot keys bucketed by their place in the hot set: how many of each (the counts all-reduced below)
    int32_t* idx = grow(hot_idx_, ex_, hot_);
    route_index_in_set(dev, split_keys_.data(), hot_, hot_set_.data(), H, idx, dev.stream);
    int64_t* perm = grow(hot_perm_, ex_, std::max(hot_, H));
    int64_t* counts = grow(hot_counts_, ex_, H);
    route_bucket(dev, idx, hot_, int(H), perm, counts, scratch_, dev.stream);
    // each hot key's place in the hot set, as the int64 id GroupSums groups by
    int64_t* ids = grow(hot_ids_, ex_, hot_);
    route_widen(dev, idx, hot_, ids, dev.stream);
    // this rank's sum per hot key (GroupSums' fixed order: the hottest keys over many warps), into [H, dim] with
    // zeros for the hot keys it did not look up
    float* dense = grow(hot_dense_, ex_, size_t(H) * dim_);
    fill(dev, dense, size_t(H) * dim_, 0.f, dev.stream);
    if (hot_ > 0) {
      hot_sums_.sum(offsets, in_.bags, ids, hot_, H, grads, Combiner::sum);
      const int64_t seen = ex_.download_count(hot_sums_.count());
      route_scatter_rows(dev, hot_sums_.sums(), hot_sums_.groups(), seen, dim_, dense, dev.stream);
    }
    // every rank's sums and counts
    ex_.post(hot_posted_, [&] {
      ex_.all_reduce(dense, dense, size_t(H) * dim_, DataType::f32);
      ex_.all_reduce(counts, counts, size_t(H), DataType::i64);
    });
  }

  // The touched hot keys (count > 0), the same on every rank, get one update each.
  void update_hot(int64_t step, float lr_scale) {
    const Device& dev = ex_.device();
    const int64_t H = int64_t(hot_keys_.size());
    ex_.join(hot_posted_);
    const int64_t* counts = hot_counts_.data();
    const float* dense = hot_dense_.data();
    int64_t* perm = hot_perm_.data();
    int32_t* part = grow(hot_part_, ex_, H);
    route_part_nonzero(dev, counts, H, part, dev.stream);
    int64_t* two = grow(counts_, ex_, 2);
    route_bucket(dev, part, H, 2, perm, two, scratch_, dev.stream);
    const int64_t touched = ex_.download(two, 1)[0];
    int64_t* keys = grow(hot_touched_keys_, ex_, touched);
    route_gather_keys(dev, hot_set_.data(), perm, touched, keys, dev.stream);
    float* grads = grow(hot_touched_grads_, ex_, size_t(touched) * dim_);
    route_gather_rows(dev, dense, perm, touched, dim_, grads, dev.stream);
    // rows in this copy (inserting keys only other ranks had looked up: values by key, the same everywhere)
    int64_t* rows = grow(hot_rows_, ex_, touched);
    float* unused = grow(hot_scratch_vecs_, ex_, size_t(touched) * dim_);
    table_lookup_keys(*hot_table_, keys, touched, LookupMode::train, unused, rows);
    int64_t* iota = grow(hot_iota_, ex_, touched + 1);
    route_iota(dev, touched + 1, iota, dev.stream);
    table_update(*hot_table_, iota, rows, touched, touched, grads, Combiner::sum, step, lr_scale);
  }

  // Every hot key into the hot copy (the absent ones with their initial values). Synchronizes.
  void insert_hot_keys() {
    if (hot_keys_.empty()) return;
    const Device& dev = ex_.device();
    Buffer<int64_t> rows(dev, hot_keys_.size());
    hot_table_->insert_rows(hot_set_.data(), int64_t(hot_keys_.size()), rows.data(), dev.stream);
    table_check(*hot_table_);  // synchronizes: `rows` may go
  }

  // The cold shard's rows; with a direct index, without its (unused) rows of the hot keys.
  TableRows cold_rows() {
    TableRows c = table_export(cold_.table());
    if (!direct_) return c;
    std::vector<bool> keep(c.rows());
    for (size_t i = 0; i < c.rows(); ++i) keep[i] = !std::binary_search(hot_keys_.begin(), hot_keys_.end(), c.keys[i]);
    return select_rows(c, keep);
  }

  static TableRows concat(TableRows a, const TableRows& b) {
    a.keys.insert(a.keys.end(), b.keys.begin(), b.keys.end());
    a.values.insert(a.values.end(), b.values.begin(), b.values.end());
    a.state.insert(a.state.end(), b.state.begin(), b.state.end());
    return a;
  }

  Exchange& ex_;
  int dim_;
  Combiner combiner_;
  bool direct_;                    // the table has a direct index (the cold shard's; the hot copy is hashed)
  std::vector<int64_t> hot_keys_;  // ascending
  Buffer<int64_t> hot_set_;        // the same on the device
  std::unique_ptr<EmbeddingTable> hot_table_;  // the copy of the hot rows, [H] rows
  DispatchShard cold_;
  RouteScratch scratch_;
  TableBatch in_;
  LookupMode mode_ = LookupMode::train;
  float* out_ = nullptr;
  StreamEvent hot_posted_;  // the end of the hot all-reduce
  int64_t hot_ = 0, cold_n_ = 0;
  Buffer<int32_t> part_, hot_idx_, hot_part_;
  Buffer<int64_t> perm_, counts_, split_keys_, iota_;
  Buffer<int64_t> split_of_key_;  // [nnz]: key i's place among the split keys
  Buffer<int64_t> bag_of_key_, bag_of_split_;  // [nnz]: each key's bag, in key order and in split order
  Buffer<int64_t> hot_bag_offsets_, cold_bag_offsets_;  // [bags + 1]: the hot keys' and the cold keys' bags
  Buffer<int64_t> hot_perm_, hot_counts_, hot_ids_, hot_touched_keys_, hot_rows_, hot_iota_;
  GroupSums hot_sums_;  // this rank's sum per hot key
  Buffer<float> split_vecs_;  // [nnz, dim] the vectors of the hot keys, then of the cold ones
  Buffer<float> scaled_;      // [bags, dim]: mean's gradient per key of each bag
  Buffer<float> hot_dense_, hot_touched_grads_, hot_scratch_vecs_;
};

}  // namespace

std::unique_ptr<PlacedTable> make_hybrid(const PlacedTableSetup& s, Exchange& ex) {
  return std::make_unique<HybridTable>(s, ex);
}

}  // namespace sparta
