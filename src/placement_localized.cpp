// placement_localized.cpp: HugeCTR's LocalizedSlot: each table whole on one rank (its plan's owner). A group of
// localized tables (src/embedding_collection.h) may hold tables of several owners, each owner holding its own
// tables' part; then one all-to-all reaches every owner at once, each way, so that the ranks send and receive
// side by side instead of one owner's exchange after another's.
//
// Forward: every rank cuts its bags (sample, slot) into one block per owner, the owner's slots in group order
// (kernels/route.h route_select_slot_*: lengths and keys), and sends each owner its block; an owner pools the
// bags of every rank's block with the fused lookup and returns each rank its pooled vectors by all-to-all, which
// the rank puts back into (sample, slot) order (route_put_slots), straight into the collection's columns when its
// output is float (PlacedTable::writes_output: no copy of the group's bags in between). An owner looks up its
// own block while the keys travel (from its own cut), then the other ranks' blocks, whose vectors' exchange then
// runs alone (with one owner: the other ranks' blocks first, the own one while their vectors travel; with the
// bf16 wire the own block is rounded as the vectors that travel are). The backward takes each owner's slots out
// of the gradient the same way (route_take_slots, from the collection's gradient when float) and sends them to
// the owner, whose backward sums each row over the global batch in its order (the sort of its rows queued in a
// train forward while its vectors travel, where the device would wait for them; prepare_backward with one rank).
// A group of one owner sends its bags as they are and receives straight into the output.
//
// Forward equals a single-rank pooled lookup bit for bit (the same fused lookup over the same bags). With one rank
// the bags are looked up where they are and the gradient is applied straight from the output's gradient.
#include <algorithm>

#include "kernels/key_init.h"
#include "src/placement_common.h"

namespace sparta {

namespace {

class LocalizedTable : public PlacedTable {
 public:
  LocalizedTable(const PlacedTableSetup& s, Exchange& ex) : ex_(ex), dim_(s.table.dim), combiner_(s.table.combiner) {
    const Device& dev = ex.device();
    const int W = ex.world();
    tagged_ = s.tagged_keys;
    members_ = s.members;
    if (members_.empty()) {
      PlacedTableSetup::Member m;
      m.table_id = s.table_id;
      m.rows = s.table.rows;
      m.key_bound = s.table.key_bound;
      m.slots = int(s.table.slots.size());
      m.owner = s.plan.owner;
      members_.push_back(m);
    }
    std::vector<int> slot_owner;
    for (const PlacedTableSetup::Member& m : members_) {
      SPARTA_REQUIRE(m.owner >= 0 && m.owner < W, "table '%s': localized owner rank %d outside the %d ranks",
                     s.table.name.c_str(), m.owner, W);
      slot_owner.insert(slot_owner.end(), size_t(m.slots), m.owner);
    }
    slots_ = int(slot_owner.size());
    SPARTA_ASSERT(slots_ == int(s.table.slots.size()), "table '%s': members of %d slots for %zu",
                  s.table.name.c_str(), slots_, s.table.slots.size());
    owner_slots_.assign(size_t(W), 0);
    for (int owner : slot_owner) ++owner_slots_[size_t(owner)];
    one_owner_ = std::count(owner_slots_.begin(), owner_slots_.end(), 0) == W - 1;
    // Blocks of several owners are put into place after the exchange anyway: straight into the collection's
    // output when it is float (no copy of the group's bags in between), else into the group's [bags, dim].
    writes_output_ = W > 1 && !one_owner_ && !s.output_cols.empty() && s.output_type == OutputType::f32 &&
                     s.grad_cols == s.output_cols && s.grad_row == s.output_row;
    row_floats_ = writes_output_ ? s.output_row : int64_t(slots_) * dim_;
    std::vector<std::vector<int32_t>> owned(static_cast<size_t>(W)), cols(static_cast<size_t>(W));
    for (int j = 0; j < slots_; ++j) {
      owned[size_t(slot_owner[size_t(j)])].push_back(j);
      cols[size_t(slot_owner[size_t(j)])].push_back(writes_output_ ? s.output_cols[size_t(j)] : j * dim_);
    }
    for (int p = 0; p < W; ++p) {
      if (owned[size_t(p)].empty()) continue;
      owner_ = p;
      slot_index_.emplace_back(dev, owned[size_t(p)]);
      slot_cols_.emplace_back(dev, cols[size_t(p)]);
    }
    // this rank's part: its own tables (one owner: the whole table)
    int64_t rows = 0, first = -1, end = 0;
    for (const PlacedTableSetup::Member& m : members_) {
      if (m.owner != ex.rank()) continue;
      rows += m.rows;
      SPARTA_ASSERT(first < 0 || m.key_begin == end, "table '%s': rank %d's tables are not one key range",
                    s.table.name.c_str(), ex.rank());
      if (first < 0) first = m.key_begin;
      end = m.key_begin + m.key_bound;
    }
    if (one_owner_ && owner_ == ex.rank()) {
      table_ = make_whole_shard(dev, s, "");
    } else if (rows > 0) {
      // a direct index holds the keys [first, end) of the group's (its tables end to end); hashed, tagged keys
      table_ = s.table.direct_index ? make_shard(dev, s, end - first, "", DirectIndex{1, first})
                                    : make_shard(dev, s, rows, "");
    }
    posted_ = StreamEvent(dev);
  }

