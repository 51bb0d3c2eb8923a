// placement_dispatch.cpp: the dispatch placement (SOK's data-parallel → model-parallel → data-parallel): rows
// owned by key % world; each rank sends its distinct keys to their owners, gets one vector per distinct key back
// and pools its own bags; the gradients, summed per distinct key, travel the same route back and are summed per
// row at the owner (DispatchShard in placement_common.h).
//
// Forward equals a single-rank pooled lookup bit for bit: the vectors are copies of the owner's rows and a bag
// is summed in key order (kernels/route.h).
#include "src/placement_common.h"

namespace sparta {

namespace {

class DispatchTable : public PlacedTable {
 public:
  DispatchTable(const PlacedTableSetup& s, Exchange& ex)
      : ex_(ex), dim_(s.table.dim), combiner_(s.table.combiner), shard_(ex, s, "") {}

  void forward(const TableBatch& in, LookupMode mode, float* out) override {
    const Device& dev = ex_.device();
    in_ = in;
    float* vecs = grow(vecs_, dev, size_t(in.nnz) * dim_);
    shard_.forward(in.keys, in.nnz, mode, vecs);
    route_pool_bags(dev, in.offsets, vecs, in.bags, dim_, combiner_, out, dev.stream);
  }

  void backward(const float* grad, int64_t step, float lr_scale) override {
    float* key_grads = grow(vecs_, ex_.device(), size_t(in_.nnz) * dim_);
    route_spread_bag_grads(ex_.device(), in_.offsets, grad, in_.bags, dim_, combiner_, key_grads, ex_.device().stream);
    shard_.backward(key_grads, step, lr_scale);
  }

  void check_lookups() override { table_check(shard_.table()); }
  int owner_of(int64_t key) const override { return owner_of_key(key, ex_.world()); }
  TableRows rows_to_save() override { return table_export(shard_.table()); }
  TableRows held_rows() override { return table_export(shard_.table()); }
  void load_rows(const TableRows& rows) override { table_load(shard_.table(), rows); }
  size_t memory_bytes() const override { return shard_.memory_bytes(); }

 private:
  Exchange& ex_;
  int dim_;
  Combiner combiner_;
  DispatchShard shard_;
  TableBatch in_;
  Buffer<float> vecs_;  // [nnz, dim]: per-key vectors in the forward, per-key gradients in the backward
};

}  // namespace

std::unique_ptr<PlacedTable> make_dispatch(const PlacedTableSetup& s, Exchange& ex) {
  return std::make_unique<DispatchTable>(s, ex);
}

}  // namespace sparta
