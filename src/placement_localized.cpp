// placement_localized.cpp: HugeCTR's LocalizedSlot: the whole table on one rank (the plan's owner). Every rank
// sends its bags (lengths and keys) to the owner, which pools them all with the fused lookup and returns each
// rank its pooled vectors by all-to-all; the bags arrive, and go back, in each rank's sample order. The backward
// sends the bag gradients to the owner, whose backward sums each row over the global batch in its order.
//
// Forward equals a single-rank pooled lookup bit for bit (the same fused lookup over the same bags). With one rank
// the bags are looked up where they are and the gradient is applied straight from the output's gradient.
#include "src/placement_common.h"

namespace sparta {

namespace {

class LocalizedTable : public PlacedTable {
 public:
  LocalizedTable(const PlacedTableSetup& s, Exchange& ex)
      : ex_(ex), dim_(s.table.dim), combiner_(s.table.combiner), owner_(s.plan.owner) {
    SPARTA_REQUIRE(owner_ >= 0 && owner_ < ex.world(), "table '%s': localized owner rank %d outside the %d ranks",
                   s.table.name.c_str(), owner_, ex.world());
    if (ex.rank() == owner_) table_ = make_whole_shard(ex.device(), s, "");
    posted_ = StreamEvent(ex.device());
  }

  void begin_forward(const TableBatch& in, LookupMode mode, float* out) override {
    const Device& dev = ex_.device();
    const size_t world = size_t(ex_.world());
    in_ = in;
    mode_ = mode;
    out_ = out;
    if (world == 1) return;  // the owner's own bags: looked up in place, nothing routed or copied
    int64_t* lengths = grow(lengths_, ex_, in.bags);
    route_lengths(dev, in.offsets, in.bags, lengths, dev.stream);
    std::vector<size_t> send_bags(world, 0), send_keys(world, 0);
    send_bags[owner_] = size_t(in.bags);
    send_keys[owner_] = size_t(in.nnz);
    recv_bags_ = ex_.counts(send_bags);
    std::vector<size_t> recv_keys = ex_.counts(send_keys);
    all_bags_ = 0, all_keys_ = 0;
    for (size_t p = 0; p < world; ++p) all_bags_ += int64_t(recv_bags_[p]), all_keys_ += int64_t(recv_keys[p]);
    int64_t* all_lengths = grow(all_lengths_, ex_, all_bags_);
    int64_t* keys = grow(keys_, ex_, all_keys_);
    send_bags_ = send_bags;
    ex_.post(posted_, [&] {
      ex_.all_to_all_v(lengths, send_bags, all_lengths, recv_bags_, DataType::i64);
      ex_.all_to_all_v(in.keys, send_keys, keys, recv_keys, DataType::i64);
    });
  }

  void lookup() override {
    const Device& dev = ex_.device();
    if (ex_.world() == 1) {
      table_lookup_pooled(*table_, in_.offsets, in_.keys, in_.bags, combiner_, mode_, out_, grow(rows_, ex_, in_.nnz));
      return;
    }
    ex_.join(posted_);
    float* pooled = grow(pooled_, ex_, size_t(all_bags_) * dim_);
    if (table_) {
      int64_t* offsets = grow(offsets_, ex_, all_bags_ + 1);
      route_offsets_from_lengths(dev, all_lengths_.data(), all_bags_, offsets, scratch_, dev.stream);
      table_lookup_pooled(*table_, offsets, keys_.data(), all_bags_, combiner_, mode_, pooled,
                          grow(rows_, ex_, all_keys_));
    }
    ex_.post(posted_, [&] { ex_.all_to_all_v_floats(pooled, times_dim(recv_bags_), out_, times_dim(send_bags_)); });
  }

  void finish_forward() override { ex_.join(posted_); }

  void begin_backward(const float* grad) override {
    grad_ = grad;
    if (ex_.world() == 1) return;
    float* all_grads = grow(pooled_, ex_, size_t(all_bags_) * dim_);
    ex_.post(posted_, [&] { ex_.all_to_all_v_floats(grad, times_dim(send_bags_), all_grads, times_dim(recv_bags_)); });
  }

  void update(int64_t step, float lr_scale) override {
    if (ex_.world() == 1) {
      table_update(*table_, in_.offsets, rows_.data(), in_.bags, in_.nnz, grad_, combiner_, step, lr_scale);
      return;
    }
    ex_.join(posted_);
    if (table_)
      table_update(*table_, offsets_.data(), rows_.data(), all_bags_, all_keys_, pooled_.data(), combiner_, step,
                   lr_scale);
  }

  void check_lookups() override {
    if (table_) table_check(*table_);
  }
  int owner_of(int64_t) const override { return owner_; }
  TableRows rows_to_save() override { return held_rows(); }
  TableRows held_rows() override {
    if (table_) return table_export(*table_);
    TableRows r;  // an empty share, described like the table
    r.dim = dim_;
    return r;
  }
  void load_rows(const TableRows& rows) override {
    if (table_) return table_load(*table_, rows);
    SPARTA_REQUIRE(rows.rows() == 0, "localized table: %zu rows given to rank %d, which does not hold the table",
                   rows.rows(), ex_.rank());
  }
  size_t memory_bytes() const override { return table_ ? table_memory_bytes(*table_) : 0; }
  int64_t rows_in_use() override { return table_ ? table_rows_in_use(*table_, ex_.device()) : 0; }

 private:
  std::vector<size_t> times_dim(const std::vector<size_t>& v) const {
    std::vector<size_t> r(v);
    for (size_t& x : r) x *= size_t(dim_);
    return r;
  }

  Exchange& ex_;
  int dim_;
  Combiner combiner_;
  int owner_;
  std::unique_ptr<EmbeddingTable> table_;  // on the owner only
  RouteScratch scratch_;
  TableBatch in_;
  LookupMode mode_ = LookupMode::train;
  float* out_ = nullptr;
  const float* grad_ = nullptr;  // one rank: the gradient begin_backward was given
  StreamEvent posted_;           // the end of the last posted exchange
  std::vector<size_t> send_bags_, recv_bags_;
  int64_t all_bags_ = 0, all_keys_ = 0;   // the owner's: bags and keys of the global batch
  Buffer<int64_t> lengths_, all_lengths_, keys_, offsets_, rows_;
  Buffer<float> pooled_;  // owner: [all_bags, dim] pooled vectors, then their gradients
};

}  // namespace

std::unique_ptr<PlacedTable> make_localized(const PlacedTableSetup& s, Exchange& ex) {
  return std::make_unique<LocalizedTable>(s, ex);
}

}  // namespace sparta