  void begin_forward(const TableBatch& in, LookupMode mode, float* out) override {
    const Device& dev = ex_.device();
    const size_t W = size_t(ex_.world());
    in_ = in;
    mode_ = mode;
    out_ = out;
    prepared_ = false;
    if (W == 1) return;  // the owner's own bags: looked up in place, nothing routed or copied
    SPARTA_ASSERT(in.rank_batches.size() == W && in.bags == in.rank_batches[size_t(ex_.rank())] * slots_,
                  "localized table: %lld bags of %d slots, %zu rank batches", (long long)in.bags, slots_,
                  in.rank_batches.size());
    batch_ = in.rank_batches[size_t(ex_.rank())];
    const int64_t mine = owner_slots_[size_t(ex_.rank())];
    std::vector<size_t> send_keys(W, 0);
    send_bags_.assign(W, 0);
    recv_bags_.assign(W, 0);
    all_bags_ = 0;
    for (size_t p = 0; p < W; ++p) {
      send_bags_[p] = size_t(batch_ * owner_slots_[p]);
      recv_bags_[p] = size_t(in.rank_batches[p] * mine);
      all_bags_ += int64_t(recv_bags_[p]);
    }
    int64_t* lengths = grow(lengths_, ex_, in.bags);
    const int64_t* keys = in.keys;
    if (one_owner_) {
      route_lengths(dev, in.offsets, in.bags, lengths, dev.stream);
      send_keys[size_t(owner_)] = size_t(in.nnz);
    } else {
      // each owner's block of bags: its slots of every sample, their lengths and keys (the keys once their counts
      // are known on the host)
      int64_t* offsets = grow(block_offsets_, ex_, size_t(in.bags) + W);
      int64_t* counts = grow(block_counts_, ex_, W);
      for (size_t p = 0, i = 0, at = 0; p < W; ++p) {
        if (owner_slots_[p] == 0) continue;
        route_select_slot_offsets(dev, in.offsets, batch_, slots_, slot_index_[i].data(), owner_slots_[p],
                                  offsets + at, scratch_, dev.stream);
        copy_on_device(dev, counts + p, offsets + at + send_bags_[p], sizeof(int64_t), dev.stream);
        at += send_bags_[p] + 1, ++i;
      }
      ex_.mark("localized: blocks cut");
      std::vector<int64_t> n = ex_.download(counts, W);
      int64_t* block_keys = grow(block_keys_, ex_, size_t(in.nnz));
      for (size_t p = 0, i = 0, at = 0, bag = 0, key = 0; p < W; ++p) {
        if (owner_slots_[p] == 0) continue;
        send_keys[p] = size_t(n[p]);
        route_lengths(dev, offsets + at, int64_t(send_bags_[p]), lengths + bag, dev.stream);
        route_select_slot_keys(dev, in.offsets, in.keys, batch_, slots_, slot_index_[i].data(), owner_slots_[p],
                               offsets + at, block_keys + key, dev.stream);
        at += send_bags_[p] + 1, bag += send_bags_[p], key += send_keys[p], ++i;
      }
      keys = block_keys;
    }
    std::vector<size_t> recv_keys = ex_.counts(send_keys);
    all_keys_ = 0;
    for (size_t k : recv_keys) all_keys_ += int64_t(k);
    int64_t* all_lengths = grow(all_lengths_, ex_, all_bags_);
    int64_t* all_keys = grow(keys_, ex_, all_keys_);
    ex_.mark("localized: keys ready");
    ex_.post(posted_, [&] {
      ex_.all_to_all_v(lengths, send_bags_, all_lengths, recv_bags_, DataType::i64);
      ex_.all_to_all_v(keys, send_keys, all_keys, recv_keys, DataType::i64);
    });
    ex_.mark_side("localized: keys exchanged");
    own_done_ = false;
    if (!one_owner_ && table_) {
      // Several owners: every rank sends and receives vectors at once, and an owner's lookup beside the exchange
      // slows it (both read and write device memory at full speed). The own block is looked up now, from this
      // rank's cut (its lengths and keys), while the keys travel; the exchange of vectors then runs alone. Its
      // keys' rows go where the received keys' are (rank order), as the backward reads them.
      const size_t me = size_t(ex_.rank());
      size_t bag = 0, key = 0, base = 0;
      for (size_t p = 0; p < me; ++p) bag += send_bags_[p], key += send_keys[p], base += recv_keys[p];
      const int64_t own_bags = int64_t(send_bags_[me]);
      if (own_bags > 0) {
        int64_t* own_offsets = grow(own_offsets_, ex_, size_t(own_bags) + 1);
        route_offsets_from_lengths(dev, lengths + bag, own_bags, own_offsets, scratch_, dev.stream);
        float* mine = grow(blocks_, ex_, size_t(in.bags) * dim_) + (size_t(in.bags) - send_bags_[me]) * dim_;
        table_lookup_pooled(*table_, own_offsets, block_keys_.data() + key, own_bags, int64_t(send_keys[me]),
                            combiner_, mode_, mine, grow(rows_, ex_, all_keys_) + base);
        round_own(mine, own_bags);
      }
      own_done_ = true;
      ex_.mark("localized: own bags pooled");
    }
  }

