// placement_hybrid.cpp: HugeCTR's HybridSparseEmbedding: the most frequent keys (the plan's hot set, from counts
// over a sample of the data) are replicated on every rank; the rest are placed by dispatch. A batch's keys are
// split stably into hot and cold; the hot ones are looked up in the local copy, the cold ones dispatched to
// their owners; the per-key vectors are put back in key order and pooled at the requester. Gradients split the
// same way: hot ones all-gathered (every copy applies the same update), cold ones back to their owners.
//
// Each row lives in exactly one of the two shards and is updated once per step it is touched, so every
// optimizer and any hotness work as in one table. The forward equals a single-rank pooled lookup bit for bit.
#include <algorithm>

#include "src/placement_common.h"

namespace sparta {

namespace {

class HybridTable : public PlacedTable {
 public:
  HybridTable(const PlacedTableSetup& s, Exchange& ex)
      : ex_(ex),
        dim_(s.table.dim),
        combiner_(s.table.combiner),
        hot_keys_(s.plan.hot_keys),
        replica_(ex, s, std::max<int64_t>(1, int64_t(s.plan.hot_keys.size())), "/hot"),
        cold_(ex, s, "") {
    for (size_t i = 1; i < hot_keys_.size(); ++i)
      SPARTA_REQUIRE(hot_keys_[i - 1] < hot_keys_[i], "table '%s': hybrid hot keys must be ascending and distinct",
                     s.table.name.c_str());
    SPARTA_REQUIRE(int64_t(hot_keys_.size()) <= s.table.rows, "table '%s': %zu hot keys for a table of %lld rows",
                   s.table.name.c_str(), hot_keys_.size(), (long long)s.table.rows);
    if (!hot_keys_.empty()) hot_set_ = Buffer<int64_t>(ex.device(), hot_keys_);
  }

  void forward(const TableBatch& in, LookupMode mode, float* out) override {
    const Device& dev = ex_.device();
    in_ = in;
    int32_t* part = grow(part_, dev, in.nnz);
    int64_t* perm = grow(perm_, dev, in.nnz);
    int64_t* counts = grow(counts_, dev, 2);
    route_part_by_membership(dev, in.keys, in.nnz, hot_set_.data(), int64_t(hot_keys_.size()), part, dev.stream);
    route_bucket(dev, part, in.nnz, 2, perm, counts, scratch_, dev.stream);
    std::vector<int64_t> c = download(dev, counts, 2);
    hot_ = c[0], cold_n_ = c[1];
    int64_t* keys = grow(split_keys_, dev, in.nnz);  // hot keys, then cold keys
    route_gather_keys(dev, in.keys, perm, in.nnz, keys, dev.stream);

    float* split = grow(split_vecs_, dev, size_t(in.nnz) * dim_);
    table_lookup_keys(replica_.table(), keys, hot_, mode, split, nullptr);
    cold_.forward(keys + hot_, cold_n_, mode, split + size_t(hot_) * dim_);
    float* vecs = grow(vecs_, dev, size_t(in.nnz) * dim_);
    route_scatter_rows(dev, split, perm, in.nnz, dim_, vecs, dev.stream);
    route_pool_bags(dev, in.offsets, vecs, in.bags, dim_, combiner_, out, dev.stream);
  }

  void backward(const float* grad, int64_t step) override {
    const Device& dev = ex_.device();
    float* key_grads = grow(vecs_, dev, size_t(in_.nnz) * dim_);
    route_spread_bag_grads(dev, in_.offsets, grad, in_.bags, dim_, combiner_, key_grads, dev.stream);
    float* split = grow(split_vecs_, dev, size_t(in_.nnz) * dim_);
    route_gather_rows(dev, key_grads, perm_.data(), in_.nnz, dim_, split, dev.stream);
    replica_.update_from_all(split_keys_.data(), split, hot_, step);
    cold_.backward(split + size_t(hot_) * dim_, step);
  }

  void check_lookups() override {
    table_check(replica_.table());
    table_check(cold_.table());
  }
  int owner_of(int64_t key) const override {
    return std::binary_search(hot_keys_.begin(), hot_keys_.end(), key) ? kAllRanks : owner_of_key(key, ex_.world());
  }
  TableRows rows_to_save() override {
    TableRows hot = table_export(replica_.table());
    if (ex_.rank() != 0) hot = select_rows(hot, std::vector<bool>(hot.rows(), false));  // one writer per row
    return concat(hot, table_export(cold_.table()));
  }
  TableRows held_rows() override { return concat(table_export(replica_.table()), table_export(cold_.table())); }
  void load_rows(const TableRows& rows) override {
    std::vector<bool> hot(rows.rows());
    for (size_t i = 0; i < rows.rows(); ++i)
      hot[i] = std::binary_search(hot_keys_.begin(), hot_keys_.end(), rows.keys[i]);
    std::vector<bool> cold(hot.size());
    for (size_t i = 0; i < hot.size(); ++i) cold[i] = !hot[i];
    table_load(replica_.table(), select_rows(rows, hot));
    table_load(cold_.table(), select_rows(rows, cold));
  }
  size_t memory_bytes() const override { return replica_.memory_bytes() + cold_.memory_bytes(); }

 private:
  static TableRows concat(TableRows a, const TableRows& b) {
    a.keys.insert(a.keys.end(), b.keys.begin(), b.keys.end());
    a.values.insert(a.values.end(), b.values.begin(), b.values.end());
    a.state.insert(a.state.end(), b.state.begin(), b.state.end());
    return a;
  }

  Exchange& ex_;
  int dim_;
  Combiner combiner_;
  std::vector<int64_t> hot_keys_;  // ascending
  Buffer<int64_t> hot_set_;        // the same on the device
  ReplicaShard replica_;
  DispatchShard cold_;
  RouteScratch scratch_;
  TableBatch in_;
  int64_t hot_ = 0, cold_n_ = 0;
  Buffer<int32_t> part_;
  Buffer<int64_t> perm_, counts_, split_keys_;
  Buffer<float> split_vecs_;  // [nnz, dim] hot then cold: vectors, then gradients
  Buffer<float> vecs_;        // [nnz, dim] in key order: vectors, then gradients
};

}  // namespace

std::unique_ptr<PlacedTable> make_hybrid(const PlacedTableSetup& s, Exchange& ex) {
  return std::make_unique<HybridTable>(s, ex);
}

}  // namespace sparta
