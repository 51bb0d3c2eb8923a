// placement_distributed.cpp: HugeCTR's DistributedSlot: rows owned by key % world. Each rank sends its keys to
// their owners with the id of the bag each belongs to (in a global numbering padded to the largest local batch:
// rank r's bag b is r * max_bags + b); every owner pools its partial sums for all bags of the global batch, and
// a reduce-scatter leaves each rank the full sums of its own bags. Mean divides by the bag's whole key count
// (the sum of the owners' counts), which the requester has. The backward all-gathers the bag gradients (scaled
// by 1/n for mean) so that each owner can update its rows.
//
// The forward adds a bag's keys in another order than a single-rank lookup (per owner, then over ranks in the
// reduce-scatter's order): equal within float rounding, not bit for bit. The backward sums each row in the order
// of the global batch, as a single rank does.
//
// With equal local batches (every rank's bags = the largest) the reduce-scatter writes straight into the output,
// and sum tables all-gather the output's gradient as it is: no copy of a rank's bags on either side.
#include <algorithm>

#include "src/placement_common.h"

namespace sparta {

namespace {

class DistributedTable : public PlacedTable {
 public:
  DistributedTable(const PlacedTableSetup& s, Exchange& ex)
      : ex_(ex),
        dim_(s.table.dim),
        combiner_(s.table.combiner),
        table_(make_modulo_shard(ex.device(), s, ex.world(), ex.rank(), "")),
        posted_(ex.device()) {}

  void begin_forward(const TableBatch& in, LookupMode mode, float* out) override {
    const Device& dev = ex_.device();
    const int world = ex_.world();
    in_ = in;
    mode_ = mode;
    out_ = out;
    max_bags_ = 0;
    for (int64_t b : in.rank_batches) max_bags_ = std::max(max_bags_, b * in.table_slots);
    global_bags_ = max_bags_ * world;

    int64_t* bag_of_key = grow(bag_of_key_, ex_, in.nnz);
    route_key_bags(dev, in.offsets, in.bags, int64_t(ex_.rank()) * max_bags_, bag_of_key, dev.stream);
    int32_t* part = grow(part_, ex_, in.nnz);
    int64_t* perm = grow(perm_, ex_, in.nnz);
    int64_t* counts = grow(counts_, ex_, world);
    route_owner_by_key(dev, in.keys, in.nnz, world, part, dev.stream);
    route_bucket(dev, part, in.nnz, world, perm, counts, scratch_, dev.stream);
    std::vector<int64_t> c = ex_.download(counts, world);
    std::vector<size_t> send_counts(c.begin(), c.end());
    int64_t* send_keys = grow(send_keys_, ex_, in.nnz);
    int64_t* send_bags = grow(send_bags_, ex_, in.nnz);
    route_gather_keys(dev, in.keys, perm, in.nnz, send_keys, dev.stream);
    route_gather_keys(dev, bag_of_key, perm, in.nnz, send_bags, dev.stream);
    std::vector<size_t> recv_counts = ex_.counts(send_counts);
    n_recv_ = 0;
    for (size_t x : recv_counts) n_recv_ += int64_t(x);
    int64_t* keys = grow(recv_keys_, ex_, n_recv_);
    int64_t* bags = grow(recv_bags_, ex_, n_recv_);
    ex_.mark("distributed: keys bucketed");
    ex_.post(posted_, [&] {
      ex_.all_to_all_v(send_keys, send_counts, keys, recv_counts, DataType::i64);
      ex_.all_to_all_v(send_bags, send_counts, bags, recv_counts, DataType::i64);
    });
    ex_.mark_side("distributed: keys exchanged");
  }