  void lookup() override {
    const Device& dev = ex_.device();
    if (ex_.world() == 1) {
      table_lookup_pooled(*table_, in_.offsets, in_.keys, in_.bags, in_.nnz, combiner_, mode_, out_,
                          grow(rows_, ex_, in_.nnz));
      return;
    }
    ex_.join(posted_);
    // The other ranks' bags, their vectors packed in rank order and sent; then, with one owner, this rank's own
    // bags, looked up straight into place while the exchange moves the others' (it sends this rank nothing).
    const size_t me = size_t(ex_.rank());
    int64_t own = 0;  // this rank's own bags among the bags received, in rank order
    for (size_t p = 0; p < me; ++p) own += int64_t(recv_bags_[p]);
    const int64_t own_bags = int64_t(recv_bags_[me]);
    float* send = grow(pooled_, ex_, size_t(all_bags_) * dim_);
    float* dest = one_owner_ ? out_ : grow(blocks_, ex_, size_t(in_.bags) * dim_);
    if (table_) {
      route_offsets_from_lengths(dev, all_lengths_.data(), all_bags_, grow(offsets_, ex_, all_bags_ + 1), scratch_,
                                 dev.stream);
      grow(rows_, ex_, all_keys_);
      lookup_bags(0, own, send);
      lookup_bags(own + own_bags, all_bags_ - own - own_bags, send + size_t(own) * dim_);
    }
    ex_.mark("localized: other ranks' bags pooled");
    std::vector<size_t> to = times_dim(recv_bags_), from = times_dim(send_bags_);
    to[me] = from[me] = 0;
    ex_.post(posted_, [&] { ex_.all_to_all_v_floats(send, to, dest, from); });
    ex_.mark_side("localized: vectors exchanged");
    if (table_ && own_bags > 0 && !own_done_) {
      float* mine = dest + (size_t(in_.bags) - send_bags_[me]) * dim_;
      lookup_bags(own, own_bags, mine);
      round_own(mine, own_bags);
      ex_.mark("localized: own bags pooled");
    }
  }

