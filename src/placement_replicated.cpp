// placement_replicated.cpp: a copy of the whole table on every rank. The forward is a local pooled lookup (no
// communication); the backward sums this rank's gradient per touched row and all-gathers those sums with their
// keys (ReplicaShard), so that every copy applies the same update and the copies stay identical. (A sparse
// all-reduce: the rows a batch touches are few, and their ids differ between copies, so the keys travel with the
// gradients rather than a dense [rows, dim] all-reduce.) With a float gradient of the collection, a group of some
// of its slots pools straight into its output (of any type: a 16-bit one rounded there) and reads its gradient
// from it (PlacedTable::writes_output: the lookup and the backward take the output's layout,
// kernels/embedding_types.h BagLayout), no copy of its bags in between.
#include "src/placement_common.h"

namespace sparta {

namespace {

class ReplicatedTable : public PlacedTable {
 public:
  ReplicatedTable(const PlacedTableSetup& s, Exchange& ex)
      : ex_(ex), dim_(s.table.dim), combiner_(s.table.combiner), replica_(ex, s, ""), output_(ex.device(), s, true) {}

  void begin_forward(const TableBatch& in, LookupMode mode, float* out) override {
    in_ = in;
    mode_ = mode;
    out_ = out;
    replica_.forget_prepare();
  }

  // Nothing to route: the forward is a local lookup.
  bool route_ahead(const TableBatch&) override { return true; }

  void lookup() override {
    // The rows of the keys are kept for a backward straight from the bags' gradients.
    int64_t* rows = grow(rows_, ex_, size_t(in_.nnz));
    table_lookup_pooled(replica_.table(), in_.offsets, in_.keys, in_.bags, in_.nnz, combiner_, mode_, out_, rows,
                        output_.layout(), output_.type());
    ex_.mark("replicated: bags pooled");
  }

  void finish_forward() override {}

  void begin_backward(const float* grad) override {
    grad_ = grad;
    if (ex_.world() > 1)
      replica_.send(in_.offsets, in_.keys, rows_.data(), in_.bags, in_.nnz, grad, combiner_,
                    output_.grad_layout());
  }

  void update(int64_t step, float lr_scale) override {
    if (ex_.world() == 1) {
      // The only copy: its update is the batch's own (the same row sums the gathered path would apply with one
      // rank), fused with the optimizer, without downloading a count or looking the keys up again.
      table_update(replica_.table(), in_.offsets, rows_.data(), in_.bags, in_.nnz, grad_, combiner_, step, lr_scale,
                   output_.grad_layout());
      return;
    }
    replica_.update(step, lr_scale);
    ex_.mark("replicated: rows updated");
  }

  void prepare_backward() override {
    if (ex_.world() > 1) replica_.prepare(in_.offsets, in_.keys, rows_.data(), in_.bags, in_.nnz, combiner_);
  }

  bool writes_output() const override { return output_.in_place(); }
  void check_lookups() override { table_check(replica_.table()); }
  int owner_of(int64_t) const override { return kAllRanks; }
  TableRows rows_to_save() override {
    table_check(replica_.table());  // the last update's refused keys (ReplicaShard), on every rank alike
    TableRows r = table_export(replica_.table());
    if (ex_.rank() != 0) r = select_rows(r, std::vector<bool>(r.rows(), false));  // one writer per row
    return r;
  }
  TableRows held_rows() override { return table_export(replica_.table()); }
  void load_rows(const TableRows& rows) override { table_load(replica_.table(), rows); }
  size_t memory_bytes() const override { return replica_.memory_bytes(); }
  int64_t rows_in_use() override { return table_rows_in_use(replica_.table(), ex_.device()); }
  void trace(StreamClock* clock) override { table_trace(replica_.table(), clock); }

 private:
  Exchange& ex_;
  int dim_;
  Combiner combiner_;
  ReplicaShard replica_;
  TableBatch in_;
  LookupMode mode_ = LookupMode::train;
  float* out_ = nullptr;
  const float* grad_ = nullptr;  // one rank: the gradient begin_backward was given
  Buffer<int64_t> rows_;  // [nnz] rows of the last forward's keys
  OutputLayout output_;   // where the bags go in the output and their gradients lie (writes_output)
};

}  // namespace

std::unique_ptr<PlacedTable> make_replicated(const PlacedTableSetup& s, Exchange& ex) {
  return std::make_unique<ReplicatedTable>(s, ex);
}

}  // namespace sparta