  void lookup() override {
    const Device& dev = ex_.device();
    ex_.join(posted_);
    // Sources arrive in rank order and each keeps its bag order, so the bag ids are ascending: a CSR.
    int64_t* offsets = grow(owner_offsets_, ex_, global_bags_ + 1);
    route_offsets_from_sorted_bags(dev, recv_bags_.data(), n_recv_, global_bags_, offsets, dev.stream);
    float* partial = grow(partial_, ex_, size_t(global_bags_) * dim_);
    table_lookup_pooled(*table_, offsets, recv_keys_.data(), global_bags_, n_recv_, Combiner::sum, mode_, partial,
                        grow(rows_, ex_, n_recv_));
    direct_out_ = in_.bags == max_bags_;
    float* mine = direct_out_ ? out_ : grow(mine_, ex_, size_t(max_bags_) * dim_);
    ex_.mark("distributed: partial sums pooled");
    ex_.post(posted_, [&] { ex_.reduce_scatter(partial, mine, size_t(max_bags_) * dim_, DataType::f32); });
    ex_.mark_side("distributed: partial sums reduced");
  }

  void finish_forward() override {
    const Device& dev = ex_.device();
    ex_.join(posted_);
    if (!direct_out_ && in_.bags > 0) copy_on_device(dev, out_, mine_.data(), sizeof(float) * size_t(in_.bags) * dim_);
    if (combiner_ == Combiner::mean) route_divide_by_lengths(dev, in_.offsets, in_.bags, dim_, out_, dev.stream);
  }

  void begin_backward(const float* grad) override {
    const Device& dev = ex_.device();
    const int world = ex_.world();
    const float* send = grad;  // a sum table's gradient of equal local batches goes as it is
    if (combiner_ == Combiner::mean || in_.bags != max_bags_) {
      float* mine = grow(mine_, ex_, size_t(max_bags_) * dim_);
      // the padding bags hold no keys: their gradient rows are never read
      route_scale_bag_grads(dev, in_.offsets, grad, in_.bags, dim_, combiner_, mine, dev.stream);
      send = mine;
    }
    float* all = grow(partial_, ex_, size_t(global_bags_) * dim_);
    ex_.post(posted_, [&] {
      ex_.all_gather_v(send, all, std::vector<size_t>(size_t(world), size_t(max_bags_) * dim_), DataType::f32);
    });
    ex_.mark_side("distributed: gradients gathered");
    // the sort of the update's rows while the gradients travel
    table_prepare_update(*table_, owner_offsets_.data(), rows_.data(), global_bags_, n_recv_, Combiner::sum);
    ex_.mark("distributed: update sorted");
  }

  void update(int64_t step, float lr_scale) override {
    ex_.join(posted_);
    table_finish_update(*table_, owner_offsets_.data(), rows_.data(), global_bags_, n_recv_, partial_.data(),
                        Combiner::sum, step, lr_scale);
    ex_.mark("distributed: rows updated");
  }

  void check_lookups() override { table_check(*table_); }
  int owner_of(int64_t key) const override { return owner_of_key(key, ex_.world()); }
  TableRows rows_to_save() override { return table_export(*table_); }
  TableRows held_rows() override { return table_export(*table_); }
  void load_rows(const TableRows& rows) override { table_load(*table_, rows); }
  size_t memory_bytes() const override { return table_memory_bytes(*table_); }
  int64_t rows_in_use() override { return table_rows_in_use(*table_, ex_.device()); }
  void trace(StreamClock* clock) override { table_trace(*table_, clock); }

 private:
  Exchange& ex_;
  int dim_;
  Combiner combiner_;
  std::unique_ptr<EmbeddingTable> table_;
  RouteScratch scratch_;
  TableBatch in_;
  LookupMode mode_ = LookupMode::train;
  float* out_ = nullptr;
  StreamEvent posted_;  // the end of the last posted exchange
  int64_t max_bags_ = 0, global_bags_ = 0, n_recv_ = 0;
  bool direct_out_ = false;  // the reduce-scatter wrote into out_ (equal local batches)
  Buffer<int32_t> part_;
  Buffer<int64_t> bag_of_key_, perm_, counts_, send_keys_, send_bags_, recv_keys_, recv_bags_, owner_offsets_, rows_;
  Buffer<float> partial_;  // [world * max_bags, dim]: partial sums, then the gathered gradients
  Buffer<float> mine_;     // [max_bags, dim]: this rank's sums, then its scaled gradients (unequal batches, mean)
};

}  // namespace

std::unique_ptr<PlacedTable> make_distributed(const PlacedTableSetup& s, Exchange& ex) {
  return std::make_unique<DistributedTable>(s, ex);
}

}  // namespace sparta