  void finish_forward() override {
    if (ex_.world() == 1) return;
    // the update's sort (every lookup is queued) while the vectors travel, where the device would wait for them
    if (mode_ == LookupMode::train) {
      prepare_backward();
      ex_.mark("localized: update sorted");
    }
    ex_.join(posted_);
    if (one_owner_) return;
    const Device& dev = ex_.device();
    ex_.mark("localized: vectors joined");
    for_each_block(true, [&](size_t i, int owner_slots, size_t bag) {
      route_put_slots(dev, blocks_.data() + bag * dim_, batch_, owner_slots, dim_, slot_cols_[i].data(), row_floats_,
                      out_, dev.stream);
    });
    ex_.mark("localized: vectors put");
  }

  // The sort of the update's rows (EmbeddingTable::prepare_update) needs no gradient: right after the forward.
  void prepare_backward() override {
    if (!table_ || prepared_) return;
    if (ex_.world() == 1)
      table_prepare_update(*table_, in_.offsets, rows_.data(), in_.bags, in_.nnz, combiner_);
    else
      table_prepare_update(*table_, offsets_.data(), rows_.data(), all_bags_, all_keys_, combiner_);
    prepared_ = true;
  }

  void begin_backward(const float* grad) override {
    grad_ = grad;
    if (ex_.world() == 1) return;
    const Device& dev = ex_.device();
    const float* send = grad;
    if (!one_owner_) {  // each owner's slots of the gradient, block by block (the forward's blocks are read)
      for_each_block(false, [&](size_t i, int owner_slots, size_t bag) {
        route_take_slots(dev, grad, batch_, owner_slots, dim_, slot_cols_[i].data(), row_floats_,
                         blocks_.data() + bag * dim_, dev.stream);
      });
      send = blocks_.data();
    }
    float* all_grads = grow(pooled_, ex_, size_t(all_bags_) * dim_);
    ex_.mark("localized: gradients taken");
    ex_.post(posted_, [&] { ex_.all_to_all_v_floats(send, times_dim(send_bags_), all_grads, times_dim(recv_bags_)); });
    ex_.mark_side("localized: gradients exchanged");
  }

  void update(int64_t step, float lr_scale) override {
    if (!table_) return ex_.join(posted_);
    prepare_backward();
    prepared_ = false;
    if (ex_.world() == 1)
      return table_finish_update(*table_, in_.offsets, rows_.data(), in_.bags, in_.nnz, grad_, combiner_, step,
                                 lr_scale);
    ex_.join(posted_);
    ex_.mark("localized: gradients joined");
    table_finish_update(*table_, offsets_.data(), rows_.data(), all_bags_, all_keys_, pooled_.data(), combiner_, step,
                        lr_scale);
    ex_.mark("localized: rows updated");
  }

  bool writes_output() const override { return writes_output_; }
  void check_lookups() override {
    if (table_) table_check(*table_);
  }
  int owner_of(int64_t key) const override {
    if (one_owner_) return owner_;
    const PlacedTableSetup::Member* m = &members_[0];
    for (const PlacedTableSetup::Member& x : members_)
      if (tagged_ ? x.table_id == tag_of_key(key) : x.key_begin <= key) m = &x;
    return m->owner;
  }
  TableRows rows_to_save() override { return held_rows(); }
  TableRows held_rows() override {
    if (table_) return table_export(*table_);
    TableRows r;  // an empty share, described like the table
    r.dim = dim_;
    return r;
  }
  void load_rows(const TableRows& rows) override {
    if (table_) return table_load(*table_, rows);
    SPARTA_REQUIRE(rows.rows() == 0, "localized table: %zu rows given to rank %d, which holds none of its tables",
                   rows.rows(), ex_.rank());
  }
  size_t memory_bytes() const override { return table_ ? table_memory_bytes(*table_) : 0; }
  int64_t rows_in_use() override { return table_ ? table_rows_in_use(*table_, ex_.device()) : 0; }
  void trace(StreamClock* clock) override {
    if (table_) table_trace(*table_, clock);
  }

