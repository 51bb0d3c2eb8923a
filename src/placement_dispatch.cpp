// placement_dispatch.cpp: the dispatch placement (SOK's data-parallel → model-parallel → data-parallel): rows
// owned by key % world; each rank sends its distinct keys to their owners, gets one vector per distinct key back
// and pools its own bags; the gradients, summed per distinct key, travel the same route back and are summed per
// row at the owner (DispatchShard in placement_common.h).
//
// Forward equals a single-rank pooled lookup bit for bit: the vectors are copies of the owner's rows and a bag
// is summed in key order (kernels/route.h). Neither direction copies a vector per key: the bags are pooled
// straight from the distinct keys' vectors as they arrived, and each distinct key's gradient is summed straight
// from its bags' gradients (in kernels/embedding_backward.h's fixed order, a hot key over many warps). With a float
// output of the collection, a group of some of its slots pools into its columns of it and reads its gradient
// from there (PlacedTable::writes_output, OutputLayout). A batch may be routed ahead (PlacedTable::route_ahead)
// into the shard's second route, which its forward then takes.
#include "src/placement_common.h"

namespace sparta {

namespace {

class DispatchTable : public PlacedTable {
 public:
  DispatchTable(const PlacedTableSetup& s, Exchange& ex)
      : ex_(ex), dim_(s.table.dim), combiner_(s.table.combiner), shard_(ex, s, ""), output_(ex.device(), s, false) {}

  void begin_forward(const TableBatch& in, LookupMode mode, float* out) override {
    in_ = in;
    mode_ = mode;
    out_ = out;
    shard_.route(in.keys, in.nnz);
  }

  bool route_ahead(const TableBatch& in) override {
    shard_.route_ahead(in.keys, in.nnz);
    return true;
  }

  void begin_forward_routed(const TableBatch& in, LookupMode mode, float* out) override {
    in_ = in;
    mode_ = mode;
    out_ = out;
    shard_.take_ahead();
  }

  void lookup() override {
    shard_.lookup(mode_);
    // the sort of the backward's sums while the vectors travel (the device would wait for them in finish)
    if (mode_ == LookupMode::train) shard_.prepare_sums(in_.offsets, in_.bags, combiner_);
  }

  void finish_forward() override {
    const Device& dev = ex_.device();
    shard_.finish();
    route_pool_bags(dev, in_.offsets, shard_.vectors(), shard_.vector_of_key(), in_.bags, dim_, combiner_, out_,
                    dev.stream, output_.layout());
    ex_.mark("dispatch: bags pooled");
  }

  void begin_backward(const float* grad) override {
    shard_.send(in_.offsets, in_.bags, grad, combiner_, output_.grad_layout());
  }

  void update(int64_t step, float lr_scale) override { shard_.update(step, lr_scale); }

  bool writes_output() const override { return output_.in_place(); }
  void check_lookups() override { table_check(shard_.table()); }
  int owner_of(int64_t key) const override { return owner_of_key(key, ex_.world()); }
  TableRows rows_to_save() override { return table_export(shard_.table()); }
  TableRows held_rows() override { return table_export(shard_.table()); }
  void load_rows(const TableRows& rows) override { table_load(shard_.table(), rows); }
  size_t memory_bytes() const override { return shard_.memory_bytes(); }
  int64_t rows_in_use() override { return table_rows_in_use(shard_.table(), ex_.device()); }
  void trace(StreamClock* clock) override { table_trace(shard_.table(), clock); }

 private:
  Exchange& ex_;
  int dim_;
  Combiner combiner_;
  DispatchShard shard_;
  OutputLayout output_;  // where the bags go in the output and their gradients lie (writes_output)
  TableBatch in_;
  LookupMode mode_ = LookupMode::train;
  float* out_ = nullptr;
};

}  // namespace

std::unique_ptr<PlacedTable> make_dispatch(const PlacedTableSetup& s, Exchange& ex) {
  return std::make_unique<DispatchTable>(s, ex);
}

}  // namespace sparta