 private:
  static int tag_of_key(int64_t key) { return static_cast<int>(uint64_t(key) >> kKeyTagShift); }
  std::vector<size_t> times_dim(const std::vector<size_t>& v) const {
    std::vector<size_t> r(v);
    for (size_t& x : r) x *= size_t(dim_);
    return r;
  }
  // f(i, owner's slots, first bag of its block in blocks_) for every owner with slots, in rank order (i counts
  // them). The blocks lie in rank order; own_last: this rank's own block after the others' (the forward's layout).
  template <class F>
  void for_each_block(bool own_last, F&& f) {
    const size_t me = size_t(ex_.rank());
    for (size_t p = 0, i = 0, bag = 0; p < owner_slots_.size(); ++p) {
      if (owner_slots_[p] == 0) continue;
      if (own_last && p == me) {
        f(i++, owner_slots_[p], size_t(in_.bags) - send_bags_[p]);
        continue;
      }
      f(i, owner_slots_[p], bag);
      bag += send_bags_[p], ++i;
    }
  }
  // With the bf16 wire, this rank's own bags rounded once, as the vectors that travel are (Exchange).
  void round_own(float* mine, int64_t bags) {
    if (ex_.wire() != DataType::bf16 || bags == 0) return;
    const Device& dev = ex_.device();
    const int64_t n = bags * dim_;
    uint16_t* half = grow(own16_, ex_, size_t(n));
    route_to_bf16(dev, mine, n, half, dev.stream);
    route_from_bf16(dev, half, n, mine, dev.stream);
  }
  // The pooled lookup of n of the bags received from bag `first` on into out (train: their keys' rows kept).
  void lookup_bags(int64_t first, int64_t n, float* out) {
    if (n > 0)
      table_lookup_pooled(*table_, offsets_.data() + first, keys_.data(), n, -1, combiner_, mode_, out, rows_.data());
  }

  Exchange& ex_;
  int dim_;
  Combiner combiner_;
  bool tagged_ = false;
  std::vector<PlacedTableSetup::Member> members_;
  int slots_ = 0;                 // the group's slots
  std::vector<int> owner_slots_;  // [world]: how many of them each rank owns
  // per owner with slots, in rank order: its slots' indices in the group, and their first float in a row of out_
  std::vector<Buffer<int32_t>> slot_index_, slot_cols_;
  bool one_owner_ = true;
  bool writes_output_ = false;             // out_ and grad_ are the collection's output and gradient
  int64_t row_floats_ = 0;                 // floats in a row of out_ (and of the gradient)
  int owner_ = 0;                          // the owner when there is one (else the last)
  std::unique_ptr<EmbeddingTable> table_;  // this rank's tables, where it owns any
  RouteScratch scratch_;
  TableBatch in_;
  LookupMode mode_ = LookupMode::train;
  float* out_ = nullptr;
  const float* grad_ = nullptr;  // one rank: the gradient begin_backward was given
  StreamEvent posted_;           // the end of the last posted exchange
  bool prepared_ = false;        // the update's sort is queued for the last train forward
  bool own_done_ = false;        // several owners: this rank's own block was looked up in begin_forward
  int64_t batch_ = 0;            // this rank's samples
  std::vector<size_t> send_bags_, recv_bags_;
  int64_t all_bags_ = 0, all_keys_ = 0;   // the bags and keys this rank pools for every rank
  Buffer<int64_t> lengths_, all_lengths_, keys_, offsets_, rows_;
  Buffer<int64_t> block_offsets_, block_counts_, block_keys_;  // several owners: the blocks' offsets, key counts, keys
  Buffer<int64_t> own_offsets_;  // several owners: the own block's offsets (from its lengths)
  Buffer<float> pooled_;  // [all_bags, dim] pooled vectors, then their gradients
  Buffer<float> blocks_;  // several owners: [bags, dim] this rank's vectors, then gradients, owner by owner
  Buffer<uint16_t> own16_;  // bf16 wire: the own bags' vectors rounded
};

}  // namespace

std::unique_ptr<PlacedTable> make_localized(const PlacedTableSetup& s, Exchange& ex) {
  return std::make_unique<LocalizedTable>(s, ex);
}

}  // namespace sparta
